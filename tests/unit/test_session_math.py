"""The session's arithmetic: Reduce's combination (in place, into reused buffers), the aligned
scratch arrays TensorFlow reads without a copy, and what a model may send."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopbus.errors import ConfigError
from hopbus.runtime.session import ALIGN, aligned_empty, check_layout, combine, frozen


def _params(rng: np.random.Generator, dtype: str = "float32") -> dict[str, np.ndarray]:
    return {
        "W": rng.standard_normal((7, 3)).astype(dtype),
        "b": rng.standard_normal(3).astype(dtype),
    }


@given(
    st.integers(0, 4),
    st.floats(0.05, 1.0),
    st.booleans(),
    st.sampled_from(["float32", "float64"]),
    st.integers(0, 2**31),
)
def test_combine_is_the_weighted_sum(n_terms, self_weight, equal, dtype, seed):
    rng = np.random.default_rng(seed)
    x = _params(rng, dtype)
    weights = [0.3] * n_terms if equal else [float(w) for w in rng.uniform(0.01, 1.0, n_terms)]
    terms = [(_params(rng, dtype), w) for w in weights]
    for coefficient in (self_weight, self_weight - 1.0):  # the full Reduce, and its correction
        out = {k: aligned_empty(a.shape, a.dtype) for k, a in x.items()}
        got = combine(x, coefficient, terms, out=out)
        for name, a in x.items():
            want = coefficient * a.astype(np.float64) + sum(w * t[name] for t, w in terms)
            tol = 1e-5 if dtype == "float32" else 1e-12
            np.testing.assert_allclose(got[name], want, rtol=tol, atol=tol)
            assert got[name] is out[name] and got[name].dtype == a.dtype


def test_combine_leaves_its_inputs_alone():
    rng = np.random.default_rng(1)
    x = frozen(_params(rng))  # snapshots are read-only: an in-place write would raise
    terms = [(frozen(_params(rng)), 0.25), (frozen(_params(rng)), 0.25)]
    before = {k: a.copy() for k, a in x.items()}
    combine(x, 0.5, terms)
    for k, a in x.items():
        np.testing.assert_array_equal(a, before[k])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(1,), (3, 5), (64, 3, 3, 7), (0,)])
def test_aligned_arrays_start_on_the_boundary(dtype, shape):
    for _ in range(5):
        a = aligned_empty(shape, np.dtype(dtype))
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
        assert a.size == 0 or a.ctypes.data % ALIGN == 0


def test_only_floats_travel():
    check_layout((("w", "float32", (2,)), ("b", "float64", ())))
    with pytest.raises(ConfigError, match="'steps' is int64"):
        check_layout((("w", "float32", (2,)), ("steps", "int64", ())))
