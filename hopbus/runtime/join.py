"""Which process ``hopbus worker`` becomes: the run's mode (recorded in Redis) decides."""

from __future__ import annotations

from typing import Any

from hopbus.coord.client import connect
from hopbus.coord.keys import RunKeys
from hopbus.modes import Family
from hopbus.runtime.node import Node, read_run_config, redis_failures


def worker_for(run: str, worker: int, redis_url: str, **kw: Any) -> Node:
    """Worker ``worker`` of run ``run``, of the class its mode runs: a Hop worker, a
    parameter-server worker, a WAGMA worker or an all-reduce worker. Raises UserError as
    ``Node.run_loop`` does."""
    from hopbus.config import TrainConfig
    from hopbus.runtime.allreduce_worker import AllReduceWorker
    from hopbus.runtime.ps_worker import PSWorker
    from hopbus.runtime.wagma_worker import WagmaWorker
    from hopbus.runtime.worker import Worker

    keys = RunKeys(run)
    timeout = kw.get("timeout") or TrainConfig.model_fields["timeout"].default
    with redis_failures(f"worker {worker}", run):
        client = connect(redis_url, timeout=timeout)
        cfg, _ = read_run_config(client, keys, timeout)
    cls: type[Node] = {
        Family.HOP: Worker,
        Family.PS: PSWorker,
        Family.WAGMA: WagmaWorker,
        Family.ALLREDUCE: AllReduceWorker,
    }[cfg.mode.family]
    return cls(run, worker, redis_url, client=client, **kw)
