"""Errors a user can cause, kept apart from bugs.

Anything raised as :class:`UserError` is the user's input being wrong (a flag, a config file, a
topology file, a slowdown string). The CLI prints its message as one line and exits with
``exit_code``; it never shows a traceback for these. Everything else is a bug and is allowed to
surface as one.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input. ``str(error)`` is the one line the user sees; ``said``: it was printed
    already (by a script hopbus ran, on the stderr it shares), so the CLI only exits."""

    exit_code = 2
    said = False


class ConfigError(UserError):
    """A run configuration that cannot work (bad value, or a value that contradicts the paper)."""


class TopologyError(UserError):
    """A communication graph that cannot be built or cannot be trained on."""


class SlowdownSpecError(UserError):
    """A heterogeneity string that does not parse."""


class RunFailure(UserError):  # noqa: N818 (a failure the user is told about, not a bug)
    """A run could not go on: a neighbour died, never appeared, or Redis went away. The message
    names what was waited for; the exit status is 1 (the input was fine, the run was not)."""

    exit_code = 1


class RunStopped(RunFailure):
    """Another node stopped the run (e.g. a neighbour died and the mode cannot do without it):
    this node had nothing wrong with it and exits with status 1 after saying why."""


class Diverged(RunFailure):
    """This worker's loss or parameters stopped being finite (a learning rate too high, bad
    data): it stops the whole run, since every neighbour would average the NaNs in."""


class RejoinFailed(RunFailure):
    """A replacement (``hopbus worker --rejoin``) could not come into the run. The run goes on
    without it, so its failure is not reported to the run; the exit status is 1."""


class DeclaredDead(RunFailure):
    """This worker was declared dead (its heartbeat lapsed: the process was stopped, starved of
    CPU or cut off from Redis for longer than --heartbeat) and the run went on without it. It
    leaves rather than come back as a stranger to token queues that no longer count it; a
    replacement (``hopbus worker --rejoin``) brings it back. Not reported to the run."""
