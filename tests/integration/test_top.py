"""``hopbus top --once`` against real runs: every row agrees with the progress stream read
around it, finished runs show the final iteration, bad input is one line."""

from __future__ import annotations

import subprocess
import sys
import time

import redis
from cluster import clean_env, hopbus, train_args

from hopbus.coord.keys import RunKeys
from hopbus.coord.top import TopReader


def _top(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hopbus", "top", *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )


def _stream_iters(client: redis.Redis, run: str) -> dict[int, int]:
    """Every worker's latest iteration in the progress stream."""
    latest: dict[int, int] = {}
    for _, fields in client.xrange(RunKeys(run).progress):
        w, it = int(fields[b"worker"]), int(fields[b"iter"])
        latest[w] = max(latest.get(w, 0), it)
    return latest


def _rows(text: str) -> dict[int, list[str]]:
    """Worker rows of a frame: lines whose first two cells are numbers."""
    rows = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) >= 10 and cells[0].isdigit() and cells[1].isdigit():
            rows[int(cells[0])] = cells
    return rows


def _one_line_error(p: subprocess.CompletedProcess, code: int) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hopbus: error: "), p.stderr
    return lines[0]


def test_top_of_a_live_run_matches_the_stream_around_it(redis_url, tmp_path):
    client = redis.Redis.from_url(redis_url)
    args, run = train_args(
        redis_url, tmp_path / "out", "-n", "4", "-k", "400", "--iter-time", "0.02"
    )
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env()
    )
    try:
        deadline = time.monotonic() + 60
        while len(_stream_iters(client, run)) < 4:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "workers never made progress"
            time.sleep(0.05)  # polling for a condition, with a deadline
        before = _stream_iters(client, run)
        p = _top("--run", run, "--redis", redis_url, "--once")
        after = _stream_iters(client, run)
        assert p.returncode == 0, p.stderr
        assert "Traceback" not in p.stderr
        head = p.stdout.splitlines()[0]
        assert f"run {run}" in head and "4 workers" in head and "400 iterations" in head
        assert "Table 1 bound" in p.stdout
        rows = _rows(p.stdout)
        assert sorted(rows) == [0, 1, 2, 3], p.stdout
        for w, cells in rows.items():
            assert before[w] <= int(cells[1]) <= after[w], (w, before, cells, after)
            assert cells[-1] in ("alive", "finished"), cells
        assert proc.poll() is None, "the run should still be going (raise -k)"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    client.close()


def test_top_of_a_finished_run_shows_the_final_iteration(redis_url, tmp_path):
    args, run = train_args(redis_url, tmp_path / "out", "-n", "4", "-k", "30")
    p = subprocess.run(
        args, capture_output=True, text=True, env=clean_env(), timeout=120, check=False
    )
    assert p.returncode == 0, p.stderr
    top = _top("--run", run, "--redis", redis_url, "--once")
    assert top.returncode == 0, top.stderr
    assert "(finished)" in top.stdout.splitlines()[0]
    rows = _rows(top.stdout)
    assert sorted(rows) == [0, 1, 2, 3], top.stdout
    for cells in rows.values():
        assert cells[1] == "30" and cells[-1] == "finished", cells
    # its speed over its own span, under the 5 s window (a fifth of it was shown)
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(run)
    ids = [e[0] for e in client.xrange(keys.progress)]
    span_s = (int(ids[-1].split(b"-")[0]) - int(ids[0].split(b"-")[0])) / 1000
    frame = TopReader(client, keys).frame()
    for row in frame.rows:
        assert row.rate is not None and row.rate >= 29 / max(span_s, 1e-3), (row, span_s)


def test_top_of_an_unknown_run_is_one_line(redis_url):
    p = _top("--run", "no-such-run", "--redis", redis_url, "--once")
    assert "no-such-run" in _one_line_error(p, 2)
    assert "Traceback" not in p.stderr and not p.stdout


def test_top_without_run_lists_the_runs_when_there_are_several(redis_url):
    client = redis.Redis.from_url(redis_url)
    for run in ("top-list-a", "top-list-b"):
        client.hset(RunKeys(run).meta, mapping={"config": "{}", "status": "finished"})
    try:
        p = _top("--redis", redis_url, "--once")
    finally:
        client.delete(RunKeys("top-list-a").meta, RunKeys("top-list-b").meta)
        client.close()
    line = _one_line_error(p, 2)
    assert "top-list-a" in line and "top-list-b" in line and "--run" in line


def test_top_refuses_a_run_as_inspect_does(redis_url):
    """A run one of whose keys holds another type than hopbus keeps there: top said it with
    exit status 1 and inspect with 2; both now say 2, naming the key. An unknown run's line
    names the Redis to list runs in, as inspect's does."""
    client = redis.Redis.from_url(redis_url)
    run = "top-wrongtype"
    assert hopbus("create", "--run", run, "-n", "2", "--redis", redis_url).returncode == 0
    client.delete(f"hop:{{{run}}}:launcher")
    client.hset(f"hop:{{{run}}}:launcher", "x", "1")  # a hash where a string beats
    lines = []
    for command in ("top", "inspect"):
        p = hopbus(command, "--run", run, "--redis", redis_url, *(["--once"] * (command == "top")))
        lines.append(_one_line_error(p, 2))
    assert lines[0] == lines[1] and f"hop:{{{run}}}:launcher (a hash" in lines[0], lines
    p = _top("--run", "no-such-run", "--redis", redis_url, "--once")
    assert f"hopbus inspect --list --redis {redis_url}" in _one_line_error(p, 2)
    assert hopbus("clean", "--run", run, "--redis", redis_url, "--force").returncode == 0
