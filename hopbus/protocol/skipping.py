"""Skipping iterations (Sec. 5): a straggler recognises itself by its out-neighbours' token
queues and jumps ahead instead of dragging the graph down.

At the end of iteration k0 a worker reads TokenQ(j->i).size() for every out-neighbour j. By the
token invariant each size is Iter(j) - Iter(i) + max_ig, so

    behind = min_j TokenQ(j->i).size() - max_ig = min_j Iter(j) - Iter(i)

is how far it trails the slowest out-neighbour. If ``behind`` exceeds the trigger it enters
iteration k0 + J instead of k0 + 1, with

    J = min(skip_max, behind, max_ig, iterations left).

``J <= behind`` is the paper's bound max_jump - max_ig: never overtake an out-neighbour, so no
out-neighbour ever needs an update the jumper skipped. ``J <= max_ig`` is implied by that bound
on graphs whose edges go both ways; on a directed graph it is what keeps every in-neighbour able
to reach iteration k - 1 with the tokens the jumper has already given it, so the jumper's
Recv(k - 1) cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Iterable


def lag_behind(token_counts: Iterable[int], max_ig: int) -> int:
    """min_j Iter(j) - Iter(i) over out-neighbours j, read off their token queues (0 when
    there is none left to compare with: every out-neighbour dead)."""
    return min(token_counts, default=max_ig) - max_ig


def jump_length(behind: int, *, skip_max: int, trigger: int, max_ig: int, remaining: int) -> int:
    """How many iterations to advance at the end of this one: 1 is a normal step, 2+ a jump."""
    if skip_max < 2 or behind <= trigger:
        return 1
    return max(1, min(skip_max, behind, max_ig, remaining))
