"""``hopbus train``, ``worker``, ``inspect`` and ``clean`` as a user types them: bad input and
unreachable services end in one line and a non-zero status, within the timeout."""

from __future__ import annotations

import json
import time

import pytest
from test_cli import hopbus

from hopbus.coord.broker import free_port


def _one_line_error(p, code: int) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = [x for x in p.stderr.strip().splitlines() if not x.startswith("hopbus: warning")]
    assert len(lines) == 1 and lines[0].startswith("hopbus: error: "), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "resnet"], "unknown model"),
        (["--data", "svmlight:/no/such/file"], "/no/such/file"),
        (["--data", "mnist"], "digits"),
        (["--run", "bad id!"], "run id"),
        (["--lr", "-1"], "--lr"),
        (["--redis", "ftp://example"], "redis://"),
        (["-n", "1"], "at least 2"),
        (["--mode", "backup", "--max-ig", "0"], "token queues"),
        (["--mode", "fast"], "(env var: 'HOPBUS_MODE'): 'fast' is not one of 'standard'"),
    ],
)
def test_train_refuses_bad_input_before_starting_anything(tmp_path, args, needle):
    p = hopbus("train", *args, cwd=tmp_path)
    assert needle in _one_line_error(p, 2)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("command", "last"),
    [
        (["launch", "--", "python", "x.py"], "'hybrid'."),
        (["sim"], "'ps-elastic'."),
        (["train"], "'allreduce'."),
    ],
)
def test_a_mistyped_mode_lists_the_modes_of_the_command(tmp_path, command, last):
    """launch runs the Hop modes only, sim no wagma or allreduce: a typo lists what it runs."""
    p = hopbus(command[0], "--mode", "bakup", *command[1:], cwd=tmp_path)
    line = _one_line_error(p, 2)
    assert "'bakup' is not one of 'standard', 'notify-ack', 'backup', " in line
    assert line.endswith(last), line


def test_train_refuses_a_mistyped_fault(tmp_path):
    p = hopbus("train", cwd=tmp_path, env={"HOPBUS_FAULTS": "1:explode"})
    assert "HOPBUS_FAULTS" in _one_line_error(p, 2)


def test_unreachable_redis_is_one_line_within_the_timeout(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    t0 = time.monotonic()
    p = hopbus("worker", "--run", "r1", "--id", "0", "--redis", url, "--timeout", "1")
    assert "cannot reach Redis at redis://127.0.0.1:" in _one_line_error(p, 1)
    p = hopbus("train", "--redis", url, "--timeout", "1", cwd=tmp_path)
    assert "cannot reach Redis" in _one_line_error(p, 1)
    assert time.monotonic() - t0 < 30


def test_a_server_that_is_not_redis_is_one_line():
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def answer_html():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.sendall(b"<html>not redis</html>\r\n")
            conn.close()

    threading.Thread(target=answer_html, daemon=True).start()
    url = f"redis://127.0.0.1:{srv.getsockname()[1]}/0"
    p = hopbus("inspect", "--list", "--redis", url)
    srv.close()
    assert "does not answer as Redis" in _one_line_error(p, 1)


def test_password_never_shown(tmp_path):
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}/0"
    p = hopbus("worker", "--run", "r1", "--id", "0", "--redis", url, "--timeout", "1")
    line = _one_line_error(p, 1)
    assert "s3cret" not in p.stderr + p.stdout and "user:***@" in line


def test_worker_of_a_run_that_does_not_exist(redis_url):
    p = hopbus("worker", "--run", "nobody", "--id", "0", "--redis", redis_url, "--timeout", "1")
    where = redis_url.removeprefix("redis://").split("/")[0]
    line = _one_line_error(p, 2)
    assert f"run 'nobody' has no configuration in the Redis at {where} " in line, line


def test_inspect_then_clean_a_finished_run(redis_url, tmp_path):
    run = f"inspect-{time.time_ns()}"
    p = hopbus(
        "train", "--redis", redis_url, "--run", run, "-n", "4", "--iterations", "30",
        "--out", str(tmp_path / "r"), "--json",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "r" / ".hopbus.lock").exists()  # the folder's lock went with it
    # fault ``run_id_taken``: refused before any file is written, with the command that
    # frees the id on this Redis, not the default one; no empty folder is left behind, and
    # one that was there before stays, empty and usable
    again = ["train", "--redis", redis_url, "-n", "4", "--iterations", "30", "--json"]
    p = hopbus(*again, "--run", run, "--out", str(tmp_path / "r2"))
    line = _one_line_error(p, 2)
    assert f"remove it with: hopbus clean --run {run} --redis {redis_url}" in line
    assert not (tmp_path / "r2").exists()
    (tmp_path / "r2").mkdir()
    p = hopbus(*again, "--run", run, "--out", str(tmp_path / "r2"))
    assert f"hopbus clean --run {run}" in _one_line_error(p, 2)
    assert not [f.name for f in (tmp_path / "r2").iterdir()]
    p = hopbus(*again, "--run", f"{run}-2", "--out", str(tmp_path / "r2"))
    assert p.returncode == 0, p.stderr
    p = hopbus("inspect", "--run", run, "--redis", redis_url, "--json")
    assert p.returncode == 0, p.stderr
    snap = json.loads(p.stdout)
    assert snap["status"] == "finished"
    assert [w["iteration"] for w in snap["workers"]] == [30] * 4
    assert all(w["state"] == "finished" for w in snap["workers"])
    assert {q["size"] for q in snap["token_queues"]} == {5}  # Iter(j) - Iter(i) + max_ig
    assert snap["progress_entries"] == 4 * 30 and snap["gaps"]["max_any_pair"] == 0
    assert len(snap["results"]) == 4
    p = hopbus("inspect", "--run", run, "--redis", redis_url)
    assert p.returncode == 0 and f"run {run} (finished)" in p.stdout
    p = hopbus("inspect", "--run", run, "--redis", redis_url, "--last", "0", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["progress"] == []
    p = hopbus("inspect", "--list", "--redis", redis_url)
    assert run in p.stdout.split()
    p = hopbus("clean", "--run", run, "--redis", redis_url)
    assert p.returncode == 0 and "removed" in p.stdout
    p = hopbus("inspect", "--run", run, "--redis", redis_url)
    assert f"hopbus inspect --list --redis {redis_url} shows the runs" in _one_line_error(p, 2)
    p = hopbus("clean", "--run", run, "--redis", redis_url)  # already gone, or mistyped
    assert f"run {run} has no keys" in _one_line_error(p, 2)
