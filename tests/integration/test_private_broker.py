"""The private broker's temporary folder after its launcher is killed with SIGKILL (no time to
clean up): the next private broker of the same user removes it, and leaves alone the folders
of launchers still alive and anything that is not such a folder. Real processes, a real
redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from cluster import wait_for

from hopbus.coord.broker import EmbeddedRedis, sweep_stale

HOLDER = (
    "import sys\n"
    "from hopbus.coord.broker import EmbeddedRedis\n"
    "with EmbeddedRedis() as r:\n"
    "    print(r.dir, r.proc.pid, flush=True)\n"
    "    sys.stdin.read()\n"
)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie awaiting its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _holder(tmp: Path) -> tuple[subprocess.Popen, Path, int]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    folder, server = proc.stdout.readline().split()
    return proc, Path(folder), int(server)


def test_a_killed_launchers_folder_is_swept_by_the_next(tmp_path):
    dead, dead_dir, dead_server = _holder(tmp_path)
    live, live_dir, _ = _holder(tmp_path)
    stray = tmp_path / "hopbus-redis-not-a-broker"  # no lock file: left alone
    stray.mkdir()
    other = tmp_path / "elsewhere"
    other.mkdir()
    (tmp_path / "hopbus-redis-link").symlink_to(other)  # a link: never followed
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait(30)
        assert dead_dir.is_dir() and (dead_dir / "redis.log").exists()
        # its redis-server heard its parent die (PR_SET_PDEATHSIG) and went too
        wait_for(lambda: not _running(dead_server), 30, "the orphaned redis-server to exit")
        assert sweep_stale(tmp_path) == 1
        assert not dead_dir.exists()
        assert live_dir.is_dir() and (live_dir / "redis.sock").exists()
        assert stray.is_dir() and other.is_dir() and (tmp_path / "hopbus-redis-link").is_symlink()
    finally:
        live.communicate("", timeout=30)  # stdin closed: it stops its broker and returns
    assert live.returncode == 0
    assert not live_dir.exists()


def test_a_new_private_broker_sweeps_on_start(tmp_path, monkeypatch):
    dead, dead_dir, _ = _holder(tmp_path)
    dead.kill()
    dead.wait(30)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with EmbeddedRedis() as server:
        assert server.dir.parent == tmp_path
        assert not dead_dir.exists()
    assert not server.dir.exists()
