"""The worked examples of the paper, reproduced in numbers on the simulator.

Each test freezes or slows a worker with a scripted schedule and checks where everybody ends up
when nothing more can happen, i.e. the situation the paper's figure draws.
"""

from helpers import FROZEN, Schedule, complete3, frozen_from, simulate, topology_of

from hopbus.modes import Mode

HORIZON = 1000.0  # virtual seconds: long after the unfrozen workers have stopped moving

# Fig. 5's graph: A -> C -> D -> E -> B -> A, so B (4) sends to A (0) and the path A->B has
# length 4. Ids: A=0, C=1, D=2, E=3, B=4.
A, B = 0, 4
FIG5 = topology_of([(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)], "fig5")


def final_iterations(result):
    return result.stats.iterations


def test_fig5_without_tokens_b_runs_four_ahead_and_a_holds_five_updates():
    """Fig. 5(2): Theorem 1 lets B be length(Path A->B) = 4 iterations ahead of a stuck A, so
    UpdateQ(A) must hold B's updates of iterations 0..4: five, one more than a queue of 4."""
    sim, r = simulate(
        FIG5, max_ig=0, iterations=50, schedule=Schedule(frozen_from(A, 0)), until=HORIZON
    )
    assert final_iterations(r) == [0, 1, 2, 3, 4]
    assert sim.workers[A].box.updates.size(w_id=B) == 5
    assert r.store_peak[A] == 5
    assert r.monitor.violations == 0


def test_sec42_max_ig_3_stops_b_at_iteration_3_and_a_holds_four_updates():
    """Sec. 4.2: with max_ig = 3, TokenQ(A->B) starts with 3 tokens; B takes one per iteration
    it enters, so it reaches iteration 3 but no more and A deals with at most 4 updates."""
    sim, r = simulate(
        FIG5, max_ig=3, iterations=50, schedule=Schedule(frozen_from(A, 0)), until=HORIZON
    )
    assert final_iterations(r)[B] == 3
    assert sim.ledger.size(A, B) == 0  # B used up every token A gave it
    assert r.store_peak[A] == 4
    assert r.blocked[-1].worker == B and r.blocked[-1].waiting_for == "tokens"
    assert r.blocked[-1].on == (A,)


def test_fig3b_staleness_lets_b_and_c_run_s_plus_1_ahead_of_a_stuck_a():
    """Fig. 3(b)/Sec. 3.5 with s = 5: A stays in iteration 0 after sending its update of
    iteration 0. B and C may finish every iteration k with k - 5 <= 0, so they complete
    iteration 5 and wait in iteration 6 for a fresher update from A: Table 1's s + 1."""
    _, r = simulate(
        complete3(),
        mode=Mode.STALENESS,
        staleness=5,
        max_ig=0,
        iterations=50,
        schedule=Schedule(frozen_from(0, 0)),
        until=HORIZON,
    )
    assert final_iterations(r) == [0, 6, 6]
    for b in r.blocked[1:]:
        assert (b.iteration, b.waiting_for, b.on) == (6, "updates", (0,))


def test_fig3b_with_tokens_the_smaller_bound_wins():
    _, r = simulate(
        complete3(),
        mode=Mode.STALENESS,
        staleness=5,
        max_ig=3,
        iterations=50,
        schedule=Schedule(frozen_from(0, 0)),
        until=HORIZON,
    )
    assert final_iterations(r) == [0, 3, 3]


def test_fig3a_backup_workers_advance_without_a_until_tokens_run_out():
    """Fig. 3(a): each worker needs one neighbour's update, so B and C go on without A; only
    the token queues (mandatory here, Sec. 4.3) stop them max_ig = 4 ahead."""
    _, r = simulate(
        complete3(),
        mode=Mode.BACKUP,
        backup=1,
        max_ig=4,
        iterations=50,
        schedule=Schedule(frozen_from(0, 0)),
        until=HORIZON,
    )
    assert final_iterations(r) == [0, 4, 4]
    assert {b.waiting_for for b in r.blocked[1:]} == {"tokens"}


