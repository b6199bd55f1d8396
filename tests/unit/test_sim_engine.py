"""The simulator's own behaviour: what it sends, how it reports a stuck run.

Faults are injected by wrapping the worker loop (``Simulation(loop=...)``), never by editing
the protocol: ``never_sends(w)`` is worker w losing every update it sends.
"""

from collections.abc import Callable

from helpers import Schedule, complete3, simulate

from hopbus.modes import Mode
from hopbus.protocol.effects import Send
from hopbus.protocol.spec import ProtocolSettings, WorkerSpec
from hopbus.protocol.worker import Loop, worker_loop
from hopbus.sim import Simulation


def never_sends(victim: int) -> Callable[[WorkerSpec], Loop]:
    def loop(spec: WorkerSpec) -> Loop:
        gen, value = worker_loop(spec), None
        while True:
            try:
                eff = gen.send(value)
            except StopIteration:
                return
            if spec.worker == victim and isinstance(eff, Send):
                eff = Send(eff.iteration, ())
            value = yield eff

    return loop


def test_updates_a_receiver_would_only_drop_are_not_sent():
    """Worker 0 is 4x slower; with max_ig = 1 the others finish Recv(k) and then wait for
    worker 0's token. Their published floor is already k + 1, so worker 0's update of
    iteration k is left out instead of travelling only to be dropped (Sec. 6.2)."""
    slow0 = Schedule(lambda w, k: 4.0 if w == 0 else 1.0)
    common = {"mode": Mode.BACKUP, "backup": 1, "max_ig": 1, "iterations": 50, "latency": 0.05}
    _, checked = simulate(complete3(), schedule=slow0, **common)
    _, unchecked = simulate(complete3(), schedule=slow0, send_check=False, **common)
    assert unchecked.counters["stale_dropped"] > 0
    assert checked.counters["stale_dropped"] == 0
    assert checked.counters["sends_skipped"] == unchecked.counters["stale_dropped"]
    assert checked.stats.iterations == unchecked.stats.iterations == [50, 50, 50]


def test_a_deadlock_is_detected_and_says_who_waits_for_whom():
    settings = ProtocolSettings(mode=Mode.STANDARD, iterations=10, max_ig=2)
    r = Simulation(complete3(), settings, Schedule(), loop=never_sends(0)).run()
    assert r.deadlocked and not r.finished
    waiting = {b.worker: (b.waiting_for, b.on) for b in r.blocked}
    assert waiting[1] == ("updates", (0,))
    assert waiting[2] == ("updates", (0,))


def test_backup_workers_ride_out_a_worker_whose_updates_are_lost_until_tokens_run_out():
    """Backup workers do not need worker 0's updates, but the token queues still tie them
    to it (Sec. 4.3): the run finishes, since worker 0 itself still receives and advances."""
    settings = ProtocolSettings(mode=Mode.BACKUP, backup=1, iterations=10, max_ig=2)
    r = Simulation(complete3(), settings, Schedule(), loop=never_sends(0)).run()
    assert r.finished
