"""A WAGMA-SGD worker (``--mode wagma``): local step, then wait-avoiding group averaging, and a
blocking global average every ``--sync-period`` iterations.

How the wait-avoiding group all-reduce is done on hopbus's engine:

* After its local step a worker publishes its new model as its *send buffer* (one reference,
  swapped atomically), then claims its group's round in Redis (``SET NX`` on
  ``hop:{R}:group:T:G``). The first member to get there is the *activator*.
* The activator sends an activation to the other members. Each member's receiver thread, like
  the progress engine of the paper's fflib, answers at once with whatever its send buffer holds,
  whether or not its main thread has reached the round: a member that is behind contributes an
  older model *passively*, and nobody waits for it.
* The activator sums the models and sends the sum, with each member's step count, to the
  others. A member whose own contribution was current takes W_sum / S; one that contributed
  passively merges its new model too, (W_sum + W') / (S + 1) (Algorithm 2).
* Every tau-th iteration (and the last) is a blocking global average: recursive doubling over
  log2 P phases, so all workers end with the same model.

Groups, the sync schedule and the merge rule are in ``hopbus.baselines.wagma``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from hopbus.baselines.wagma import allreduce_partners, group_of, is_global, merge_divisor
from hopbus.errors import RunFailure
from hopbus.runtime.compute import Trainer
from hopbus.runtime.node import Node
from hopbus.transport import (
    KIND_ACTIVATE,
    KIND_CONTRIB,
    KIND_PHASE,
    KIND_SUM,
    Message,
    Outbox,
    Params,
    Validator,
    encode,
    layout_of,
)


def add(a: Params, b: Params) -> Params:
    """a + b, new arrays."""
    return {name: x + b[name] for name, x in a.items()}


class WagmaWorker(Node):
    """Worker ``node`` of a WAGMA-SGD run."""

    inline_inbox = False  # the receiver thread answers activations while this one computes

    def __init__(self, run: str, worker: int, redis_url: str, **kw: Any) -> None:
        super().__init__(run, worker, redis_url, **kw)
        self.counters = {
            "group_rounds": 0,
            "activations": 0,  # rounds this worker activated
            "passive_contributions": 0,  # older models in the sums this worker activated
            "stale_merges": 0,  # rounds this worker merged as (W_sum + W') / (S + 1)
            "answered": 0,  # activations its receiver thread answered
            "global_averages": 0,
        }
        self._buffer: tuple[int, Params] | None = None  # (local steps, model): the send buffer
        self._contribs: dict[int, dict[int, tuple[int, Params]]] = {}
        self._sums: dict[int, tuple[tuple[int, ...], Params]] = {}
        self._phases: dict[tuple[int, int], Params] = {}
        self.responder: Outbox | None = None
        self._responder_ready = threading.Event()  # peers may activate before it is connected

    def _setup(self) -> None:
        s = self.cfg.scheme_settings()
        self.size, self.period = s.group_size, s.sync_period
        n, me = self.topo.n, self.node
        self.trainer = Trainer(self.cfg, me, self.het)
        self._buffer = (0, self.trainer.params)
        others = [q for q in range(n) if q != me]
        validator = Validator(
            self.keys.run,
            n,
            update_from=(),
            ack_from=(),
            layout=layout_of(self.trainer.params),
            max_iteration=self.cfg.iterations,
            accept={k: others for k in (KIND_ACTIVATE, KIND_CONTRIB, KIND_SUM, KIND_PHASE)},
        )
        hwm = 2 * self.period + 8  # a peer is at most one sync period ahead: its sums, activations
        self._open(validator, self._deliver, hwm=hwm, peers=others, out_hwm=hwm)
        self.responder = self._outbox(others, hwm)  # the receiver thread's own sockets
        self._responder_ready.set()
        self._claim_ttl = max(60, int(4 * self.timeout))

    def _outboxes(self) -> list[Outbox]:
        return super()._outboxes() + ([self.responder] if self.responder is not None else [])

    # -- the receiver thread's side: answer activations at once, file everything else ------------
    def _deliver(self, msg: Message) -> None:
        if msg.kind == KIND_ACTIVATE:
            if not self._responder_ready.wait(self.timeout):
                raise RunFailure(
                    f"{self.who} could not connect to its peers to answer worker "
                    f"{msg.src}'s activation within {self.timeout:g} s"
                )
            assert self._buffer is not None and self.responder is not None
            steps, model = self._buffer  # whatever the main thread published last
            frames = encode(self.keys.run, self.node, msg.iteration, KIND_CONTRIB, model, tag=steps)
            self.send([msg.src], frames, self.responder)
            self.counters["answered"] += 1
            return
        assert msg.payload is not None
        with self.cond:
            if msg.kind == KIND_CONTRIB:
                self._contribs.setdefault(msg.iteration, {})[msg.src] = (msg.tag, msg.payload)
            elif msg.kind == KIND_SUM:
                self._sums[msg.iteration] = (msg.meta, msg.payload)
            else:
                self._phases[(msg.iteration, msg.tag)] = msg.payload
            self.cond.notify_all()

    # -- the main thread --------------------------------------------------------------------------
    def _global_average(self, t: int, model: Params) -> float:
        """Recursive doubling: after phase r, ``partial`` sums 2^(r+1) workers' models."""
        waited, partial = 0.0, model
        for r, q in enumerate(allreduce_partners(self.node, self.topo.n)):
            self.send([q], encode(self.keys.run, self.node, t, KIND_PHASE, partial, tag=r))
            with self.cond:
                waited += self.wait_for(
                    lambda r=r: (t, r) in self._phases,
                    lambda q=q: [q],
                    f"the global average of iteration {t}",
                )
                theirs = self._phases.pop((t, r))
            partial = add(partial, theirs)
        self.trainer.scale(partial, self.topo.n)
        self.counters["global_averages"] += 1
        return waited

    def _group_average(self, t: int, model: Params) -> float:
        me, c = self.node, self.counters
        group = group_of(me, t, self.topo.n, self.size)
        others = [q for q in group if q != me]
        c["group_rounds"] += 1
        assert self.r is not None
        claimed = self.r.set(self.keys.group(t, group[0]), me, nx=True, ex=self._claim_ttl)
        if claimed:  # the activator: nobody else has reached this round yet
            c["activations"] += 1
            self.send(others, encode(self.keys.run, me, t, KIND_ACTIVATE))
            with self.cond:
                waited = self.wait_for(
                    lambda: len(self._contribs.get(t, {})) == len(others),
                    lambda: [q for q in others if q not in self._contribs.get(t, {})],
                    f"the models of group round {t}",
                )
                got = self._contribs.pop(t)
            total, steps = model, []
            for q in group:
                if q == me:
                    steps.append(t + 1)
                    continue
                q_steps, q_model = got[q]
                steps.append(q_steps)
                total = add(total, q_model)
            c["passive_contributions"] += sum(s < t + 1 for s in steps)
            self.send(others, encode(self.keys.run, me, t, KIND_SUM, total, meta=steps))
            self.trainer.scale(total, self.size)
            return waited
        with self.cond:  # activated by another member: its sum holds us, current or older
            waited = self.wait_for(
                lambda: t in self._sums,
                lambda: others,
                f"the group sum of round {t}",
            )
            steps, total = self._sums.pop(t)
        current = steps[group.index(me)] == t + 1
        if not current:
            c["stale_merges"] += 1
            total = add(total, model)
        self.trainer.scale(total, merge_divisor(self.size, current))
        return waited

    def _drive(self) -> dict[str, Any]:
        t_, cfg = self.trainer, self.cfg
        self.control.start((), 0)
        self.control.event("start", endpoint=self.endpoint)
        cpu0 = time.process_time()
        compute_total = 0.0
        for t in range(cfg.iterations):
            compute_s, _ = t_.gradient(t)
            compute_total += compute_s
            t_.apply()  # W'_t: the local step
            model = t_.params
            self._buffer = (t + 1, model)
            if is_global(t, self.period, cfg.iterations):
                wait_s = self._global_average(t, model)
            elif self.size > 1:
                wait_s = self._group_average(t, model)
            else:  # S = 1: local SGD between global averages
                wait_s = 0.0
            self.faults.before_iteration(t + 1)
            fields = self.progress_fields(t, t + 1, compute_s, wait_s, ())
            self.control.try_advance(t, t + 1, {}, (), fields)
        return self.finish_worker(cfg.iterations, cpu0, compute_total)


__all__ = ["WagmaWorker", "add"]
