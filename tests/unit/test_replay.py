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
    # worker 0's 5 -> 7 is lost entries, not a jump: a run with --skip-max 0 showed "jumps 2"
    assert r.stats.jumps == 0 and r.stats.skipped == 0 and r.missed == 1


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


def test_a_forged_restore_entry_ends_its_resync_and_fakes_nothing():
    """Fault ``forged_restore``: a restore entry no restart caused, then a step back that
    no worker wrote. The step back is refused (not a progress_out_of_order), and the resync
    the restore began ends once every worker has stepped again: a break after it counts."""
    r = _replay(
        [
            *BEFORE,
            {"worker": 0, "iter": 5, "restore": 1},
            *_steps((1, 3)),  # forged: behind where worker 1 is
            *_steps((2, 6), (0, 6), (1, 7)),
        ]
    )
    assert r.out_of_order == 0 and r.rejected == 1 and not r.monitor.resyncing
    r.feed({"worker": 1, "iter": 8, "t": 99.0})  # 2 ahead of worker 2: a real break
    assert r.monitor.violations == 1


def test_a_worker_whose_entries_were_deleted_is_placed_not_frozen():
    """Fault ``deleted_progress``: worker 1's entry of iteration 3 was deleted before the
    reader read it, which the reader learns (from Redis) before reading on. Until worker 1's
    next entry, no gap with it is judged (it looks behind where it is); that entry, of
    iteration 4, places it: no violation, no refusal, and later steps are judged as before."""
    entries = _steps(*((w, k) for k in range(1, 5) for w in range(3) if (w, k) != (1, 3)))
    r = Replay(complete3(), ProtocolSettings(max_ig=3).gap_setting, t0=0.0)
    for t, rec in enumerate(entries, start=1):
        if rec == {"worker": 0, "iter": 3}:
            r.doubt([1, 2])  # whose entries were deleted, the reader cannot tell
        r.feed({**rec, "t": float(t)})
    assert r.monitor.violations == 0 and r.rejected == 0 and r.missed == 1
    assert [v.iteration for v in r.views] == [4, 4, 4]
    r.feed({"worker": 0, "iter": 5, "t": 50.0})
    r.feed({"worker": 0, "iter": 6, "t": 51.0})  # 2 ahead of 1 and 2: judged again
    assert r.monitor.violations == 1


def test_an_entry_placed_out_of_turn_fakes_no_break():
    """An entry written out of turn (forged at iteration 9, where worker 1's counter will be
    by the time it is read) after a deletion: it places worker 1 but no gap with it is
    judged until its next step, so the others' steps are no break."""
    r = _replay(BEFORE)
    r.doubt([0, 1, 2])
    r.feed({"worker": 1, "iter": 9, "t": 40.0})
    for t, (w, it) in enumerate(((0, 6), (2, 6), (0, 7), (2, 7)), start=41):
        r.feed({"worker": w, "iter": it, "t": float(t)})
    assert r.monitor.violations == 0 and r.missed == 1


def test_a_death_seen_in_the_dead_set_before_its_entries_and_marker():
    """Fault ``unmarked_dead`` as the replay meets it: worker 2 is in the dead set (the follower
    read it) before the replay saw its last step or any marker. Its late step is where it died,
    not a step out of order; a marker that comes after changes nothing; the others' gaps are
    no longer judged against it; a step behind where it died is not taken."""
    r = _replay(_steps(*((w, k) for k in range(1, 4) for w in range(3))))
    r.declare_dead(2, r.views[2].iteration, 10.0)
    r.feed({"worker": 2, "iter": 4, "t": 11.0})  # taken before the set held it, read late
    r.feed({"worker": 2, "iter": 4, "dead": 1, "t": 12.0})  # its marker, if one comes
    for k in range(4, 9):  # the others run on far ahead of it
        for w in (0, 1):
            r.feed({"worker": w, "iter": k, "t": 12.0 + k})
    assert r.monitor.violations == 0 and r.out_of_order == 0
    assert r.lost == [{"worker": 2, "iteration": 4, "t": 11.0}]
    assert r.stats.iterations[2] == 4 and r.stats.iter_time()["per_worker"][2] == 11.0 / 4
    r.feed({"worker": 2, "iter": 3, "t": 30.0})  # behind where it died: not taken
    assert r.out_of_order + r.rejected == 1 and r.views[2].iteration == 4