def straggler_from(iteration: int) -> Schedule:
    """Worker A (0) computes 100x slower from ``iteration`` on; B and C stay normal."""
    return Schedule(lambda w, k: 100.0 if w == 0 and k >= iteration else 1.0)


def without_and_with_skipping(slow_from: int, **settings):
    """Where everybody stands just before A ends its slow iteration without skipping, and
    after A's jump (skipping at most 10, trigger 1), while A is in its next slow iteration."""
    common = {"iterations": 50, "schedule": straggler_from(slow_from), **settings}
    _, before = simulate(complete3(), until=99.0, **common)
    _, after = simulate(complete3(), until=150.0, skip_max=10, skip_trigger=1, **common)
    return before, after


def test_fig10b_backup_straggler_jumps_from_5_to_10_and_frees_b_and_c_for_5_more():
    """Fig. 10(b), max_ig = 5: A slows down in iteration 5; B and C reach 10 and block on A's
    token queues. A ends iteration 5, sees max_jump - max_ig = 5 and jumps to 10; B and C
    then train non-stop to 15 while A is still in iteration 10."""
    before, r = without_and_with_skipping(5, mode=Mode.BACKUP, backup=1, max_ig=5)
    assert final_iterations(before) == [5, 10, 10]  # blocked on tokens, as drawn
    assert r.stats.jumps == 1
    assert r.stats.skipped == 4  # iterations 6..9 never computed
    assert final_iterations(r) == [10, 15, 15]


def test_fig10a_staleness_straggler_jumps_to_9():
    """Fig. 10(a), s = 4: A slows down in iteration 4 after sending that iteration's update.
    B and C finish every iteration k with k - 4 <= 4 and wait in iteration 9 (s + 1 ahead;
    the text's "no more than 4 faster" counts the last iteration they finish). A ends
    iteration 4, jumps to 9 as in the figure, and B and C resume until 9 + s + 1 = 14."""
    before, r = without_and_with_skipping(4, mode=Mode.STALENESS, staleness=4, max_ig=10)
    assert final_iterations(before) == [4, 9, 9]
    assert r.stats.jumps == 1
    assert final_iterations(r) == [9, 14, 14]


def test_theorem1_standard_gap_is_the_path_length_on_a_directed_ring():
    """Theorem 1 is tight: on Fig. 5's ring every worker ends exactly length(Path A->w) ahead."""
    _, r = simulate(
        FIG5, max_ig=0, iterations=50, schedule=Schedule(frozen_from(A, 0)), until=HORIZON
    )
    assert r.monitor.max_any == 4 == r.monitor.table1["any_pair"]


def test_notify_ack_keeps_a_sender_at_most_two_ahead_of_its_receiver():
    """Sec. 3.3: A stops in iteration 1. B and C still finish iteration 1 (A sent that update
    once they had ACKed iteration 0) but then wait in iteration 2 for A's ACK(1) before they
    may Send(2): the backward dependence that makes notify-ack's gaps so tight."""
    _, r = simulate(
        complete3(),
        mode=Mode.NOTIFY_ACK,
        max_ig=0,
        iterations=50,
        schedule=Schedule(frozen_from(0, 1)),
        until=HORIZON,
    )
    assert final_iterations(r) == [1, 2, 2]
    for b in r.blocked[1:]:
        assert (b.waiting_for, b.on) == ("acks", (0,))
    assert r.monitor.violations == 0


def test_frozen_worker_never_finishes_is_reported_not_deadlocked():
    _, r = simulate(
        complete3(),
        iterations=5,
        schedule=Schedule(lambda w, k: FROZEN if w == 0 else 1),
        until=HORIZON,
    )
    assert not r.finished and not r.deadlocked
    assert r.blocked[0].waiting_for == "compute"
