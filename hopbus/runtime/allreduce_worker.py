"""A worker of the ring all-reduce baseline (``--mode allreduce``): synchronous data-parallel SGD
as Horovod and PyTorch DDP run it, on hopbus's models, data, emulated compute and --slowdown.

Each iteration: the gradient on this worker's minibatch (``Trainer.gradient``, the same
emulated compute time as every mode), packed into one flat tensor, summed over the workers by
``torch.distributed.all_reduce`` (gloo), divided by the number of workers, and applied with the
run's optimizer (``Trainer.step``, as a parameter server applies its mean). Every worker takes
the same step from the same start, so all hold the same model, as in ps-bsp, and none can enter
iteration k + 2 before every gradient of k + 1 is in the sum: the gap bound is 1.

The collective: gloo's ``allreduce`` for a dense CPU tensor is its ring algorithm, in its
chunked, pipelined form. torch's ``ProcessGroupGloo`` hands a CPU strided tensor to
``AsyncAllreduceWork``, which calls ``gloo::allreduce(opts)`` without choosing an algorithm
(torch/csrc/distributed/c10d/ProcessGroupGlooDetail.hpp in torch 2.13), and gloo runs
``ring()`` for an unspecified algorithm (third_party/gloo/gloo/allreduce.cc): the buffer is cut
into one chunk per rank, each chunk into at least two segments so that one is on the wire
while the other is reduced; a reduce-scatter around the ring, then an all-gather. Each worker
sends and receives about 2 (n - 1) / n of the buffer per call, in 2 (n - 1) steps, and every
step waits for the ring neighbour, so the slowest worker's compute sets everyone's pace.

Rendezvous without new ports in the config: worker 0 starts torch's ``TCPStore`` on the port
of its ``--bind`` (a free one for ``*``) and registers it in ``hop:{R}:addr`` as the other
nodes register their inbox; the others register ``gloo`` (they bind nothing), wait for every
worker's registration, connect to the store, and form the gloo process group. The heartbeat,
the progress entries (one Lua call per iteration, ``wait_s`` = seconds in the all-reduce), the
final report and the clean close are Node's, as for every worker.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, NoReturn
from urllib.parse import urlsplit

from hopbus.baselines.allreduce import FlatLayout
from hopbus.coord import read
from hopbus.errors import ConfigError, RunFailure
from hopbus.heterogeneity import ring_allreduce_s
from hopbus.runtime.compute import Trainer
from hopbus.runtime.node import LOOK_S, Node, advertised, names

NO_INBOX = "gloo"  # what workers other than 0 register: peers reach them through the group
WILDCARDS = ("*", "0.0.0.0", "::", "")


def store_address(bind: str) -> tuple[str, int]:
    """(host, port) for worker 0's TCPStore from ``--bind``: port ``*`` = any free port."""
    parts = urlsplit(bind)
    host, _, port = parts.netloc.rpartition(":")
    host = host.strip("[]")
    if (
        parts.scheme != "tcp"
        or not port
        or (port != "*" and not (port.isascii() and port.isdigit()))
    ):
        raise ConfigError(
            f"--bind {bind!r}: --mode allreduce needs tcp://HOST:PORT (or port *) for worker "
            "0's rendezvous store"
        )
    return host, 0 if port == "*" else int(port)


