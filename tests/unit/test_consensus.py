"""The consensus distance: exact for small models, a CountSketch estimate for large ones."""

from __future__ import annotations

import numpy as np
import pytest

from hopbus.consensus import SKETCH_DIMS, distance, sketch


def _exact(models: list[dict[str, np.ndarray]]) -> float:
    flat = [np.concatenate([m[k].ravel() for k in sorted(m)]).astype(np.float64) for m in models]
    mean = np.mean(flat, axis=0)
    return max(float(np.linalg.norm(f - mean)) for f in flat) / float(np.linalg.norm(mean))


def _near(base: dict, scale: float, seed: int) -> list[dict]:
    """Four models around ``base``, each coordinate moved by ``scale`` noise."""
    rng = np.random.default_rng(seed)
    return [
        {k: v + scale * rng.standard_normal(v.shape) for k, v in base.items()} for _ in range(4)
    ]


def _measured(models: list[dict]) -> tuple[float, set[bool]]:
    """(the consensus distance from the models' sketches, whether the sketches were exact)."""
    sketches, exact = {}, set()
    for i, m in enumerate(models):
        s, is_exact = sketch(m)
        assert s.shape == (SKETCH_DIMS,)
        sketches[i] = s
        exact.add(is_exact)
    got = distance(sketches)
    assert got is not None
    return float(got["max"]), exact


def test_a_small_model_is_measured_exactly():
    rng = np.random.default_rng(0)
    models = _near({"W": rng.standard_normal((40, 10)), "b": rng.standard_normal(10)}, 0.01, 1)
    got, exact = _measured(models)
    assert exact == {True}
    assert got == pytest.approx(_exact(models), rel=1e-12)


def test_a_large_model_is_estimated_within_a_few_percent():
    rng = np.random.default_rng(1)
    base = {"conv": rng.standard_normal((300, 400)), "fc": rng.standard_normal(50_000)}
    models = _near(base, 0.05, 2)
    got, exact = _measured(models)
    assert exact == {False}
    assert got == pytest.approx(_exact(models), rel=0.05)


def test_models_that_agree_are_at_distance_zero_and_apart_ones_far():
    rng = np.random.default_rng(2)
    m = {"w": rng.standard_normal(100)}
    same = distance({i: sketch(m)[0] for i in range(3)})
    assert same is not None and same["max"] == pytest.approx(0.0, abs=1e-12)
    apart = distance({i: sketch({"w": rng.standard_normal(100)})[0] for i in range(3)})
    assert apart is not None and apart["max"] > 0.5


def test_unknown_when_there_is_nothing_to_compare():
    s = sketch({"w": np.ones(3)})[0]
    assert distance({0: s}) is None
    assert distance({0: np.zeros(SKETCH_DIMS), 1: np.zeros(SKETCH_DIMS)}) is None  # mean 0
    bad = s.copy()
    bad[0] = np.nan
    assert distance({0: bad, 1: s}) is None  # a non-finite sketch is left out
    assert distance({0: s[:10], 1: s}) is None  # a sketch of the wrong size too
