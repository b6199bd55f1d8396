"""How far the workers' models are from agreeing: the consensus distance of a run.

``max_i ||x_i - mean|| / ||mean||`` over the workers' final parameters. Gathering every model in
one place would move n full snapshots through the broker, so each worker publishes a fixed-size
*sketch* of its parameters instead: the parameters themselves (exact) when there are at most
``SKETCH_DIMS`` numbers, otherwise a CountSketch into ``SKETCH_DIMS`` buckets (every coordinate
added, with a random sign, to one bucket, the same hash on every worker). A sketch is linear, so
the sketch of the mean is the mean of the sketches, and it preserves squared norms in
expectation, with a relative error of about sqrt(2 / SKETCH_DIMS) (1% here). The summary says
which of the two it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

SKETCH_DIMS = 1 << 14
"""Numbers per sketch (128 KiB as float64): exact up to this many parameters."""

_CHUNK = 1 << 20
_SEED = 0x486F70  # the same hash on every worker, in every run


def sketch(params: Mapping[str, np.ndarray]) -> tuple[np.ndarray, bool]:
    """(the sketch, whether it is the parameters themselves). Parameters in name order."""
    flat = [np.asarray(params[k], dtype=np.float64).reshape(-1) for k in sorted(params)]
    total = sum(a.size for a in flat)
    out = np.zeros(SKETCH_DIMS, np.float64)
    if total <= SKETCH_DIMS:
        if flat:
            out[:total] = np.concatenate(flat)
        return out, True
    pos = 0
    for a in flat:
        for lo in range(0, a.size, _CHUNK):
            part = a[lo : lo + _CHUNK]
            rng = np.random.default_rng([_SEED, pos + lo])
            buckets = rng.integers(0, SKETCH_DIMS, part.size)
            signs = rng.integers(0, 2, part.size) * 2.0 - 1.0
            out += np.bincount(buckets, weights=signs * part, minlength=SKETCH_DIMS)
        pos += a.size
    return out, False


def distance(sketches: Mapping[int, np.ndarray]) -> dict[str, object] | None:
    """The consensus distance of the given workers' sketches: ``max`` (the summary's
    ``consensus_distance``) and ``per_worker``; None with fewer than two finite sketches or a
    mean of norm zero."""
    usable = {
        i: s for i, s in sketches.items() if s.shape == (SKETCH_DIMS,) and np.isfinite(s).all()
    }
    if len(usable) < 2:
        return None
    mean = np.mean(list(usable.values()), axis=0)
    norm = float(np.linalg.norm(mean))
    if not math.isfinite(norm) or norm == 0.0:
        return None
    per = {i: float(np.linalg.norm(s - mean)) / norm for i, s in sorted(usable.items())}
    return {"max": max(per.values()), "per_worker": per}


__all__ = ["SKETCH_DIMS", "distance", "sketch"]
