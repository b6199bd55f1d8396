"""The worker loop driven by hand: which effects, in which order, with which arguments.

This is the contract every driver relies on. No simulator here: a tiny driver answers each
effect the way a test wants.
"""

import pytest
from helpers import complete3

from hopbus.modes import Approach, Mode
from hopbus.protocol import effects as fx
from hopbus.protocol.spec import ProtocolSettings, plan
from hopbus.protocol.worker import worker_loop


def drive(spec, answer, limit=200, start=0):
    """Run ``worker_loop(spec, start=start)`` recording effect types; ``answer(effect)`` gives
    the result."""
    gen = worker_loop(spec, start=start)
    seen = []
    value = None
    for _ in range(limit):
        try:
            eff = gen.send(value)
        except StopIteration:
            return seen
        seen.append(eff)
        value = answer(eff)
    raise AssertionError("loop did not finish")


def spec_for(worker=0, **kw):
    return plan(ProtocolSettings(**kw), complete3())[worker]


def everything_ready(spec, token_counts=None):
    box = spec.new_mailbox()

    def answer(eff):
        if isinstance(eff, fx.ReadFloors):
            return dict.fromkeys(eff.of, 0)
        if isinstance(eff, fx.ReadTokenCounts):
            return token_counts or dict.fromkeys(eff.of, spec.settings.max_ig)
        if isinstance(eff, fx.Recv):
            req = eff.requirement
            for j in spec.in_peers:  # every neighbour's update of that iteration arrives
                box.deliver_update(j, req.iteration)
                box.deliver_ack(j, req.iteration)
            assert req.ready(box)
            return req.take(box)
        return None

    return answer


def kinds(effects):
    return [type(e).__name__ for e in effects]


def test_parallel_iteration_matches_fig4_and_fig7():
    spec = spec_for(iterations=2, max_ig=3)
    seen = drive(spec, everything_ready(spec))
    assert kinds(seen) == [
        "Start",
        "PublishFloor",
        "ReadFloors",
        "Send",
        "Compute",
        "Recv",
        "PublishFloor",
        "Reduce",
        "Apply",
        "Advance",
        "ReadFloors",
        "Send",
        "Compute",
        "Recv",
        "PublishFloor",
        "Reduce",
        "Apply",
        "Advance",
        "Finish",
    ]
    start, adv = seen[0], seen[9]
    assert start == fx.Start(put_to=(1, 2), count=3)  # max_ig tokens for every in-neighbour
    assert seen[1] == fx.PublishFloor(0)
    assert seen[6] == fx.PublishFloor(1)  # done with iteration 0 as soon as Recv(0) is
    assert adv == fx.Advance(0, 1, take_from=(1, 2), put_to=(1, 2))
    assert seen[-1] == fx.Finish(2)


def test_serial_approach_sends_after_apply():
    spec = spec_for(iterations=1, approach=Approach.SERIAL, max_ig=0, send_check=False)
    seen = drive(spec, everything_ready(spec))
    assert kinds(seen) == [
        "Start",
        "Compute",
        "Apply",
        "Send",
        "Recv",
        "Reduce",
        "Advance",
        "Finish",
    ]
    assert seen[-2] == fx.Advance(0, 1, take_from=(), put_to=())  # no token queues


def test_notify_ack_waits_for_acks_before_sending_and_acks_after_reduce():
    spec = spec_for(iterations=2, mode=Mode.NOTIFY_ACK, max_ig=0, send_check=False)
    seen = drive(spec, everything_ready(spec))
    assert kinds(seen) == [
        "Start",
        "Send",
        "Compute",
        "Recv",
        "Reduce",
        "SendAcks",
        "Apply",
        "Advance",
        "Recv",
        "Send",
        "Compute",
        "Recv",
        "Reduce",
        "SendAcks",
        "Apply",
        "Advance",
        "Finish",
    ]
    ack_wait = seen[8].requirement
    assert (type(ack_wait).__name__, ack_wait.iteration, ack_wait.sources) == (
        "AcksFrom",
        0,
        (1, 2),
    )
    assert seen[5] == fx.SendAcks(0, (1, 2))


def test_send_check_leaves_out_receivers_whose_floor_is_past():
    spec = spec_for(iterations=1, max_ig=3)
    base = everything_ready(spec)

    def answer(eff):
        if isinstance(eff, fx.ReadFloors):
            return {1: 0, 2: 1}  # worker 2 is done with iteration 0
        return base(eff)

    seen = drive(spec, answer)
    assert [e for e in seen if isinstance(e, fx.Send)] == [fx.Send(0, (1,))]


