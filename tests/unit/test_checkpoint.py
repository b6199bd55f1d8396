"""Checkpoint files: atomic writes, the newest complete set, pruning, refusals; and a worker's
training state round-tripped through one (hopbus/runtime/checkpoint.py)."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from hopbus.config import TrainConfig
from hopbus.errors import ConfigError
from hopbus.heterogeneity import Heterogeneity
from hopbus.runtime import checkpoint as ck
from hopbus.runtime.checkpoint import CheckpointError, WorkerState
from hopbus.runtime.compute import Trainer


def state(value: float = 1.0) -> WorkerState:
    params = {"w": np.full((3, 2), value, np.float32), "b": np.full(2, value, np.float32)}
    momentum = {"w": np.full((3, 2), -value, np.float32), "b": np.zeros(2, np.float32)}
    return WorkerState(params, momentum, np.arange(5), {"pos": 2, "epoch": 1, "rng": {}})


def save_all(folder, workers, iteration, value=1.0):
    for w in workers:
        ck.save(folder, w, iteration, state(value), run="r1", model="softmax")


def test_save_then_load_round_trips_every_array(tmp_path):
    path = ck.save(tmp_path, 2, 40, state(3.0), run="r1", model="softmax")
    assert path == tmp_path / "worker-2" / "iter-00000040.npz"
    got = ck.load(tmp_path, 2, 40, layout=ck.layout_of(state().params))
    assert (got.worker, got.iteration, got.run) == (2, 40, "r1")
    for name, a in state(3.0).params.items():
        np.testing.assert_array_equal(got.state.params[name], a)
        assert got.state.params[name].dtype == a.dtype
    np.testing.assert_array_equal(got.state.optimizer["w"], np.full((3, 2), -3.0))
    np.testing.assert_array_equal(got.state.order, np.arange(5))
    assert got.state.stream == {"pos": 2, "epoch": 1, "rng": {}}
    assert got.meta["model"] == "softmax" and got.meta["layout"][0] == ["w", "float32", [3, 2]]
    # nothing that needs pickle: loadable with allow_pickle=False, as load does
    with np.load(path, allow_pickle=False) as npz:
        assert set(npz.files) == {"meta", "param/w", "param/b", "opt/w", "opt/b", "data/order"}
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp left


def test_newest_complete_is_the_largest_iteration_every_worker_has(tmp_path):
    save_all(tmp_path, range(3), 10)
    save_all(tmp_path, range(3), 20)
    save_all(tmp_path, [0, 2], 30)  # worker 1 not there yet
    assert ck.newest_complete(tmp_path, 3) == 20
    assert ck.newest_complete(tmp_path, 2) == 20  # worker 1 still missing 30
    assert ck.newest_complete(tmp_path, 1) == 30
    assert ck.newest_complete(tmp_path / "nothing", 3) is None
    assert ck.newest_complete(tmp_path, 4) is None  # worker 3 never wrote one


def test_a_crash_before_the_rename_leaves_the_previous_set_readable(tmp_path):
    """What a kill between writing the temporary file and renaming it leaves: a stray temp
    file (ignored), and a truncated final file as a broken disk could (skipped)."""
    save_all(tmp_path, range(2), 10)
    save_all(tmp_path, range(2), 20)
    good = ck.path_of(tmp_path, 0, 20).read_bytes()
    (tmp_path / "worker-0" / ".iter-00000030.npz.abc.tmp").write_bytes(good[:100])
    (tmp_path / "worker-1" / ".iter-00000030.npz.xyz.tmp").write_bytes(good)
    assert ck.newest_complete(tmp_path, 2) == 20
    ck.path_of(tmp_path, 1, 20).write_bytes(good[: len(good) // 2])  # truncated
    assert not ck.readable(tmp_path, 1, 20)
    assert ck.newest_complete(tmp_path, 2) == 10
    with pytest.raises(CheckpointError, match="unreadable"):
        ck.load(tmp_path, 1, 20)


def test_a_corrupt_member_is_skipped_not_fatal(tmp_path):
    save_all(tmp_path, range(2), 10)
    save_all(tmp_path, range(2), 20)
    path = ck.path_of(tmp_path, 0, 20)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("param/w.npy")
    start = info.header_offset + 30 + int.from_bytes(data[info.header_offset + 26 :][:2], "little")
    start += int.from_bytes(data[info.header_offset + 28 :][:2], "little")  # the extra field
    middle = start + info.compress_size - 4  # inside the array's bytes, past its .npy header
    data[middle] ^= 0xFF  # one flipped byte inside an array: the CRC no longer matches
    path.write_bytes(bytes(data))
    assert not ck.readable(tmp_path, 0, 20)
    assert ck.newest_complete(tmp_path, 2) == 10
    (tmp_path / "worker-1" / "iter-00000030.npz").write_text("not a zip")
    (tmp_path / "worker-0" / "iter-00000030.npz").write_text("not a zip")
    assert ck.newest_complete(tmp_path, 2) == 10


def test_a_file_under_another_workers_name_is_not_part_of_a_set(tmp_path):
    save_all(tmp_path, range(2), 10)
    ck.save(tmp_path, 0, 20, state(), run="r1")
    ck.path_of(tmp_path, 0, 20).rename(ck.path_of(tmp_path, 1, 20))  # worker 0's, misfiled
    ck.save(tmp_path, 0, 20, state(), run="r1")
    assert ck.newest_complete(tmp_path, 2) == 10
    with pytest.raises(CheckpointError, match="holds worker 0 at iteration 20, not worker 1"):
        ck.load(tmp_path, 1, 20)


def test_prune_keeps_the_newest_and_removes_stray_temp_files(tmp_path):
    for k in (10, 20, 30, 40, 50):
        ck.save(tmp_path, 0, k, state(), run="r1")
    stray = tmp_path / "worker-0" / ".iter-00000060.npz.q.tmp"
    stray.write_bytes(b"half")
    gone = ck.prune(tmp_path, 0, 3)
    assert ck.iterations(tmp_path, 0) == [30, 40, 50]
    assert stray in gone and not stray.exists()
    ck.prune(tmp_path, 0, None)  # keep all
    assert ck.iterations(tmp_path, 0) == [30, 40, 50]


def test_keep_covers_how_far_a_worker_can_run_ahead():
    assert ck.keep_for(2, 10) == ck.KEEP_MIN
    assert ck.keep_for(25, 10) == 5  # 3 checkpoints ahead of the newest common one, + 2
    assert ck.keep_for(None, 10) is None and ck.keep_for(float("inf"), 10) is None


def test_discard_after_removes_the_abandoned_timeline(tmp_path):
    save_all(tmp_path, range(2), 10)
    save_all(tmp_path, [0], 20)
    ck.discard_after(tmp_path, range(2), 10)
    assert ck.iterations(tmp_path, 0) == [10] and ck.iterations(tmp_path, 1) == [10]


def test_a_directory_named_like_a_newer_checkpoint_is_refused_before_anything_goes(tmp_path):
    """Fault ``checkpoint_named_directory``: ``mkdir iter-00000030.npz`` beside a set at 10.
    The resume said 'no checkpoint ... at iteration 30' and then failed writing its output."""
    save_all(tmp_path, range(2), 10)
    save_all(tmp_path, [0], 20)
    (tmp_path / "worker-1" / "iter-00000030.npz").mkdir()
    with pytest.raises(CheckpointError, match="is a directory, not a checkpoint file"):
        ck.load(tmp_path, 1, 30)
    with pytest.raises(CheckpointError, match=r"iter-00000030\.npz is a directory, named like"):
        ck.discard_after(tmp_path, range(2), 10)
    assert ck.iterations(tmp_path, 0) == [10, 20]  # nothing removed before the refusal
    (tmp_path / "worker-1" / "iter-00000030.npz").rmdir()
    (tmp_path / "worker-1" / "iter-00000030.npz").symlink_to(tmp_path / "elsewhere")
    ck.discard_after(tmp_path, range(2), 10)  # a link is removed, not what it points at
    assert ck.iterations(tmp_path, 0) == [10] and ck.iterations(tmp_path, 1) == [10]


def test_refusals_are_one_line(tmp_path):
    ck.save(tmp_path, 0, 10, state(), run="r1")
    with pytest.raises(CheckpointError, match="no checkpoint of worker 1 at iteration 10"):
        ck.load(tmp_path, 1, 10)
    other = (("w", "float32", (4, 2)), ("b", "float32", (2,)))
    with pytest.raises(CheckpointError, match="another model's parameters") as info:
        ck.load(tmp_path, 0, 10, layout=other)
    assert "\n" not in str(info.value) and info.value.exit_code == 2
    assert ck.run_of(tmp_path, 0, 10) == "r1"


def test_object_arrays_are_refused_and_nothing_is_written(tmp_path):
    """They would need pickle to load: never written, so loading never needs it."""
    ck.save(tmp_path, 0, 10, state(), run="r1")
    bad = state()
    bad.optimizer["b"] = np.array([object()], dtype=object)
    with pytest.raises(ValueError, match="opt/b"):
        ck.save(tmp_path, 0, 20, bad, run="r1")
    assert ck.iterations(tmp_path, 0) == [10]
    assert [p.name for p in (tmp_path / "worker-0").iterdir()] == ["iter-00000010.npz"]


def trainer() -> Trainer:
    cfg = TrainConfig(workers=4, model="softmax", data="digits", batch_size=16)
    return Trainer(cfg, 1, Heterogeneity.from_spec("none", 4, 0))


def step(t: Trainer, k: int) -> None:
    t.gradient(k)
    t.apply()


def test_a_trainer_resumed_from_a_checkpoint_continues_exactly(tmp_path):
    """Parameters, momentum and the minibatch stream all come back: the resumed trainer takes
    the very steps the uninterrupted one takes."""
    a = trainer()
    for k in range(7):
        step(a, k)
    ck.save(tmp_path, 1, 7, a.state(), run="r1")
    for k in range(7, 12):
        step(a, k)
    b = trainer()
    got = ck.load(tmp_path, 1, 7, layout=ck.layout_of(b.params))
    b.load_state(got.state)
    for k in range(7, 12):
        step(b, k)
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])


def test_a_malformed_minibatch_position_is_one_line(tmp_path):
    """A checkpoint whose order is not a permutation of the shard, or whose position is not a
    number: one CheckpointError line, never an IndexError."""
    import numpy as np

    from hopbus.config import TrainConfig, make_config
    from hopbus.heterogeneity import Heterogeneity

    cfg = make_config({"workers": 2, "iterations": 10}, cls=TrainConfig)
    trainer = Trainer(cfg, 0, Heterogeneity.from_spec("none", 2, 0))
    state = trainer.state()
    for order, stream in (
        (np.arange(len(state.order)) + 10_000, state.stream),  # rows that do not exist
        (state.order, {**state.stream, "pos": "abc"}),
        (state.order, {**state.stream, "rng": {"state": "x"}}),
    ):
        bad = WorkerState(state.params, state.optimizer, order, stream)
        with pytest.raises(CheckpointError, match="minibatch position"):
            trainer.load_state(bad)


@pytest.mark.parametrize(
    ("order", "stream"),
    [
        (np.array([0, 1, 1, 3, 4]), {"pos": 2, "epoch": 1, "rng": {}}),  # not a permutation
        (np.arange(5), {"pos": 9, "epoch": 1, "rng": {}}),  # past its rows
        (np.arange(5), {"epoch": 1, "rng": {}}),  # no position
        (np.arange(5), {"pos": 2, "epoch": 1, "rng": "x"}),  # no generator state
    ],
)
def test_a_set_whose_position_cannot_be_resumed_is_passed_over_for_an_older_one(
    tmp_path, order, stream
):
    """Fault ``bad_position``: a newer set whose minibatch position is well-formed JSON but
    not a position: a resume takes the older set, saying which file it passed over."""
    save_all(tmp_path, range(2), 10)
    save_all(tmp_path, range(2), 20)
    good = state()
    ck.save(tmp_path, 1, 20, WorkerState(good.params, good.optimizer, order, stream), run="r1")
    skipped: list[str] = []
    assert ck.newest_complete(tmp_path, 2, skipped, full=True) == 10
    assert skipped and str(ck.path_of(tmp_path, 1, 20)) in skipped[0]
    assert "malformed minibatch position" in skipped[0]


def _tampered(tmp_path, member: str, data: bytes, compression: int = zipfile.ZIP_STORED) -> None:
    """Sets of iterations 10 and 20, worker 0's file of 20 with ``member`` replaced by
    ``data``; then: that set is passed over for 10, and loading the file is one line."""
    save_all(tmp_path, range(2), 10)
    save_all(tmp_path, range(2), 20)
    path = ck.path_of(tmp_path, 0, 20)
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members[member] = data
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, content in members.items():
            zf.writestr(name, content)
    assert not ck.readable(tmp_path, 0, 20)
    assert ck.newest_complete(tmp_path, 2) == 10
    with pytest.raises(CheckpointError, match="unreadable"):
        ck.load(tmp_path, 0, 20)


def test_a_meta_nested_too_deep_is_unreadable_not_a_traceback(tmp_path):
    """Fault ``deep_meta``: a checkpoint whose meta is JSON nested 200,000 deep (json.loads
    recurses): skipped by the set search and refused by load with one line."""
    buf = io.BytesIO()
    np.save(buf, np.array("[" * 200_000))
    _tampered(tmp_path, "meta.npy", buf.getvalue())


def test_a_set_whose_files_name_different_runs_is_not_resumed(tmp_path):
    """Fault ``foreign_run_in_a_checkpoint``: worker 0's checkpoint of the newest set says it
    belongs to another run. A resume would clear that run's keys in a shared Redis and take
    it over: refused with one line before anything is touched."""
    from hopbus.runtime.launcher import CHECKPOINTS, plan_resume, write_config_toml

    cfg = TrainConfig(workers=2, topology="ring", model="softmax", iterations=100)
    write_config_toml(tmp_path / "config.toml", cfg)
    save_all(tmp_path / CHECKPOINTS, range(2), 20)
    assert plan_resume(str(tmp_path)).run == "r1"
    ck.save(tmp_path / CHECKPOINTS, 0, 20, state(), run="someone-else", model="softmax")
    with pytest.raises(ConfigError, match="name different runs"):
        plan_resume(str(tmp_path))


def test_momentum_that_fits_no_parameter_is_refused(tmp_path):
    """Fault ``misshapen_momentum``: a checkpoint whose optimizer state has another shape
    than its parameter (or names none of them) is refused in one line, not silently taken for
    zero momentum."""
    for bad in ({"w": np.zeros((2, 2), np.float32)}, {"nope": np.zeros(2, np.float32)}):
        s = state()
        ck.save(tmp_path, 0, 10, WorkerState(s.params, bad, s.order, s.stream), run="r1")
        with pytest.raises(CheckpointError, match="fits none of its parameters"):
            ck.load(tmp_path, 0, 10)


def test_a_resumed_timeline_goes_on_from_the_last_plausible_time(tmp_path):
    """Fault ``junk_time``: metrics.jsonl entries whose ``t`` is no run's (1e308, negative, a
    string) are kept as lines but do not set where the resumed entries' time goes on; the
    entries beyond the checkpoint's iteration go, as its checkpoints do."""
    from hopbus.runtime.launcher import _keep_until

    path = tmp_path / "metrics.jsonl"
    rows = [
        {"worker": 0, "iter": 1, "t": 0.5},
        {"worker": 1, "iter": 2, "t": 1e308},
        {"worker": 0, "iter": 2, "t": -3.0},
        {"worker": 1, "iter": 3, "t": "soon"},
        {"worker": 0, "iter": 3, "t": 1.25},
        {"worker": 0, "iter": 4, "t": 2.0},  # beyond the set of iteration 3: dropped
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _keep_until(path, 3) == 1.25
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:5]