def _first_line(exc: BaseException) -> str:
    """gloo's message without its source location, on one line."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text.split("] ", 1)[1] if text.startswith("[") and "] " in text else text


class AllReduceWorker(Node):
    """Worker ``node`` of a ring all-reduce run."""

    def __init__(self, run: str, worker: int, redis_url: str, **kw: Any) -> None:
        super().__init__(run, worker, redis_url, **kw)
        self.counters = {"allreduces": 0, "allreduce_bytes": 0, "allreduce_us": 0}
        self._dist: Any = None  # torch.distributed, imported in _setup (the bench extra)
        self._store: Any = None  # worker 0 serves the rendezvous: kept while the group lives
        self._grouped = False

    # -- joining ----------------------------------------------------------------------------------
    def _setup(self) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # sixteen workers may share two cores
        self._dist = dist
        n, me = self.topo.n, self.node
        self._others = [j for j in range(n) if j != me]
        self.trainer = Trainer(self.cfg, me, self.het)
        self.layout = FlatLayout.of(self.trainer.params)
        self.buf = self.layout.buffer()
        self.flat = torch.from_numpy(self.buf)  # the same memory: the sum lands in self.buf
        self.counters["allreduce_bytes"] = self.layout.nbytes
        timeout = timedelta(seconds=self.timeout)
        store = self._start_store(timeout) if me == 0 else None
        if store is None:
            self._announce(NO_INBOX)
        found = self._wait_endpoints(self._others)  # everyone is up: names whoever is not
        try:
            if store is None:
                at = urlsplit(found[0])
                store = dist.TCPStore(at.hostname, at.port, is_master=False, timeout=timeout)
            dist.init_process_group("gloo", store=store, rank=me, world_size=n, timeout=timeout)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise RunFailure(
                f"{self.who} could not form the gloo group of {n} workers through worker 0's "
                f"store at {found.get(0, self.endpoint)} within {self.timeout:g} s: "
                f"{_first_line(exc)}"
            ) from None
        self._store = store
        self._grouped = True

    def _start_store(self, timeout: timedelta) -> Any:
        """Worker 0: torch's TCPStore on the --bind port, registered as this node's endpoint.
        (TCPStore takes no listen address: it listens on every interface.)"""
        host, port = store_address(self.bind)
        try:
            store = self._dist.TCPStore(
                "127.0.0.1" if host in WILDCARDS else host,
                port,
                is_master=True,
                wait_for_workers=False,
                timeout=timeout,
            )
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(f"--bind {self.bind!r}: {_first_line(exc)}") from None
        bound = f"tcp://{'0.0.0.0' if host in WILDCARDS else host}:{store.port}"
        self._announce(advertised(bound, self.advertise))
        return store

    # -- training ---------------------------------------------------------------------------------
    def _all_reduce(self, k: int) -> float:
        """Sum ``self.flat`` over the workers in place; returns seconds it took. Waits like
        every node: the heartbeats of the others and the timeout are checked while gloo works."""
        dist, what = self._dist, f"the all-reduce of iteration {k}"
        t0 = time.perf_counter()
        work = dist.all_reduce(self.flat, op=dist.ReduceOp.SUM, async_op=True)
        fut = work.get_future()
        fut.add_done_callback(self._wake)
        with self.cond:
            self.wait_for(fut.done, lambda: self._behind(k) or self._others, what)
        try:
            work.wait()
        except RuntimeError as exc:
            self._failed(k, what, exc, time.perf_counter() - t0)
        spent = time.perf_counter() - t0
        self.counters["allreduces"] += 1
        self.counters["allreduce_us"] += round(spent * 1e6)
        return spent

    def _links(self, k: int) -> float:
        """The emulated links' share of iteration k's all-reduce (``--slowdown machines:`` or
        ``link:``), slept after gloo's real transfer: the same on every worker. The bytes are
        the gradient buffer's, or ``--message-bytes``. Returns the seconds slept."""
        nbytes = self.cfg.message_bytes or self.layout.nbytes
        hold = ring_allreduce_s(self.het, self.topo.n, k, nbytes, self.cfg.slowdown_scope)
        if hold > 0:
            time.sleep(hold)  # emulated link time, not a synchronization
        return hold

    def _wake(self, _: Any) -> None:
        with self.cond:
            self.cond.notify_all()

    def _behind(self, k: int) -> list[int]:
        """Workers that have not even entered iteration k (their counters say so): the ones an
        all-reduce of k waits for, when any is that late; a ring cannot tell otherwise."""
        assert self.r is not None
        iters = self.r.mget([self.keys.iter(j) for j in self._others])
        # a counter that is no count (garbled, forged) shows no entry into k either
        entered = [read.integer(v) for v in iters]
        return [j for j, e in zip(self._others, entered, strict=True) if e is None or e < k]

    def _failed(self, k: int, what: str, exc: RuntimeError, after: float) -> NoReturn:
        """A collective that failed early means a peer left: a crash resets the ring at once,
        before its heartbeat expires, so give the heartbeats their TTL to name who it was."""
        if after < self.timeout:
            deadline = time.monotonic() + self.heartbeat_s + 2 * LOOK_S
            while time.monotonic() < deadline:
                self._check_threads()
                self._check_alive(self._others, what)  # raises, naming the dead
                time.sleep(LOOK_S)  # the heartbeat keys expire on Redis's clock
        late = self._behind(k)
        before = f" before {names(late)} entered iteration {k}" if late else ""
        raise RunFailure(f"{self.who}: {what} failed{before}: {_first_line(exc)}")

    def _drive(self) -> dict[str, Any]:
        t, cfg, layout = self.trainer, self.cfg, self.layout
        self.control.start((), 0)
        self.control.event("start", endpoint=self.endpoint)
        cpu0 = time.process_time()
        compute_total = 0.0
        mean = self.buf.dtype.type(1.0 / self.topo.n)
        for k in range(cfg.iterations):
            compute_s, _ = t.gradient(k)
            compute_total += compute_s
            layout.pack(t.grads, self.buf)
            wait_s = self._all_reduce(k) + self._links(k)
            self.buf *= mean  # the sum -> the mean gradient
            t.step(layout.views(self.buf))  # reads the views, keeps none
            self.faults.before_iteration(k + 1)
            fields = self.progress_fields(k, k + 1, compute_s, wait_s, ())
            self.control.try_advance(k, k + 1, {}, (), fields)
        return self.finish_worker(cfg.iterations, cpu0, compute_total)

    def close(self) -> None:
        """Leave the gloo group (on failure paths too), then what every node closes. A
        collective still in flight holds this until gloo's timeout, the run's --timeout."""
        if self._grouped:
            self._grouped = False
            self._dist.destroy_process_group()
        super().close()


__all__ = ["AllReduceWorker", "store_address"]
