"""The Redis key schema of a run, in one place.

Every key of run R starts with ``hop:{R}:``; the braces are a Redis Cluster hash tag, so all of a
run's keys live in one slot and one Lua script may touch several of them.

| key | type | meaning |
| --- | --- | --- |
| hop:{R}:meta | hash | ``config`` (JSON RunConfig), ``status``, ``created``, ``version`` |
| hop:{R}:addr | hash | worker id -> ZeroMQ endpoint of its inbox |
| hop:{R}:iter:I | string | worker I's iteration |
| hop:{R}:floor:I | string | oldest update iteration worker I still accepts (Sec. 6.2) |
| hop:{R}:tok:I:J | list | TokenQ(I->J): tokens worker J takes from I (values: iterations) |
| hop:{R}:progress | stream | one entry per iteration change (worker, iter, jump, loss, ...) |
| hop:{R}:events | stream | start, finish, error, crash, stop, restore, rejoining, rejoin |
| hop:{R}:hb:I | string + TTL | worker I's heartbeat; ``finished`` (no TTL) once it reported |
| hop:{R}:launcher | string + TTL | the heartbeat of the hopbus train or launch that runs it |
| hop:{R}:stats:I | hash | worker I's counters: dropped frames by reason, stale updates, ... |
| hop:{R}:result | hash | worker id -> JSON of its final evaluation (the parameter server: id N) |
| hop:{R}:group:T:G | string + TTL | wagma: the activator of iteration T's group G (SET NX) |
| hop:{R}:joined | string counter | workers that joined without ``--id``: INCR - 1 is the new id |
| hop:{R}:dead | set | workers declared dead (heartbeat gone without a result) |
| hop:{R}:joining | set | dead workers whose replacement is coming in (``hopbus worker --rejoin``) |
| hop:{R}:stop | string | why the run was stopped (a dead worker it cannot do without, ...) |
| hop:{R}:incarnation | hash | worker id -> how many replacements took its place (``--rejoin``) |
| hop:{R}:marks | hash | worker id -> the Redis run id its state was put in (start, restore) |
| hop:{R}:initial | hash | worker 0's initial parameters as an update's frames: every worker's x_0 |
| hop:{R}:sketch | hash | worker id -> sketch of its final parameters (consensus distance) |

A parameter server (``--mode ps-*``) is node N of a run of N workers: its endpoint, heartbeat
and result use id N.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hopbus.errors import ConfigError

INTERRUPTED = "interrupted"
"""The kind of event a worker posts that was stopped by Ctrl-C or SIGTERM before its end: why
it is gone, for hopbus watch and its peers, like an ``error``, but no failure of the run's own
making (a launcher killed with the laptop lid takes its workers with it: abandoned)."""

INTERRUPTED_LINE = "interrupted (Ctrl-C or SIGTERM) before its end"
"""What an ``INTERRUPTED`` event says, a built-in worker's and a script's alike."""

SAYS_WHY_GONE = ("error", INTERRUPTED)
"""The kinds of event that say why a node is gone, once its heartbeat is: hopbus watch's
failure line, the stop reason a peer writes, inspect's worker rows and the run's status all
read them by this one list."""

JOIN_FAILED = "join_failed"
"""The kind of event a worker posts that failed before taking the place the join counter gave
it (its model did not load there): unlike an ``error``, not a failure of the run by itself, as
a process started for that place with --id may still be loading (hopbus watch waits
--timeout for one to take it)."""
FINISHED = "finished"
"""A node's heartbeat key once it is done: written with its final report in one step (and
kept without a TTL), so a report counts only beside it (coord/read.result): a report written
by anything else, even while the worker's counter stands at the last iteration, does not."""

RESUMED_FROM = "resumed_from"
"""The field of a run's meta hash that says the iteration its workers resumed from (their
checkpoints'): hopbus train --resume writes it, and so does each worker started with
--resume-from, before its start event, so that a hopbus watch places them there."""

KEPT_TYPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"meta|addr|result|incarnation|marks|initial|sketch|stats:[0-9]+"), "hash"),
    (re.compile(r"(iter|floor|hb):[0-9]+|joined|stop|launcher|group:[0-9]+:[0-9]+"), "string"),
    (re.compile(r"tok:[0-9]+:[0-9]+"), "list"),
    (re.compile(r"progress|events"), "stream"),
    (re.compile(r"dead|joining"), "set"),
)
"""The table above as data: the Redis type hopbus keeps under each of a run's key names (after
``hop:{R}:``; ids in ASCII digits, as hopbus writes them). A refusal such as WRONGTYPE names no
key; this names the one to look at."""