def test_an_array_that_declares_more_than_it_holds_is_refused_before_it_is_read(tmp_path):
    """Fault ``bomb_header``: a parameter whose npy header declares 10**12 elements over 64
    bytes (numpy allocates what the header says first: 7 TiB, a MemoryError traceback).
    Skipped by the set search and refused by load with one line, without allocating it."""
    head = np.lib.format.header_data_from_array_1_0(np.zeros(3, np.float32))
    head["shape"] = (10**12,)
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, head)
    _tampered(tmp_path, "param/w.npy", buf.getvalue() + bytes(64))


def test_a_file_that_unpacks_to_more_than_any_checkpoint_is_refused_before_it_is_read(
    tmp_path, monkeypatch
):
    """Fault ``order_bomb``: a 2.3 MB file whose data order (zeros, deflated 1000:1) unpacked
    to 2.4 GB passed the ratio check, and sorting it ran out of memory (a traceback). A file
    that unpacks to more than MAX_UNPACKED is skipped and refused without reading it (the cap
    lowered here so that the test writes kilobytes)."""
    monkeypatch.setattr(ck, "MAX_UNPACKED", 1 << 20)
    buf = io.BytesIO()
    np.save(buf, np.zeros(200_000, np.int64))  # 1.6 MB of zeros
    _tampered(tmp_path, "data/order.npy", buf.getvalue(), zipfile.ZIP_DEFLATED)
