"""The ring all-reduce baseline (``--mode allreduce``) on the real cluster: a real redis-server,
real worker processes, a real gloo process group.

The runs need PyTorch (the ``bench`` extra) and skip, with the reason, where it is missing (CI
installs only ``dev``). The refusals at the end need no torch: they make it unimportable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import (
    clean_env,
    env_without,
    processes_mentioning,
    train,
    train_args,
    wait_iteration,
)

from hopbus.coord.keys import RunKeys
from hopbus.data import load_dataset
from hopbus.models import build_model

N, K = 4, 300
NO_TORCH = "--mode allreduce needs PyTorch (pip install -e '.[bench]'); this venv has no torch"


@pytest.fixture
def torch_installed():
    """Skip runs without PyTorch (not the module: the refusal tests run anyway)."""
    return pytest.importorskip("torch", reason=NO_TORCH)


def _gradient_bytes(cfg: dict) -> int:
    data = load_dataset(cfg["data"], cfg["seed"])
    model = build_model(cfg["model"], data.n_features, data.n_classes, hidden=cfg["hidden"])
    return sum(a.nbytes for a in model.init_params(cfg["seed"]).values())


def test_allreduce_trains_digits_in_lock_step(redis_url, tmp_path, torch_installed):
    args, run = train_args(redis_url, tmp_path / "run", "-n", str(N), "-k", str(K))
    p = subprocess.run(
        [*args, "--mode", "allreduce"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=240,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["finished"] and not s["virtual"], s["failure"]
    assert s["final_accuracy"] >= 0.90, [w["final_accuracy"] for w in s["per_worker"]]
    # the same mean gradient and step everywhere: every worker ends with the same model
    assert len({(w["final_loss"], w["final_accuracy"]) for w in s["per_worker"]}) == 1
    assert s["violations"] == 0, s["first_violation"]
    assert s["gap_bound"]["any_pair"] == 1 and s["max_gap"]["any_pair"] == 1
    assert s["iterations"]["min"] == s["iterations"]["max"] == K
    assert s["jumps"] == 0 and all(v == 0 for v in s["checks"].values()), s["checks"]
    nbytes = _gradient_bytes(s["config"])
    for w in s["per_worker"]:
        assert w["allreduces"] == K and w["allreduce_bytes"] == nbytes, w
    c = s["scheme"]
    assert c["mode"] == "allreduce" and c["family"] == "allreduce"
    assert c["counters"]["allreduces"] == N * K
    assert c["counters"]["bytes_per_allreduce"] == nbytes
    assert c["counters"]["mean_allreduce_s"] > 0
    assert s["topology"]["name"] == "complete"
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == N * K
    assert all("wait_s" in json.loads(line) for line in metrics)
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == s
    assert not processes_mentioning(run)


def test_a_straggler_sets_everyones_pace(redis_url, tmp_path, torch_installed):
    """Worker 0 computes 4x longer every iteration; lock-step means nobody's iteration can be
    shorter than its compute (a lower bound: sleeps never end early, so this cannot flake)."""
    iter_time, k = 0.02, 30
    flags = ["-n", str(N), "-k", str(k), "--mode", "allreduce", "--slowdown", "fixed:4@0"]
    p, s = train(redis_url, tmp_path / "run", *flags, "--iter-time", str(iter_time))
    assert p.returncode == 0, p.stderr
    assert s["violations"] == 0 and s["iterations"]["min"] == k
    straggler = s["per_worker"][0]
    assert straggler["compute_s"] >= k * 4 * iter_time  # the slowdown was applied
    for i, t in enumerate(s["iter_time_s"]["per_worker"]):
        assert t >= 0.95 * 4 * iter_time, (i, t)  # fast workers too: they wait for worker 0


def test_emulated_links_are_charged_after_the_real_all_reduce(redis_url, tmp_path, torch_installed):
    """Workers 0-1 and 2-3 on two machines whose uplinks carry 1 Mbit/s, every all-reduce
    charged as 100 kB: each of the 6 ring steps moves 25 kB across each machine boundary,
    0.2 s, so every iteration waits at least 1.2 s (sleeps never end early: cannot flake)."""
    k = 3
    flags = ["-n", str(N), "-k", str(k), "--mode", "allreduce", "--message-bytes", "100kB"]
    flags += ["--slowdown", "machines:2,2@0/1Mbit", "--iter-time", "0.01"]
    p, s = train(redis_url, tmp_path / "run", *flags)
    assert p.returncode == 0, p.stderr
    assert s["finished"] and s["violations"] == 0
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        assert json.loads(line)["wait_s"] >= 1.2, line


def test_a_link_between_workers_the_ring_never_joins_is_refused_up_front(tmp_path):
    out = tmp_path / "out"
    flags = ["train", "--mode", "allreduce", "-n", "4", "--slowdown", "link:50@0-2"]
    p = _hopbus(clean_env(), *flags, "--out", str(out))
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "not neighbours in 'the all-reduce ring'" in lines[0], p.stderr
    assert not out.exists()


def test_a_hung_worker_ends_the_run_within_the_timeout(redis_url, tmp_path, torch_installed):
    env = clean_env(HOPBUS_FAULTS="2:hang_at=5")
    args, run = train_args(redis_url, tmp_path / "run", "-n", str(N), "--mode", "allreduce")
    p = subprocess.run(
        [*args, "--timeout", "3"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hopbus: error: run {run} failed: worker "), last
    assert "the all-reduce of iteration 5" in last
    assert "worker 2" in last.split("all-reduce", 1)[1]  # the one still before iteration 5
    assert not processes_mentioning(run)


def test_a_garbled_counter_of_a_late_worker_is_read_as_not_there(
    redis_url, redis_client, tmp_path, torch_installed
):
    """Fault ``garbled_counter``: the hung worker's counter overwritten with text while the
    others wait for it. They read it as not entered (a ValueError of int() was their
    traceback) and name it when the timeout ends."""
    env = clean_env(HOPBUS_FAULTS="2:hang_at=5")
    args, run = train_args(redis_url, tmp_path / "run", "-n", str(N), "--mode", "allreduce")
    p = subprocess.Popen(
        [*args, "--timeout", "3"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        text=True, env=env,
    )  # fmt: skip
    keys = RunKeys(run)
    wait_iteration(redis_client, keys, 2, 4)  # it stops short of 5: its counter stays
    redis_client.set(keys.iter(2), "x")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert "the all-reduce of iteration 5" in last and "worker 2" in last, last
    logs = "".join(f.read_text() for f in (tmp_path / "run" / "logs").glob("*.log"))
    assert "Traceback" not in err + logs
    assert not processes_mentioning(run)


def test_a_crashed_worker_is_named(redis_url, tmp_path, torch_installed):
    env = clean_env(HOPBUS_FAULTS="1:crash_at=20")
    args, run = train_args(redis_url, tmp_path / "run", "-n", str(N), "--mode", "allreduce")
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert p.returncode == 1
    assert "worker 1 exited with status 70" in p.stderr.strip().splitlines()[-1]
    assert not processes_mentioning(run)


def test_a_worker_that_never_appears_is_named(redis_url, tmp_path, torch_installed):
    env = clean_env(HOPBUS_FAULTS="2:never_register")
    args, run = train_args(redis_url, tmp_path / "run", "-n", str(N), "--mode", "allreduce")
    p = subprocess.run(
        [*args, "--timeout", "3"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert p.returncode == 1
    assert "waited 3 s for worker 2 to register an endpoint" in p.stderr.strip().splitlines()[-1]
    assert not processes_mentioning(run)


# -- without torch -------------------------------------------------------------------------------
def _without_torch(tmp_path: Path) -> dict[str, str]:
    return env_without("torch", tmp_path / "no_torch")


def _hopbus(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hopbus", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_without_torch_train_refuses_in_one_line(tmp_path):
    out = tmp_path / "out"
    p = _hopbus(_without_torch(tmp_path), "train", "--mode", "allreduce", "--out", str(out))
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "--mode allreduce needs PyTorch" in lines[0] and ".[bench]" in lines[0]
    assert "download.pytorch.org/whl/cpu" in lines[0]  # not GBs of CUDA from PyPI
    assert "Traceback" not in p.stderr
    assert not out.exists()


def test_hop_flags_are_warned_about_with_allreduce(tmp_path):
    args = ["train", "--mode", "allreduce", "--topology", "ring", "--staleness", "2"]
    p = _hopbus(_without_torch(tmp_path), *args, "--out", str(tmp_path / "out"))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert "hopbus: warning: --topology has no effect with --mode allreduce" in lines
    assert "hopbus: warning: --staleness has no effect with --mode allreduce" in lines
    assert "needs PyTorch" in lines[-1]


def test_sim_refuses_allreduce(tmp_path):
    p = _hopbus(clean_env(), "sim", "--mode", "allreduce")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "runs on the cluster only" in lines[0], p.stderr


def test_compose_generate_needs_no_torch(tmp_path):
    """The file is written on a host that may lack PyTorch; the workers' image has it."""
    p = _hopbus(
        _without_torch(tmp_path), "compose", "generate", "--cpu", "4", "--mode", "allreduce"
    )
    assert p.returncode == 0, p.stderr
    flags = json.loads(p.stdout)["services"]["init"]["command"]
    assert "allreduce" in flags