ANOTHER_TYPE = "hold another type than hopbus keeps there"
"""How a line says that keys of a run were written by something else (coord/runs.py's
``misplaced`` finds them)."""


def named_keys(found: list[str]) -> str:
    """``keys that hold another type than hopbus keeps there: KEY (a hash; ...), ...``: the
    one wording of every line that names them (``of_another_type``'s list)."""
    return f"keys that {ANOTHER_TYPE}: {', '.join(found)}"


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_run_id(run: str) -> str:
    """A run id is a name a shell, a folder and a Redis key can all carry unquoted."""
    if not RUN_ID.fullmatch(run):
        raise ConfigError(
            f"--run {run!r:.80}: a run id is 1 to 64 letters, digits, '_', '.' or '-', starting "
            "with a letter or digit"
        )
    return run


@dataclass(frozen=True)
class RunKeys:
    run: str

    def __post_init__(self) -> None:
        check_run_id(self.run)

    @property
    def prefix(self) -> str:
        return f"hop:{{{self.run}}}:"

    @property
    def pattern(self) -> str:
        """SCAN pattern of every key of the run (braces escaped for glob matching)."""
        return f"hop:\\{{{self.run}\\}}:*"

    @property
    def meta(self) -> str:
        return self.prefix + "meta"

    @property
    def addr(self) -> str:
        return self.prefix + "addr"

    @property
    def progress(self) -> str:
        return self.prefix + "progress"

    @property
    def events(self) -> str:
        return self.prefix + "events"

    @property
    def result(self) -> str:
        return self.prefix + "result"

    @property
    def joined(self) -> str:
        return self.prefix + "joined"

    @property
    def dead(self) -> str:
        return self.prefix + "dead"

    @property
    def joining(self) -> str:
        return self.prefix + "joining"

    @property
    def incarnation(self) -> str:
        """Hash: worker id -> how many replacements took it (absent: the original process)."""
        return self.prefix + "incarnation"

    @property
    def hb_prefix(self) -> str:
        """``hb(I)`` without the id: for a Lua script that checks the heartbeats of a set."""
        return self.prefix + "hb:"

    @property
    def stop(self) -> str:
        return self.prefix + "stop"

    @property
    def launcher(self) -> str:
        """The heartbeat of the process that started the run's workers (``hopbus train`` or
        ``launch``): while its workers load their models, none of them beats yet, and the run
        is running all the same (inspect, clean). None for workers started by hand."""
        return self.prefix + "launcher"

    @property
    def marks(self) -> str:
        """worker id -> the broker instance (Redis's run id) its state was put in last."""
        return self.prefix + "marks"

    @property
    def initial(self) -> str:
        return self.prefix + "initial"

    @property
    def sketch(self) -> str:
        return self.prefix + "sketch"

    def iter(self, worker: int) -> str:
        return f"{self.prefix}iter:{worker}"

    def floor(self, worker: int) -> str:
        return f"{self.prefix}floor:{worker}"

    def tok(self, owner: int, taker: int) -> str:
        return f"{self.prefix}tok:{owner}:{taker}"

    def hb(self, worker: int) -> str:
        return f"{self.hb_prefix}{worker}"

    def stats(self, worker: int) -> str:
        return f"{self.prefix}stats:{worker}"

    def group(self, iteration: int, first: int) -> str:
        return f"{self.prefix}group:{iteration}:{first}"

    def kept_type(self, key: str) -> str | None:
        """The Redis type hopbus keeps at ``key`` (``KEPT_TYPES``); None for a key that is
        not one of this run's."""
        if not key.startswith(self.prefix):
            return None
        name = key[len(self.prefix) :]
        return next((t for pattern, t in KEPT_TYPES if pattern.fullmatch(name)), None)


def run_of_key(key: str) -> str | None:
    """The run id inside a hopbus key, or None for other keys."""
    m = re.match(r"hop:\{([^}]*)\}:", key)
    return m.group(1) if m else None