def test_straggler_renews_with_recv_k_minus_1_then_jumps():
    """Sec. 5: out-neighbours 4 ahead (token counts 4 + max_ig): Recv(0) as usual, then
    Recv(3) + Reduce, then one Advance 0 -> 4 that takes and puts 4 tokens."""
    spec = spec_for(
        iterations=10, mode=Mode.BACKUP, backup=1, max_ig=5, skip_max=10, skip_trigger=1
    )
    counts = {1: 9, 2: 9}
    seen = drive(spec, everything_ready(spec, counts))
    first = kinds(seen)[:15]
    assert first == [
        "Start",
        "PublishFloor",
        "ReadFloors",
        "Send",
        "Compute",
        "Recv",
        "PublishFloor",
        "Reduce",
        "Apply",
        "ReadTokenCounts",
        "Recv",
        "PublishFloor",
        "Reduce",
        "Advance",
        "ReadFloors",
    ]
    assert seen[10].requirement.iteration == 3
    assert seen[11] == fx.PublishFloor(4)
    assert seen[13] == fx.Advance(0, 4, take_from=(1, 2), put_to=(1, 2))
    assert seen[13].count == 4
    advances = [e for e in seen if isinstance(e, fx.Advance)]
    assert advances[-1].to == 10  # never past the last iteration
    assert seen[-1] == fx.Finish(10)


def test_a_jumpers_own_parameters_weigh_as_old_as_they_are():
    """Staleness, s = 4, jump 0 -> 4: the Reduce after Recv(3) weighs own parameters (of
    iteration 1) by eq. (2) as 1 - (3 - 4) + 1 = 3 against an update of iteration 3 with 5."""
    spec = spec_for(
        iterations=10, mode=Mode.STALENESS, staleness=4, max_ig=5, skip_max=10, skip_trigger=1
    )
    seen = drive(spec, everything_ready(spec, {1: 9, 2: 9}))
    jump_reduce = next(e for e in seen if isinstance(e, fx.Reduce) and e.iteration == 3)
    assert jump_reduce.self_weight == pytest.approx(3 / (3 + 5 + 5))


def resumed(spec, start):
    """``everything_ready`` for a worker resumed in ``start``: its mailbox from
    ``spec.new_mailbox(start)``, whose window begins at that iteration."""
    box = spec.new_mailbox(start)
    base = everything_ready(spec)

    def answer(eff):
        if isinstance(eff, fx.Recv):
            req = eff.requirement
            for j in spec.in_peers:
                if type(req).__name__ != "AcksFrom":  # every update lands in the window
                    assert box.deliver_update(j, req.iteration).name == "ACCEPTED"
                box.deliver_ack(j, req.iteration)
            assert req.ready(box)
            return req.take(box)
        return base(eff)

    return drive(spec, answer, start=start)


@pytest.mark.parametrize("mode", [Mode.STANDARD, Mode.NOTIFY_ACK, Mode.STALENESS])
def test_a_resumed_loop_starts_in_its_checkpoint_iteration(mode):
    """start=c: Start(at=c) with the usual max_ig tokens (every worker resumes at c, so the
    token invariant holds as at 0), the floor of c, Send(c) first (no ACK of c-1 awaited:
    those were exchanged before the checkpoint), and Advances c -> c+1 -> ... -> iterations."""
    spec = spec_for(iterations=8, max_ig=3, mode=mode)
    seen = resumed(spec, 5)
    assert seen[0] == fx.Start(put_to=(1, 2), count=3, at=5)
    assert seen[1] == fx.PublishFloor(spec.policy.floor(5))
    first_send = next(e for e in seen if isinstance(e, fx.Send))
    assert first_send.iteration == 5
    assert kinds(seen)[2:4] == ["ReadFloors", "Send"]  # nothing waited for before Send(5)
    advances = [(e.start, e.to) for e in seen if isinstance(e, fx.Advance)]
    assert advances == [(5, 6), (6, 7), (7, 8)]
    assert seen[-1] == fx.Finish(8)


def test_a_resumed_loop_at_the_end_only_finishes_and_a_start_out_of_range_is_refused():
    spec = spec_for(iterations=4, max_ig=3)
    assert kinds(resumed(spec, 4)) == ["Start", "PublishFloor", "Finish"]
    with pytest.raises(ValueError, match="start iteration 5"):
        next(worker_loop(spec, start=5))


def test_a_fresh_mailbox_of_a_resumed_worker_accepts_that_iterations_updates():
    """Without the resumed floor, an update of iteration c >= store_slots would overflow."""
    spec = spec_for(iterations=100, max_ig=3)
    c = 10 * spec.store_slots
    assert spec.new_mailbox().deliver_update(1, c).name == "OVERFLOW"
    assert spec.new_mailbox(c).deliver_update(1, c).name == "ACCEPTED"
    assert spec.new_mailbox(c).deliver_update(1, c - 1).name == "STALE"
