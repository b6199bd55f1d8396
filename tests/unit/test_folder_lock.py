"""The results folder's lock (``launcher._holding``): one writer per folder, refused in one
line naming the holder's pid, and never a write through a link or into a special file."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hopbus.errors import ConfigError
from hopbus.runtime.launcher import LOCK, _holding


def test_a_folder_held_by_another_process_is_refused_naming_it(tmp_path):
    with _holding(tmp_path / "run"):
        assert (tmp_path / "run" / LOCK).read_text() == f"{os.getpid()}\n"
        # another process (a second launcher) aimed at the same folder, while this one holds it
        code = (
            "import sys; from pathlib import Path; from hopbus.runtime.launcher import _holding\n"
            "try:\n    with _holding(Path(sys.argv[1])): print('held')\n"
            "except Exception as exc: print(exc)"
        )
        p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")],
                           capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        assert p.stdout.strip() == (
            f"{tmp_path / 'run'} is being written by another hopbus process (pid {os.getpid()}), "
            "whose run is still going: wait for it to end, or stop it first"
        )
    assert not (tmp_path / "run" / LOCK).exists()  # it goes with its holder
    with _holding(tmp_path / "run"):  # and the folder is free again
        pass


@pytest.mark.parametrize("kind", ["fifo", "hard_link", "symlink"])
def test_a_lock_that_is_not_a_file_of_its_own_is_refused_untouched(tmp_path, kind):
    """Faults ``lock_fifo``, ``lock_hard_link``, ``lock_symlink``: nothing is written into
    what the lock's name points at, and the refusal is one line."""
    out = tmp_path / "run"
    out.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("not hopbus's\n")
    if kind == "fifo":
        os.mkfifo(out / LOCK)
    elif kind == "hard_link":
        os.link(precious, out / LOCK)
    else:
        (out / LOCK).symlink_to(precious)
    with pytest.raises(ConfigError) as info, _holding(out):
        pass
    assert LOCK in str(info.value) and "move it away" in str(info.value)
    assert precious.read_text() == "not hopbus's\n"
    assert os.path.lexists(out / LOCK)  # left where it was
