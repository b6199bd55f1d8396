"""The parameter server process (``hopbus ps``): holds the parameters, applies gradients,
answers workers, as ``hopbus.baselines.ps`` decides.

It is node N of a run of N workers (its endpoint, heartbeat and result use id N). The receiver
thread timestamps every push as it arrives (ElasticBSP predicts from these times); the main
thread hands pushes to the scheme's core in arrival order and does what each decision says:
keep the gradient, apply the mean of the kept ones (one optimizer step, momentum and weight
decay included, as a single worker would), send the new parameters to the released workers.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

from hopbus.baselines.ps import Core, make_core
from hopbus.errors import ConfigError
from hopbus.modes import Family
from hopbus.runtime.compute import Trainer
from hopbus.runtime.node import Node
from hopbus.runtime.reported import scored
from hopbus.transport import KIND_GRAD, KIND_PARAMS, Message, Params, Validator, encode, layout_of

PUSH_HWM = 4  # a worker never has more than one push outstanding


def mean_of(grads: list[Params]) -> Params:
    """The element-wise mean of several gradients (new arrays)."""
    inv = np.float32(1.0 / len(grads))
    out: Params = {}
    for name in grads[0]:
        acc = grads[0][name].astype(np.float32, copy=True)
        for g in grads[1:]:
            acc += g[name]
        out[name] = acc * inv
    return out


class ParameterServer(Node):
    """The parameter server of run ``run``."""

    def __init__(self, run: str, redis_url: str, **kw: Any) -> None:
        super().__init__(run, -1, redis_url, **kw)  # its id is N, known once the config is read
        self.counters = {"pushes": 0, "protocol_errors": 0}
        self._pushes: deque[tuple[Message, float]] = deque()

    @property
    def who(self) -> str:
        return "the parameter server"

    def _place(self) -> None:
        if self.cfg.mode.family is not Family.PS:
            raise ConfigError(
                f"run {self.keys.run} runs --mode {self.cfg.mode}, which has no parameter server"
            )
        self.node = self.ps_id = self.topo.n

    def _setup(self) -> None:
        n = self.topo.n
        self.trainer = Trainer(self.cfg, 0, self.het)  # same initial parameters as the workers
        self.core: Core = make_core(self.cfg.scheme_settings())
        validator = Validator(
            self.keys.run,
            n + 1,
            update_from=(),
            ack_from=(),
            layout=layout_of(self.trainer.params),
            max_iteration=self.cfg.iterations,
            accept={KIND_GRAD: range(n)},
        )
        self._open(validator, self._deliver, hwm=PUSH_HWM, peers=list(range(n)), out_hwm=PUSH_HWM)

    def _deliver(self, msg: Message) -> None:
        now = time.monotonic()  # "the PS timestamps pushes" (ElasticBSP)
        with self.cond:
            self._pushes.append((msg, now))
            self.cond.notify_all()

    def _unfinished(self) -> list[int]:
        return [w for w in range(self.topo.n) if w not in self.core.finished]

    def _drive(self) -> dict[str, Any]:
        t, core = self.trainer, self.core
        self.control.event("start", endpoint=self.endpoint, role="ps")
        cpu0 = time.process_time()
        kept: dict[int, Params] = {}
        version = 0
        while not core.done:
            with self.cond:
                self.wait_for(lambda: bool(self._pushes), self._unfinished, "gradients")
                batch = list(self._pushes)
                self._pushes.clear()
            for msg, at in batch:
                self.counters["pushes"] += 1
                try:
                    d = core.push(msg.src, msg.iteration, msg.tag, at)
                except ValueError:  # a push the scheme cannot have produced: drop, count
                    self.counters["protocol_errors"] += 1
                    continue
                if d.accept:
                    assert msg.payload is not None
                    kept[msg.src] = msg.payload
                if d.apply:
                    t.step(mean_of([kept.pop(w) for w in d.apply]))
                    version += 1
                to_by_iter: dict[int, list[int]] = {}
                for w, it in d.release:
                    to_by_iter.setdefault(it, []).append(w)
                for it, to in to_by_iter.items():  # one encoding, shared zero-copy
                    run, me = self.keys.run, self.node
                    self.send(to, encode(run, me, it, KIND_PARAMS, t.params, tag=version))
        loss, acc = scored(t.evaluate(full=True))
        result = {
            "role": "ps",
            "versions": version,
            "final_loss": loss,
            "final_accuracy": acc,
            "t": time.time(),
            "cpu_s": time.process_time() - cpu0,
            **core.counters.report(),
            **self.stats(),
        }
        self.publish_result(result, versions=version, final_accuracy=acc)
        return result
