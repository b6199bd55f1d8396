"""--slowdown-scope, bandwidths and --message-bytes as a user types them (issue 18)."""

import json

import pytest
from test_cli import hopbus


def test_sim_learns_vgg11_sized_updates_and_slows_whole_workers():
    p = hopbus(
        "sim", "-n", "8", "-k", "20", "--model", "vgg11", "--data", "cifar10",
        "--slowdown", "random:6+machines:4,4@0/1Gbit", "--json",
        env={"HOPBUS_SLOWDOWN_SCOPE": "iteration"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["message_bytes"] == 36_902_440 and s["config"]["slowdown_scope"] == "iteration"
    assert s["finished"] and s["violations"] == 0 and s["pairs_checked"] == "all"


def test_train_records_scope_and_size_in_config_toml(tmp_path):
    """A run's config.toml keeps both settings, and the simulator reads them back from it."""
    out = tmp_path / "run"
    p = hopbus(
        "train", "-n", "2", "--topology", "ring", "-k", "3", "--iter-time", "0.001",
        "--slowdown", "link:0/1GB@0-1", "--slowdown-scope", "iteration",
        "--message-bytes", "2MiB", "--out", str(out), "--json",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    toml = (out / "config.toml").read_text()
    assert 'slowdown_scope = "iteration"' in toml and "message_bytes = 2097152" in toml
    sim = hopbus("sim", "--config", str(out / "config.toml"), "--json")
    assert sim.returncode == 0, sim.stderr
    s = json.loads(sim.stdout)
    assert s["message_bytes"] == 2_097_152 and s["config"]["slowdown_scope"] == "iteration"


def test_a_link_slower_than_timeout_is_named_as_the_cause(tmp_path):
    """Not 'nothing arrived: can they reach it?': the message did arrive, and the emulated
    link held it longer than --timeout."""
    p = hopbus(
        "train", "-n", "2", "--topology", "ring", "-k", "5", "--iter-time", "0.001",
        "--slowdown", "link:3000@0-1", "--timeout", "2", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "held a message 3 s: raise --timeout" in last and "can they reach" not in last


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["sim", "--slowdown-scope", "worker"], "--slowdown-scope"),
        (["sim", "--slowdown", "link:5/1gbit@0-1"], "bandwidth '1gbit'"),
        (["sim", "--slowdown", "machines:8,8@1/0MB"], "must be above 0"),
        (["sim", "--message-bytes", "12 parsecs"], "--message-bytes"),
        (["sim", "--message-bytes", "-3"], "--message-bytes"),
        (["sim", "--slowdown", "link:0/1MB@0-1", "--model", "mine:model"], "--message-bytes"),
        (["train", "--slowdown-scope", "all"], "--slowdown-scope"),
        (["train", "--message-bytes", "1x"], "--message-bytes"),
        (["create", "--run", "r", "--slowdown", "link:1/2@0-1"], "bandwidth '2'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, words):
    p = hopbus(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hopbus: error: "), p.stderr
    assert words in lines[0]


def test_settings_that_change_nothing_say_so():
    p = hopbus("sim", "-n", "4", "-k", "2", "--message-bytes", "1MB", "--json")
    assert p.returncode == 0 and "--message-bytes has no effect" in p.stderr
    p = hopbus("sim", "-n", "4", "-k", "2", "--slowdown-scope", "iteration", "--json")
    assert p.returncode == 0 and "--slowdown-scope iteration has no effect" in p.stderr
