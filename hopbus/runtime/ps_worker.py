"""A worker of a parameter-server run (``--mode ps-*``): compute, push, wait for the reply.

Each iteration: the gradient at the parameters the server last sent, pushed tagged with their
version; then the server's reply, which carries the new parameters and the iteration to enter
(``hopbus.baselines.ps`` decides when to reply and with what). The counter change and its
progress entry are the same Lua call Hop's workers use (no tokens), so a PS run's progress
stream, gaps and summary read exactly like a Hop run's.
"""

from __future__ import annotations

import time
from typing import Any

from hopbus.runtime.compute import Trainer
from hopbus.runtime.node import Node
from hopbus.transport import KIND_GRAD, KIND_PARAMS, Message, Validator, encode, layout_of

REPLY_HWM = 4  # at most one reply is ever outstanding; slack for the one in flight


class PSWorker(Node):
    """Worker ``node`` of a parameter-server run."""

    def __init__(self, run: str, worker: int, redis_url: str, **kw: Any) -> None:
        super().__init__(run, worker, redis_url, **kw)
        self.counters = {"pushed": 0, "replies": 0}
        self._reply: Message | None = None

    def _setup(self) -> None:
        self.ps_id = self.topo.n
        self.trainer = Trainer(self.cfg, self.node, self.het)
        validator = Validator(
            self.keys.run,
            self.topo.n + 1,
            update_from=(),
            ack_from=(),
            layout=layout_of(self.trainer.params),
            max_iteration=self.cfg.iterations,
            accept={KIND_PARAMS: (self.ps_id,)},
        )
        self._open(validator, self._deliver, hwm=REPLY_HWM, peers=[self.ps_id], out_hwm=REPLY_HWM)

    def _deliver(self, msg: Message) -> None:
        with self.cond:
            self._reply = msg
            self.counters["replies"] += 1
            self.cond.notify_all()

    def _drive(self) -> dict[str, Any]:
        t, cfg, ps = self.trainer, self.cfg, self.ps_id
        assert ps is not None
        self.control.start((), 0)
        self.control.event("start", endpoint=self.endpoint)
        cpu0 = time.process_time()
        compute_total = 0.0
        k = version = 0
        while k < cfg.iterations:
            compute_s, _ = t.gradient(k)
            compute_total += compute_s
            self.send([ps], encode(self.keys.run, self.node, k, KIND_GRAD, t.grads, tag=version))
            self.counters["pushed"] += 1
            with self.cond:
                wait_s = self.wait_for(
                    lambda: self._reply is not None,
                    lambda: [ps],
                    f"parameters after iteration {k}",
                )
                reply, self._reply = self._reply, None
            assert reply is not None and reply.payload is not None
            t.params, version, nxt = reply.payload, reply.tag, reply.iteration
            self.faults.before_iteration(nxt)
            blocked = [ps] if wait_s > 0 else []
            fields = self.progress_fields(k, nxt, compute_s, wait_s, blocked)
            self.control.try_advance(k, nxt, {}, (), fields)
            k = nxt
        return self.finish_worker(k, cpu0, compute_total)
