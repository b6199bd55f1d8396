"""The ring all-reduce baseline (``--mode allreduce``): what it needs, how its gradients are laid
out for one collective, and how its counters add up. Pure, like the other schemes' rules; the
worker that runs it is ``hopbus.runtime.allreduce_worker``.

It is the synchronous data-parallel SGD users already run with Horovod or PyTorch DDP: every
iteration each worker computes a gradient, the gradients are summed by one all-reduce
(torch.distributed, gloo backend), divided by the number of workers, and every worker takes the
same optimizer step. So every worker holds the same model at every iteration, as with ps-bsp,
without a server.

PyTorch is an optional dependency (the ``bench`` extra) and is imported here only by
``require_torch``, so the rest of hopbus never pays for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hopbus.errors import ConfigError
from hopbus.models.extras import install_hint, load

if TYPE_CHECKING:
    from hopbus.models import Params

INSTALL = install_hint("bench")


def require_torch() -> None:
    """Refuse ``--mode allreduce`` up front, in one line, when PyTorch with gloo cannot be
    imported: better than every worker failing with a traceback after start-up."""
    dist = load("torch.distributed", feature="--mode allreduce", package="PyTorch", extra="bench")
    if not (dist.is_available() and dist.is_gloo_available()):
        import torch

        raise ConfigError(
            f"--mode allreduce needs PyTorch built with torch.distributed and gloo; torch "
            f"{torch.__version__} here has neither: {INSTALL} on Linux or macOS"
        )


@dataclass(frozen=True)
class FlatLayout:
    """Where each named array lies in the one flat buffer an all-reduce sums: one collective
    per iteration (as DDP's gradient buckets, with a single bucket) instead of one per tensor,
    each paying the ring's 2(n-1) latency steps."""

    slots: tuple[tuple[str, int, int, tuple[int, ...]], ...]  # name, start, stop, shape
    size: int
    dtype: np.dtype

    @classmethod
    def of(cls, arrays: Params) -> FlatLayout:
        slots, at = [], 0
        for name, a in arrays.items():
            slots.append((name, at, at + a.size, tuple(a.shape)))
            at += a.size
        dtype = np.result_type(*arrays.values()) if arrays else np.dtype(np.float32)
        return cls(tuple(slots), at, np.dtype(dtype))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def buffer(self) -> np.ndarray:
        """A flat buffer for this layout, to be reused every iteration."""
        return np.empty(self.size, dtype=self.dtype)

    def pack(self, arrays: Params, out: np.ndarray) -> None:
        """Copy ``arrays`` into their slices of ``out`` (the one copy an iteration makes)."""
        for name, start, stop, _ in self.slots:
            np.copyto(out[start:stop], arrays[name].reshape(-1), casting="same_kind")

    def views(self, buf: np.ndarray) -> Params:
        """Named views into ``buf``, no copies: valid until ``buf`` is packed again."""
        return {name: buf[start:stop].reshape(shape) for name, start, stop, shape in self.slots}


COUNTERS = ("allreduces", "allreduce_bytes", "allreduce_us")
"""Each worker's own counters (integers, so they ride along with the heartbeat's stats):
all-reduce calls, bytes of the flat buffer each call sums, microseconds spent in them."""


def scheme_counters(results: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary's ``scheme.counters`` from the workers' reports: calls summed over the
    workers, bytes per call (the same on every worker), mean seconds per call."""
    res = list(results)
    calls = sum(int(r.get("allreduces", 0)) for r in res)
    micros = sum(int(r.get("allreduce_us", 0)) for r in res)
    return {
        "allreduces": calls,
        "bytes_per_allreduce": max((int(r.get("allreduce_bytes", 0)) for r in res), default=0),
        "mean_allreduce_s": micros / calls / 1e6 if calls else None,
    }


__all__ = [
    "COUNTERS",
    "INSTALL",
    "FlatLayout",
    "require_torch",
    "scheme_counters",
]
