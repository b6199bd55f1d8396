"""JSON out of hopbus, always strict: summary.json, metrics.jsonl, --json, results.json, traces.

JSON has no NaN or infinity, and Python's encoder writes them anyway (bare ``NaN``, which no
strict reader accepts) or refuses with a traceback. A diverged model's loss is NaN, so every
writer goes through ``dumps``: a non-finite number becomes null (the summary says elsewhere that
the run diverged), a numpy scalar becomes the number it holds.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinity replaced by None and numpy scalars made plain."""
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON of ``obj`` (see the module docstring)."""
    return json.dumps(finite(obj), allow_nan=False, **kw)


__all__ = ["dumps", "finite"]
