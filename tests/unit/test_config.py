"""RunConfig validation, TOML loading, and the settings the protocol refuses."""

import pytest

from hopbus.config import RunConfig, load_toml, make_config
from hopbus.errors import ConfigError, SlowdownSpecError
from hopbus.modes import Mode
from hopbus.protocol.spec import ProtocolWarning, plan
from hopbus.topology import NotDoublyStochasticWarning, Topology


def test_defaults_and_topology_fills_in_workers():
    cfg, topo = make_config({}).build_topology()
    assert cfg.workers == 16 == topo.n and cfg.topology == "ring-based"
    with pytest.warns(NotDoublyStochasticWarning):
        cfg, topo = make_config({"topology": "hierarchical:4,2,2"}).build_topology()
    assert cfg.workers == 8


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"staleness": -1}, "--staleness"),
        ({"mode": "fast"}, "--mode"),
        ({"backup": "1,x"}, "--backup: expected an integer"),
        ({"iterations": 0}, "--iterations"),
        ({"nonsense": 1}, "unknown setting 'nonsense'"),
        # bounds so large that an inbox's queue limit overflows or one Lua call pushes
        # millions of tokens into the broker: refused, not a hang
        ({"staleness": 10**10, "mode": "staleness"}, "--staleness: input should be less"),
        ({"max_ig": 10**8}, "--max-ig: input should be less"),
        # a config file's boolean is no count (pydantic alone takes true as 1)
        ({"iterations": True}, "--iterations: expected a number, got true"),
        ({"max_ig": False}, "--max-ig: expected a number, got false"),
    ],
)
def test_bad_values_name_the_flag(values, match):
    with pytest.raises(ConfigError, match=match):
        make_config(values)


def test_bad_slowdown_reports_the_grammar():
    with pytest.raises(SlowdownSpecError, match="expected none"):
        make_config({"slowdown": "random"})


