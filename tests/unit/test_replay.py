"""Replaying the progress stream across a broker restart: the entries a reader had not read
are gone with the old stream, and the workers' restore entries say where they are."""

from __future__ import annotations

from helpers import complete3

from hopbus.protocol.spec import ProtocolSettings
from hopbus.runtime.progress import Replay


def _replay(entries: list[dict]) -> Replay:
    r = Replay(complete3(), ProtocolSettings(max_ig=3).gap_setting, t0=0.0)
    for t, rec in enumerate(entries, start=1):
        r.feed({**rec, "t": float(t)})
    return r


def _steps(*pairs: tuple[int, int]) -> list[dict]:
    return [{"worker": w, "iter": it} for w, it in pairs]


# Standard mode on the complete graph: no worker is ever more than 1 ahead of another. Before
# the restart all three are seen up to 5; then 1 -> 6, 2 -> 6 and 0 -> 7 happen, but only
# 1 -> 6 was read before Redis went (the others were lost with the old stream).
BEFORE = _steps(*((w, k) for k in range(1, 6) for w in range(3)), (1, 6))


def test_lost_entries_are_not_taken_for_a_broken_bound():
    r = _replay(
        [
            *BEFORE,
            {"worker": 0, "iter": 7, "restore": 1},  # 2 ahead of 2 as the reader saw it
            {"worker": 1, "iter": 6, "restore": 1},  # nothing of 1 was lost
            *_steps((1, 7)),  # a worker restored early goes on before the last restores
            {"worker": 2, "iter": 6, "restore": 1},
            *_steps((2, 7), (0, 8)),
        ]
    )
    assert r.monitor.violations == 0 and r.out_of_order == 0
    assert not r.monitor.resyncing
    assert [v.iteration for v in r.views] == [8, 7, 7]
    assert r.monitor.max_any == 1  # gaps are judged again after the last restore


def test_a_real_break_after_the_restores_still_counts():
    r = _replay(
        [
            *BEFORE,
            *({"worker": w, "iter": it, "restore": 1} for w, it in ((0, 6), (1, 6), (2, 6))),
            *_steps((0, 7), (0, 8)),
        ]
    )
    assert r.monitor.violations == 1 and r.monitor.first_violation is not None


def test_a_worker_that_dies_instead_of_restoring_ends_the_wait_for_it():
    r = _replay(
        [
            *BEFORE,
            {"worker": 0, "iter": 6, "restore": 1},
            {"worker": 1, "iter": 6, "restore": 1},
            {"worker": 2, "iter": 5, "dead": 1},
        ]
    )
    assert not r.monitor.resyncing and r.monitor.gone == {2}
