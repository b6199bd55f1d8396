"""Which of a user's code a node may run: only what its own command line names.

A run's ``--model`` and ``--data`` may name a user's function (``MODULE:FUNCTION`` or
``FILE.py:FUNCTION``), which every worker imports and calls. The run's config is read from
Redis, and whoever holds the broker's password could rewrite it to name any module or file on
the worker's host (``os:abort``, a ``.py`` another user left in /tmp), to run as the worker's
user. So a node imports a user's function only when it was given the same spec itself:
``hopbus worker --model SPEC --data SPEC`` (``HOPBUS_MODEL``, ``HOPBUS_DATA``), which
``hopbus train`` sets for the processes it starts and the compose files set from ``.env``.
Built-in models and data sets are no code, and need nothing; nor does a script's worker,
whose script builds its own model.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from hopbus.config import TrainConfig
from hopbus.data.spec import is_user_data
from hopbus.errors import ConfigError
from hopbus.models.custom import is_callable_spec
from hopbus.runtime import env

GIVEN: dict[str, tuple[str, Callable[[str], bool]]] = {
    "model": (env.MODEL, is_callable_spec),
    "data": (env.DATA, is_user_data),
}
"""Each setting that may name code: the variable a node is given it in, and which of its
values are code (what the model and data loaders import)."""


def give(model: str | None, data: str | None) -> None:
    """What this process's command line named (``--model``, ``--data``), for
    ``require_given`` and for any process it starts."""
    for var, spec in ((env.MODEL, model), (env.DATA, data)):
        if spec is not None:
            os.environ[var] = spec


def given_env(cfg: TrainConfig) -> dict[str, str]:
    """The variables for the processes a launcher starts for ``cfg``, which the user named on
    the launcher's own command line (or config file)."""
    out = {}
    for field, (var, is_code) in GIVEN.items():
        spec = str(getattr(cfg, field))
        if is_code(spec):
            out[var] = spec
    return out


def require_given(cfg: TrainConfig, who: str, run: str) -> None:
    """Refuse a run whose config names code this process was not given (ConfigError, before
    it joins, so that it writes nothing into the run): one line for all of it, --model and
    --data alike, so that the fix is one command."""
    wrong = []
    for field, (var, is_code) in GIVEN.items():
        spec = str(getattr(cfg, field)).strip()
        if not is_code(spec):
            continue
        mine = (os.environ.get(var) or "").strip()
        if mine != spec:
            # the spec is quoted, never offered as a command: it may be what someone else wrote
            got = f"not the {mine!r} this process was given" if mine else "not given to it"
            wrong.append((f"--{field}", var, spec, got))
    if not wrong:
        return
    has = " and ".join(f"{flag} {spec!r}, code {got}" for flag, _, spec, got in wrong)
    flags = " and ".join(flag for flag, *_ in wrong)
    names = " and ".join(f"{flag} (or {var})" for flag, var, *_ in wrong)
    raise ConfigError(
        f"{who}: run {run} has {has}. A worker runs only the code its own {names} names, never "
        f"code named by the run's config in Redis alone: if that is what you recorded, give "
        f"the worker {flags} with it; if not, someone changed the run's config "
        "(docs/security.md)"
    )