def test_values_from_a_file_name_the_file(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('mode = "backup"\nmax-ig = 10\nskip_max = -1\n')
    values = load_toml(f)
    assert values == {"mode": "backup", "max_ig": 10, "skip_max": -1}
    with pytest.raises(ConfigError, match=r"run.toml: skip_max: input should be"):
        make_config(values, dict.fromkeys(values, str(f)))
    typed = {"iterations": True, "workers": 3}  # a boolean where a count goes: the file named
    with pytest.raises(ConfigError) as got:
        make_config(typed, dict.fromkeys(typed, str(f)))
    assert str(got.value) == f"{f}: iterations: expected a number, got true"
    bad = tmp_path / "bad.toml"
    bad.write_text("mode = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(bad)


def test_backup_lists_parse():
    assert make_config({"backup": "1,0,2"}).backup == (1, 0, 2)
    assert make_config({"backup": "2"}).backup == 2


def check(**kw):
    cfg, topo = make_config(kw).build_topology()
    return plan(cfg.protocol_settings(), topo)


def test_protocol_refusals():
    with pytest.raises(ConfigError, match="needs token queues"):
        check(mode="backup", max_ig=0)
    with pytest.raises(ConfigError, match="needs token queues"):
        check(mode="hybrid", max_ig=0)
    with pytest.raises(ConfigError, match="smaller than worker 0's in-degree"):
        check(mode="backup", backup=3)
    with pytest.raises(ConfigError, match="lists 2 values"):
        check(mode="backup", backup="1,1")
    with pytest.raises(ConfigError, match="skip-max needs token queues"):
        check(mode="staleness", max_ig=0, skip_max=5)


def test_backup_is_not_checked_where_unused():
    assert len(check(mode="staleness", backup=7)) == 16


def test_useless_skipping_warns():
    with pytest.warns(ProtocolWarning, match="use --mode backup"):
        check(mode="standard", skip_max=10)
    with pytest.warns(ProtocolWarning, match="raise --max-ig"):
        check(mode="backup", skip_max=10, skip_trigger=5, max_ig=5)


def test_store_is_sized_from_table1():
    specs = plan(
        make_config({"mode": "standard", "max_ig": 0}).protocol_settings(),
        Topology.named("ring-based", 16),
    )
    assert specs[0].store_slots == 2  # a neighbour is at most 1 ahead (Theorem 1)
    specs = plan(
        RunConfig(mode=Mode.STALENESS, staleness=3, max_ig=2).protocol_settings(),
        Topology.named("ring-based", 16),
    )
    assert specs[0].store_slots == 1 + 2 + 3 and specs[0].store_bound == 9


@pytest.mark.parametrize(
    ("text", "given", "match"),
    [
        ('lr = "abc"\n', {"lr": 0.1}, r"cfg.toml: lr: .*valid number.* fix the file"),
        ("iterations = true\n", {"iterations": 5}, r"cfg.toml: iterations: expected a number"),
        ('slowdown = "bogus:3"\n', {"slowdown": "none"}, r"cfg.toml: slowdown: bad --slowdown"),
    ],
)
def test_a_file_setting_a_flag_overrides_is_still_checked(tmp_path, text, given, match):
    """A config file wrong in a setting the flags override is refused all the same: the next
    run without the flag would fail on it."""
    from hopbus.cli.options import resolve
    from hopbus.config import TrainConfig

    path = tmp_path / "cfg.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        resolve(path, given, TrainConfig)


def test_a_file_setting_a_flag_overrides_is_taken_when_fine(tmp_path):
    """The usual layering: a sound file, a flag that replaces one of its settings."""
    from hopbus.cli.options import resolve

    path = tmp_path / "cfg.toml"
    path.write_text('mode = "backup"\nbackup = 2\nworkers = 4\n')
    cfg = resolve(path, {"backup": 1, "workers": 8})
    assert cfg.mode is Mode.BACKUP and cfg.backup == 1 and cfg.workers == 8


def test_launch_says_it_ignores_a_files_settings_of_hopbus_own_models(tmp_path, monkeypatch):
    """hopbus launch refuses --lr; the same lr from a file (a hopbus train config.toml) is
    said to be ignored, and a launch run's own config.toml (model = "script") is quiet."""
    from hopbus.cli.cluster import _warn_own_model_settings

    monkeypatch.delenv("HOPBUS_LR", raising=False)
    path = tmp_path / "cfg.toml"
    path.write_text('model = "softmax"\nlr = 0.5\nworkers = 2\n')
    with pytest.warns(UserWarning, match=r"ignores model \(.*cfg.toml\), lr \(.*cfg.toml\)"):
        _warn_own_model_settings(path)
    # and ignores them indeed: not in the run's settings (its record, ctx.config, the summary)
    from hopbus.cli.options import resolve
    from hopbus.config import OWN_MODEL_FIELDS, TrainConfig

    path.write_text("lr = 0.5\ncheckpoint_every = 10\nbatch_size = 64\nworkers = 2\n")
    cfg = resolve(path, {}, TrainConfig, ignore=OWN_MODEL_FIELDS)
    assert (cfg.lr, cfg.checkpoint_every, cfg.batch_size, cfg.workers) == (0.1, 0, 32, 2)
    path.write_text('model = "script"\ndata = "script"\nworkers = 2\n')
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_own_model_settings(path)


def test_a_heartbeat_longer_than_the_timeout_is_said_to_be_capped():
    """--heartbeat 100 --timeout 5: the heartbeat lives 5 s, said once; the default heartbeat
    under a short --timeout is no news to the user, who gave no --heartbeat."""
    import warnings

    from hopbus.cli.options import warn_unused
    from hopbus.config import TrainConfig

    cfg = make_config({"heartbeat": 100, "timeout": 5}, cls=TrainConfig)
    with pytest.warns(UserWarning, match="--heartbeat 100 is longer than --timeout 5"):
        warn_unused(cfg, {"heartbeat": 100, "timeout": 5})
    cfg = make_config({"heartbeat": 100, "timeout": 5}, cls=TrainConfig)  # from a file
    with pytest.warns(UserWarning, match="--heartbeat 100 is longer than --timeout 5"):
        warn_unused(cfg, {})
    cfg = make_config({"timeout": 2}, cls=TrainConfig)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unused(cfg, {"timeout": 2})


def test_a_setting_spelled_both_ways_in_a_file_is_refused(tmp_path):
    path = tmp_path / "cfg.toml"
    path.write_text("max_ig = 7\nmax-ig = 8\n")
    with pytest.raises(ConfigError, match=r"cfg\.toml: max_ig is set twice"):
        load_toml(path)
    path.write_text("max-ig = 3\nmax_ig = 4\n")  # each spelling as the file writes it
    with pytest.raises(ConfigError, match=r"set twice \(as 'max-ig' and 'max_ig'\)"):
        load_toml(path)


def test_a_config_file_built_to_exhaust_the_parser_is_one_line(tmp_path):
    """Faults ``dotted_key_bomb`` (50,000 dotted parts in a 100 kB file took tomllib past
    6 GB, quadratic in the parts) and ``long_integer`` (5,000 digits: a ValueError traceback
    from Python's integer conversion limit)."""
    path = tmp_path / "cfg.toml"
    path.write_text("workers = 4\n" + ".".join(["k"] * 50_000) + " = 1\n")
    with pytest.raises(ConfigError, match=r"line 2: a key of more than 16 dotted parts"):
        load_toml(path)
    path.write_text("workers = " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match="a number of thousands of digits"):
        load_toml(path)
    path.write_text("[a.b]\nc.d = 1\n")  # a few dotted parts: parsed, and refused as settings
    assert load_toml(path) == {"a": {"b": {"c": {"d": 1}}}}
    # what is no key is not counted: a comment, a value's lines (it refused both at first)
    dots = ", ".join(f"0.{i}" for i in range(20))
    path.write_text(f"# v1.2.3 on 10.0.0.1, {dots}\nmax_ig = 5\nx = [\n {dots},\n]\n")
    assert load_toml(path)["max_ig"] == 5
    path.write_text("[" + ".".join(["k"] * 17) + "]\n")  # a table's header is a key
    with pytest.raises(ConfigError, match=r"line 1: a key of more than 16 dotted parts"):
        load_toml(path)
