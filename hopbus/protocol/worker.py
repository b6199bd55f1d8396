"""The worker loop of Hop, once, as a generator of effects (sans-IO).

Figures 4, 7, 8 and 9 of the paper, notify-ack (Sec. 3.3), skipping iterations (Sec. 5) and
the send-side check (Sec. 6.2) are all this one loop; the mode only changes what Recv waits for
and how Reduce weighs (``Policy``). The loop never sleeps, reads a clock or touches a socket: it
yields an effect and gets the result sent back. Drive it with::

    gen = worker_loop(spec)
    effect = next(gen)
    while True:
        result = perform(effect)      # the driver's business: simulate, or do real I/O
        effect = gen.send(result)     # StopIteration after Finish
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from hopbus.modes import Approach, Mode
from hopbus.protocol.effects import (
    Advance,
    Apply,
    Compute,
    Effect,
    Finish,
    PublishFloor,
    ReadFloors,
    ReadTokenCounts,
    Recv,
    Reduce,
    Send,
    SendAcks,
    Start,
)
from hopbus.protocol.skipping import jump_length, lag_behind
from hopbus.protocol.spec import WorkerSpec

Loop = Generator[Effect, Any, None]


def worker_loop(spec: WorkerSpec, start: int = 0) -> Loop:
    """Worker ``spec.worker``'s whole run, from Start to Finish.

    ``start`` > 0 resumes a run from a checkpoint set: every worker of the run starts in that
    same iteration with the parameters it had on entering it (hopbus/runtime/checkpoint.py),
    and the driver's mailbox must come from ``spec.new_mailbox(start)``."""
    s = spec.settings
    policy = spec.policy
    ins, outs = spec.in_peers, spec.out_peers
    tokens = s.max_ig > 0
    take_from = outs if tokens else ()
    put_to = ins if tokens else ()
    acks = s.mode is Mode.NOTIFY_ACK
    parallel = s.approach is Approach.PARALLEL
    total = s.iterations
    if not 0 <= start <= total:
        raise ValueError(f"start iteration {start} is not in 0..{total}")

    def send(k: int) -> Loop:
        if acks and k > start:  # Sec. 3.3: no Send(k) before ACK(k-1) from every out-neighbour
            yield Recv(policy.acks_requirement(k - 1, outs))
        targets = outs
        if s.send_check:  # Sec. 6.2: leave out receivers that would only drop this update
            floors = yield ReadFloors(outs)
            targets = tuple(j for j in outs if k >= floors[j])
        yield Send(k, targets)

    def recv_reduce(k: int, own_iteration: int) -> Loop:
        req = policy.requirement(k)
        got = yield Recv(req)
        if s.send_check:
            yield PublishFloor(req.next_floor)
        own, terms = policy.reduction(k, got, own_iteration)
        yield Reduce(k, own, terms)
        if acks:
            yield SendAcks(k, ins)

    yield Start(put_to, s.max_ig if tokens else 0, at=start)
    if s.send_check:
        yield PublishFloor(policy.floor(start))
    k = start
    while k < total:
        if parallel:  # Fig. 2(b), Fig. 4: Send(x_k) || Compute(x_k); Recv; Reduce; Apply
            yield from send(k)
            yield Compute(k)
            yield from recv_reduce(k, k)
            yield Apply(k)
        else:  # Fig. 2(a): Compute; Apply; Send; Recv; Reduce
            yield Compute(k)
            yield Apply(k)
            yield from send(k)
            yield from recv_reduce(k, k)
        step = 1
        if s.skipping:
            counts = yield ReadTokenCounts(outs)
            step = jump_length(
                lag_behind(counts.values(), s.max_ig),
                skip_max=s.skip_max,
                trigger=s.skip_trigger,
                max_ig=s.max_ig,
                remaining=total - k,
            )
            if step > 1:  # Sec. 5: renew parameters with Recv(k'-1) + Reduce, then jump to k'
                yield from recv_reduce(k + step - 1, k + 1)  # own parameters: x_{k+1}
        yield Advance(k, k + step, take_from, put_to)
        k += step
    yield Finish(k)
