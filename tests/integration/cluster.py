"""Running the real cluster from tests: ``hopbus train`` as a subprocess against the tests'
redis-server, each run under its own id and folder."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

_ids = itertools.count()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOPBUS_")}
    env.update(extra)
    return env


def train_args(redis_url: str, out: Path, *flags: str) -> tuple[list[str], str]:
    run = f"t{os.getpid()}-{next(_ids)}"
    args = [sys.executable, "-m", "hopbus", "train", "--redis", redis_url, "--run", run]
    return [*args, "--out", str(out), "--json", *flags], run


def train(
    redis_url: str, out: Path, *flags: str, env: dict[str, str] | None = None, timeout: float = 240
) -> tuple[subprocess.CompletedProcess, dict | None]:
    args, _ = train_args(redis_url, out, *flags)
    p = subprocess.run(
        args, capture_output=True, text=True, env=env or clean_env(), timeout=timeout, check=False
    )
    summary = json.loads(p.stdout) if p.stdout.strip() else None
    return p, summary


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (to prove nothing was left running)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def env_without(package: str, folder: Path) -> dict[str, str]:
    """An environment in which ``import PACKAGE`` fails, installed or not: a sitecustomize in
    ``folder`` (put on PYTHONPATH) inserts a finder first on sys.meta_path that refuses it. For
    the tests of what a user without an optional extra sees."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import sys\n\n\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {package!r} or name.startswith({package + '.'!r}):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r} (hidden)', name=name)\n"
        "        return None\n\n\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    return clean_env(PYTHONPATH=str(folder))
