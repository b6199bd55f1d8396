"""The CLI as a user types it, each command in its own process."""

import json
import os
import subprocess
import sys

import pytest

SUMMARY_KEYS = {
    "config",
    "workers",
    "virtual",
    "wall_s",
    "iterations",
    "iter_time_s",
    "max_gap",
    "gap_bound",
    "violations",
    "jumps",
    "stale_dropped",
    "max_update_queue",
}


def hopbus(*args: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HOPBUS_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hopbus", *args],
        capture_output=True,
        check=False,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=120,
    )


def test_topology_json_reports_neighbours_w_gap_and_bounds():
    p = hopbus("topology", "ring-based", "-n", "8", "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["workers"] == 8 and rep["edges"] == 24
    assert rep["neighbours"][0] == {"worker": 0, "in": [1, 4, 7], "out": [1, 4, 7]}
    w = {(i, j): x for i, j, x in rep["W"]}
    assert len(w) == 8 + 24 and w[0, 0] == 0.25 and w[4, 0] == 0.25
    assert sum(x for (i, _), x in w.items() if i == 0) == pytest.approx(1)
    assert rep["spectral_gap"] == pytest.approx(0.5) and rep["doubly_stochastic"]
    rows = {b["setting"]: b for b in rep["bounds"]}
    assert rows["standard"]["any_pair"] == 2
    assert rows["backup"]["any_pair"] is None
    assert rows["backup+tokens(max_ig=5)"]["adjacent"] == 5


def test_topology_table_for_people():
    p = hopbus("topology", "hierarchical:4,2,2")
    assert p.returncode == 0
    assert "spectral gap" in p.stdout and "Table 1" in p.stdout
    assert p.stderr.startswith("hopbus: warning: topology 'hierarchical:4,2,2': W is not doubly")


def test_sim_json_is_one_summary_object():
    p = hopbus(
        "sim",
        "--workers",
        "8",
        "--iterations",
        "30",
        "--mode",
        "backup",
        "--slowdown",
        "random:6",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s.keys() >= SUMMARY_KEYS
    assert s["virtual"] is True and s["workers"] == 8 and s["violations"] == 0
    assert s["iterations"] == {"min": 30, "max": 30, "per_worker": [30] * 8}
    assert s["config"]["mode"] == "backup" and s["config"]["max_ig"] == 5
    assert set(s["iter_time_s"]) == {"mean", "p50", "per_worker"}
    assert set(s["gap_bound"]) == {"adjacent", "any_pair"}


def test_sim_human_summary():
    p = hopbus("sim", "-n", "6", "-k", "10")
    assert p.returncode == 0
    assert "finished" in p.stdout and "violations 0" in p.stdout


def test_sim_trace_is_the_progress_stream(tmp_path):
    trace = tmp_path / "trace.jsonl"
    p = hopbus(
        "sim", "-n", "8", "-k", "20", "--slowdown", "random:6:0.2", "--trace", str(trace), "--json"
    )
    assert p.returncode == 0
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(rows) == 8 * 20
    assert {"t", "worker", "iter", "compute_s", "wait_s", "blocked_on"} <= rows[0].keys()
    assert sorted(r["iter"] for r in rows if r["worker"] == 2) == list(range(1, 21))
    waited = [r for r in rows if r["wait_s"] > 0]
    assert waited and all(r["blocked_on"] for r in waited)  # a real wait names whom for
    assert all(not r["blocked_on"] for r in rows if r["wait_s"] == 0)


def test_config_file_env_and_flags_layer(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('mode = "staleness"\nstaleness = 2\niterations = 7\nworkers = 6\n')
    p = hopbus(
        "sim", "--config", str(f), "--iterations", "9", "--json", env={"HOPBUS_STALENESS": "3"}
    )
    cfg = json.loads(p.stdout)["config"]
    assert (cfg["mode"], cfg["staleness"], cfg["iterations"], cfg["workers"]) == (
        "staleness",
        3,
        9,
        6,
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["sim", "--topology", "nope"], "unknown topology 'nope'"),
        (["sim", "--workers", "1"], "ring-based needs at least 2 workers (got 1)"),
        (["sim", "--workers", "99999999999999999999"], "more than hopbus handles (20000)"),
        (["sim", "--mode", "backup", "--backup", "3"], "must be smaller than worker 0's in-degree"),
        (["sim", "--mode", "staleness", "--staleness", "-1"], "--staleness"),
        (["sim", "--mode", "backup", "--max-ig", "0"], "needs token queues"),
        (["sim", "--mode", "hybrid", "--max-ig", "0"], "needs token queues"),
        (["sim", "--slowdown", "random:six"], "bad --slowdown"),
        (["sim", "--slowdown", "fixed:4@20"], "worker 20 does not exist"),
        (["sim", "--slowdown", "link:5@0-7"], "not neighbours"),
        (["sim", "--workers", "many"], "--workers"),
        (["sim", "--mode", "quick"], "--mode"),
        (["sim", "--frobnicate"], "No such option"),
        (["sim", "--config", "/nonexistent/run.toml"], "cannot read config file"),
        (["sim", "--topology", "file:/nonexistent/edges.txt"], "cannot read topology file"),
        (["sim", "--trace", "/nonexistent/dir/t.jsonl"], "cannot write --trace"),
        (["sim", "--trace", "-"], "--trace needs a file path"),
        (["sim", "--compute-time", "inf"], "--compute-time"),
        (["sim", "--latency", "nan"], "--latency"),
        (["sim", "--slowdown", "fixed:4@0,0"], "lists a worker twice"),
        (["sim", "--slowdown", "random:1e308"], "at most 1e+06"),
        (["sim", "--slowdown", "random:\u0661"], "bad --slowdown"),
        (["sim", "--backup", "1,,1", "--mode", "backup"], "--backup: expected an integer"),
        (["sim", "--topology", "hierarchical:4,,2"], "hierarchical sizes must be integers"),
        (["sim", "--topology", "file:"], "no path given"),
        (["sim", "--topology", "file:/dev/zero"], "is not a regular file"),
        (["sim", "--config", "/"], "is a directory"),
        (["topology", "ring", "-n", "1"], "ring needs at least 2 workers (got 1)"),
        (["topology", "complete", "-n", "6000"], "more than hopbus handles"),
        # time.sleep(inf) raised OverflowError once a frame was shown (fault ``endless_interval``)
        (["top", "--run", "x", "--interval", "inf"], "less than or equal to 3600"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, words):
    p = hopbus(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hopbus: error: "), p.stderr
    assert words in lines[0]
    assert "Traceback" not in p.stderr


def test_a_trace_over_an_input_or_into_a_pipe_is_refused(tmp_path):
    """Faults ``trace_over_its_config`` (the trace replaced the --config it was read from)
    and ``trace_fifo`` (opening a named pipe for writing waited for a reader forever)."""
    config = tmp_path / "run.toml"
    config.write_text("workers = 3\n")
    p = hopbus("sim", "-k", "3", "--config", str(config), "--trace", str(config))
    assert p.returncode == 2 and "is a file this command reads" in p.stderr, p.stderr
    assert config.read_text() == "workers = 3\n"
    edges = tmp_path / "ring.txt"  # a topology named by its bare path is read too
    edges.write_text("0 1\n1 0\n1 2\n2 1\n2 0\n0 2\n")
    p = hopbus("sim", "-k", "3", "--topology", str(edges), "--trace", str(edges))
    assert p.returncode == 2 and "is a file this command reads" in p.stderr, p.stderr
    os.mkfifo(tmp_path / "pipe")
    p = hopbus("sim", "-n", "3", "-k", "3", "--trace", str(tmp_path / "pipe"))
    assert p.returncode == 2 and "is a pipe no process reads" in p.stderr, p.stderr


def test_bad_input_writes_nothing(tmp_path):
    trace = tmp_path / "trace.jsonl"
    p = hopbus("sim", "--mode", "backup", "--max-ig", "0", "--trace", str(trace))
    assert p.returncode == 2 and not trace.exists()


def test_a_graph_that_is_not_strongly_connected_is_refused(tmp_path):
    f = tmp_path / "oneway.txt"
    f.write_text("0 1\n1 2\n")
    p = hopbus("sim", "--topology", f"file:{f}")
    assert p.returncode == 2
    assert p.stderr.strip() == (
        f"hopbus: error: topology 'file:{f}' is not strongly connected: "
        "worker 1 cannot reach worker 0"
    )


def test_flags_the_mode_ignores_are_warned_about():
    p = hopbus("sim", "-n", "4", "-k", "3", "--staleness", "2", "--json")
    assert p.returncode == 0
    assert "hopbus: warning: --staleness has no effect with --mode standard" in p.stderr
    # --skip-max 1 allows no jump (one of 1 is a plain step): said, as the other no-ops are
    p = hopbus("sim", "-n", "4", "-k", "3", "--mode", "backup", "--skip-max", "1", "--json")
    assert p.returncode == 0
    assert "hopbus: warning: --skip-max 1 never jumps" in p.stderr


def test_help_works_everywhere():
    for args in (["--help"], ["sim", "--help"], ["topology", "--help"], ["-h"], ["launch", "-h"]):
        p = hopbus(*args)
        assert p.returncode == 0 and "Usage" in p.stdout
    assert "[default: 5]" in hopbus("sim", "--help", env={"COLUMNS": "200"}).stdout
    # a worker and a parameter server take the run's --timeout, not 60, where none is given
    for command in ("worker", "ps"):
        text = hopbus(command, "--help", env={"COLUMNS": "300"}).stdout
        assert "[default: the run's --timeout; 60 until it is read]" in text, command


def test_each_commands_help_lists_the_modes_it_runs():
    wide = {"COLUMNS": "300"}
    hop = "standard|notify-ack|backup|staleness|hybrid"
    ps = "ps-bsp|ps-ssp|ps-asp|ps-backup|ps-elastic"
    assert f"<{hop}|{ps}|wagma|allreduce>" in hopbus("train", "--help", env=wide).stdout
    assert f"<{hop}|{ps}>" in hopbus("sim", "--help", env=wide).stdout
    assert f"<{hop}>" in hopbus("launch", "--help", env=wide).stdout
    # a mode a command does not run still gets the line saying where it runs
    p = hopbus("sim", "--mode", "wagma")
    assert p.returncode == 2 and "runs on the cluster only (hopbus train)" in p.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-3", "0"])
def test_a_timeout_given_to_one_worker_is_checked_as_a_runs(value):
    """hopbus worker and ps --timeout, HOPBUS_TIMEOUT and hopbus.join(timeout=) are not read
    from a run's checked settings: NaN or infinity waited forever, a negative one was a
    traceback from the Redis client. Each is refused by the run's own rule, in one line."""
    nowhere = "redis://127.0.0.1:9/0"  # never reached: refused before
    line = _one_error_line(hopbus("worker", "--run", "r", "--redis", nowhere, "--timeout", value,
                                  "--", sys.executable, "-c", "pass"))  # fmt: skip
    assert line.startswith("hopbus: error: --timeout: input should be"), line
    line = _one_error_line(hopbus("ps", "--run", "r", "--redis", nowhere, "--timeout", value))
    assert line.startswith("hopbus: error: --timeout: input should be"), line
    p = subprocess.run(
        [sys.executable, "-c", "import hopbus; hopbus.join()"], capture_output=True, text=True,
        env={**os.environ, "HOPBUS_RUN": "r", "HOPBUS_REDIS": nowhere, "HOPBUS_TIMEOUT": value},
        timeout=60, check=False,
    )  # fmt: skip
    assert p.returncode == 1 and p.stderr.startswith("hopbus: error: HOPBUS_TIMEOUT: input"), (
        p.stderr
    )
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    p = hopbus("worker", "--run", "r", "--redis", nowhere, "--", sys.executable, "-c", "pass",
               env={"HOPBUS_TIMEOUT": value})  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("hopbus: error: --timeout (HOPBUS_TIMEOUT): input"), p.stderr
    if value == "nan":  # and a boolean is no number of seconds (it was taken for 1)
        p = subprocess.run(
            [sys.executable, "-c", "import hopbus; hopbus.join(timeout=True)"], text=True,
            capture_output=True, env={**os.environ, "HOPBUS_RUN": "r", "HOPBUS_REDIS": nowhere},
            timeout=60, check=False,
        )  # fmt: skip
        assert p.stderr == "hopbus: error: join(timeout): a number is needed, not True\n"


def test_sim_takes_the_knob_its_help_names_for_ps_elastic():
    """``hopbus sim --help`` says ps-elastic takes --lookahead: sim has the flag (only the
    environment or a config file could set R), and R changes where the barriers go."""

    def barriers(r: str) -> int:
        p = hopbus("sim", "--mode", "ps-elastic", "--lookahead", r, "-n", "4", "-k", "40",
                   "--slowdown", "random:3", "--json")  # fmt: skip
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["scheme"]["counters"]["barriers"]

    assert barriers("1") != barriers("15")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\xff\xfe0 1\n", "not UTF-8 text"),
        (b"0 999999999\n999999999 0\n", "more than hopbus handles"),
        (b"0 1 x\n1 0 0.5\n", "weight must be a number"),
        (b"0 1\n1 zero\n", "worker ids must be integers"),
        # a file that is no edge list (/proc/self/environ, say): its content is not quoted
        (b"AWS_SECRET=hunter2\x00PATH=/bin a b c\n", "expected 'src dst [weight]', got 4"),
        (b"0 hunter2\n", "worker ids must be integers"),
        (b"0 1 hunter2\n", "weight must be a number"),
    ],
)
def test_bad_topology_files_are_one_line(tmp_path, content, words):
    f = tmp_path / "graph.txt"
    f.write_bytes(content)
    for args in (["topology", f"file:{f}"], ["sim", "--topology", f"file:{f}"]):
        p = hopbus(*args)
        assert p.returncode == 2 and "Traceback" not in p.stderr
        assert p.stderr.count("\n") == 1 and words in p.stderr, p.stderr
        assert "hunter2" not in p.stderr


def test_output_that_cannot_be_written_is_one_line(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        p = subprocess.run(
            [sys.executable, "-m", "hopbus", "sim", "-k", "3", "--json"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert p.returncode == 1
    assert p.stderr == "hopbus: error: cannot write output: No space left on device\n"


def test_version():
    p = hopbus("--version")
    assert p.returncode == 0 and p.stdout.startswith("hopbus ")


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hopbus: error: "), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


def test_checkpoint_flags_refuse_bad_input_in_one_line(tmp_path):
    """--checkpoint-every below 0; --checkpoint-every with a scheme that writes none;
    --resume with another run flag, of a folder without checkpoints, of nothing at all. All
    refused before any process or Redis starts."""
    line = _one_error_line(hopbus("train", "--checkpoint-every", "-1"))
    assert "--checkpoint-every" in line
    line = _one_error_line(hopbus("train", "--mode", "ps-bsp", "--checkpoint-every", "5"))
    assert "only the Hop modes (standard, notify-ack, backup" in line and "ps-bsp" in line
    line = _one_error_line(hopbus("train", "--resume", str(tmp_path), "--iterations", "5"))
    assert "leave out --iterations" in line
    line = _one_error_line(hopbus("train", "--resume", str(tmp_path), "--out", str(tmp_path)))
    assert "leave out --out" in line
    line = _one_error_line(hopbus("train", "--resume", str(tmp_path),
                                  env={"HOPBUS_ITERATIONS": "5"}))  # fmt: skip
    assert "leave out --iterations (HOPBUS_ITERATIONS is set in the environment)" in line
    line = _one_error_line(hopbus("train", "--resume", "no-such-run", cwd=tmp_path))
    assert "no such results folder" in line
    run = tmp_path / "runs" / "r7"
    (run / "checkpoints" / "worker-0").mkdir(parents=True)
    (run / "config.toml").write_text("workers = 4\ncheckpoint_every = 10\n")
    (run / "checkpoints" / "worker-0" / "iter-00000010.npz").write_text("torn")
    line = _one_error_line(hopbus("train", "--resume", "r7", cwd=tmp_path))
    assert line == (
        f"hopbus: error: no complete checkpoint set in {os.path.join('runs', 'r7', 'checkpoints')}"
        ": nothing to resume"
    )
    assert not (run / "metrics.jsonl").exists()


def test_resume_is_not_a_flag_of_create():
    p = hopbus("create", "--resume", "x")
    assert p.returncode == 2 and "No such option" in p.stderr


def test_your_own_model_and_data_that_cannot_be_used_are_one_line(tmp_path):
    """--model / --data MODULE:FUNCTION: refused before any process starts, exit 2."""
    (tmp_path / "mine.py").write_text(
        "import numpy as np\n"
        "def model():\n    return 'a string'\n"
        "def data():\n    return np.zeros((4, 2)), np.zeros(4)\n"
        "def broken():\n    raise KeyError('no such layer')\n"
        "def asks(num_classes):\n    return None\n"
    )
    cases = [
        (["--model", "nosuchmodule_hopbus:build"], "no module named 'nosuchmodule_hopbus'"),
        (["--model", "mine:absent"], "module 'mine' has no 'absent'"),
        (["--model", "mine:model"], "returned a str: expected a compiled Keras model"),
        (["--model", "mine:broken"], "raised KeyError: 'no such layer'"),
        (["--data", "mine:data"], "returned a tuple of 2: expected 4 arrays, (x_train, y_train"),
        (
            ["--model", "mine:asks"],
            "needs the argument 'num_classes', which hopbus does not give (it gives n_features, "
            "n_classes, input_shape by name",
        ),
        (["--data", "mine:asks"], "needs the argument 'num_classes', which hopbus does not give"),
        (["--model", "mine.py:model", "--mode", "ps-bsp"], "returned a str"),
        (["--model", "not a spec"], "unknown model"),
    ]
    for flags, expected in cases:
        p = hopbus("train", "-n", "2", "--iterations", "5", *flags, cwd=tmp_path)
        assert p.returncode == 2, (flags, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hopbus: error: "), (flags, p.stderr)
        assert expected in lines[0], (flags, lines[0])
    assert not list(tmp_path.glob("runs/*")), "nothing was started"


def test_a_script_given_to_train_points_to_launch():
    p = hopbus("train", "--", "python", "loop.py")
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("hopbus: error: Got unexpected extra argument") and (
        "your own script runs with hopbus launch [flags] -- COMMAND ARGS..." in line
    ), line
