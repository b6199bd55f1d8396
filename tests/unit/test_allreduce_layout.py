"""The ring all-reduce baseline's pure parts: no torch, no processes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hopbus.baselines.allreduce import FlatLayout, scheme_counters
from hopbus.cli.options import warn_unused
from hopbus.config import RunConfig
from hopbus.errors import ConfigError
from hopbus.modes import Family, Mode
from hopbus.runtime.allreduce_worker import store_address
from hopbus.topology import GapSetting


def test_the_mode_is_its_own_family_and_lock_step():
    assert Mode("allreduce") is Mode.ALLREDUCE and Mode.ALLREDUCE.family is Family.ALLREDUCE
    assert not Mode.ALLREDUCE.is_hop
    assert GapSetting(Mode.ALLREDUCE).forward == 1


def test_flat_layout_packs_and_views_without_copies():
    rng = np.random.default_rng(0)
    grads = {
        "w": rng.standard_normal((64, 10)).astype(np.float32),
        "b": rng.standard_normal(10).astype(np.float32),
    }
    layout = FlatLayout.of(grads)
    assert layout.size == 650 and layout.nbytes == 2600 and layout.dtype == np.float32
    buf = layout.buffer()
    layout.pack(grads, buf)
    views = layout.views(buf)
    assert list(views) == ["w", "b"]
    for name, a in grads.items():
        np.testing.assert_array_equal(views[name], a)
        assert np.shares_memory(views[name], buf)
    buf *= np.float32(0.5)  # what the worker does to the sum: the views follow
    np.testing.assert_array_equal(views["b"], grads["b"] * np.float32(0.5))


def test_counters_add_up_over_the_workers():
    results = [
        {"allreduces": 10, "allreduce_bytes": 2600, "allreduce_us": 30_000},
        {"allreduces": 10, "allreduce_bytes": 2600, "allreduce_us": 10_000},
    ]
    c = scheme_counters(results)
    assert c == {"allreduces": 20, "bytes_per_allreduce": 2600, "mean_allreduce_s": 0.002}
    assert scheme_counters([{}])["mean_allreduce_s"] is None  # a worker that never reported


def test_the_store_address_comes_from_bind():
    assert store_address("tcp://127.0.0.1:*") == ("127.0.0.1", 0)
    assert store_address("tcp://*:5555") == ("*", 5555)
    for bad in ("ipc:///tmp/x", "tcp://127.0.0.1", "tcp://host:port"):
        with pytest.raises(ConfigError, match="--mode allreduce needs tcp://"):
            store_address(bad)


def test_hop_flags_warn_with_allreduce():
    cfg = RunConfig(mode=Mode.ALLREDUCE)
    given = {"topology": "ring", "max_ig": 3, "group_size": 4, "backup": "1", "iterations": 5}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warn_unused(cfg, given)
    said = {str(w.message) for w in seen}
    for flag in ("--topology", "--max-ig", "--group-size", "--backup"):
        assert f"{flag} has no effect with --mode allreduce" in said
    assert not any("--iterations" in m for m in said)
