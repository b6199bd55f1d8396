"""WAGMA-SGD's rules (Li et al., "Breaking (global) barriers ... wait-avoiding group
averaging"), pure: who is grouped with whom, which iterations average globally, how a worker
merges a group's sum.

Groups follow a butterfly: in iteration t the group of p is everyone reachable by flipping the
bits ``(t * log2 S + r) mod log2 P`` for r = 0 .. log2 S - 1 (Algorithm 1, with the correction
in NOTES.md: the printed ``mask <<= shift`` makes groups of two). The bits rotate every
iteration, so an update reaches every worker within ceil(log_S P) iterations.

The runtime (hopbus/runtime/wagma_worker.py) does the waiting; everything it decides is here.
"""

from __future__ import annotations

import math


def _log2(x: int) -> int:
    if x < 1 or x & (x - 1):
        raise ValueError(f"{x} is not a power of two")
    return x.bit_length() - 1


def group_bits(t: int, workers: int, group_size: int) -> tuple[int, ...]:
    """The bits whose flips make iteration ``t``'s groups."""
    phases, total = _log2(group_size), _log2(workers)
    return tuple(1 << ((t * phases + r) % total) for r in range(phases)) if total else ()


def partner(p: int, t: int, r: int, workers: int, group_size: int) -> int:
    """p's partner in phase r of iteration t: p XOR (1 << ((t log2 S + r) mod log2 P))."""
    return p ^ group_bits(t, workers, group_size)[r]


def group_of(p: int, t: int, workers: int, group_size: int) -> tuple[int, ...]:
    """p's group in iteration t, ascending (p included)."""
    members = {p}
    for bit in group_bits(t, workers, group_size):
        members |= {q ^ bit for q in members}
    return tuple(sorted(members))


def groups(t: int, workers: int, group_size: int) -> list[tuple[int, ...]]:
    """Iteration t's partition of 0..P-1 into P/S groups, each ascending, by first member."""
    seen: set[int] = set()
    out = []
    for p in range(workers):
        if p not in seen:
            g = group_of(p, t, workers, group_size)
            seen.update(g)
            out.append(g)
    return out


def reach_iterations(workers: int, group_size: int) -> int | None:
    """ceil(log_S P): iterations of group averaging until an update has reached every worker;
    None for S = 1 (local SGD: only the global average mixes)."""
    if group_size == 1:
        return None
    return math.ceil(_log2(workers) / _log2(group_size))


def is_global(t: int, sync_period: int, iterations: int) -> bool:
    """Whether iteration t ends in the blocking global average: every tau-th iteration
    ((t + 1) mod tau == 0, Algorithm 2 line 8), and the last one, so that every worker ends
    with the same model."""
    return (t + 1) % sync_period == 0 or t == iterations - 1


def allreduce_partners(p: int, workers: int) -> tuple[int, ...]:
    """p's partner in each phase of a recursive-doubling all-reduce (the global average)."""
    return tuple(p ^ (1 << r) for r in range(_log2(workers)))


def merge_divisor(group_size: int, own_was_current: bool) -> int:
    """Algorithm 2 lines 10-13: W_{t+1} = W_sum / S when the sum holds this worker's model of
    this iteration; otherwise it took part passively (with an older model) and merges its new
    one too: (W_sum + W') / (S + 1)."""
    return group_size if own_was_current else group_size + 1
