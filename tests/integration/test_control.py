"""The control plane's rules for a worker declared dead, against a real redis-server: it can
neither enter an iteration nor keep its heartbeat, unless it is a replacement still joining."""

from __future__ import annotations

import os
import uuid

import pytest
import redis

from hopbus.coord import read
from hopbus.coord.control import Heartbeat, RunControl
from hopbus.coord.keys import RunKeys
from hopbus.errors import DeclaredDead


@pytest.fixture
def run(redis_client) -> tuple[RunKeys, RunControl, RunControl]:
    """Workers 0 and 1 of a fresh run, 0 declared dead by 1 while its counter is at 3."""
    keys = RunKeys(f"ctl{os.getpid()}-{uuid.uuid4().hex[:12]}")
    zero, one = RunControl(redis_client, keys, 0), RunControl(redis_client, keys, 1)
    zero.start(put_to=[1], count=2, at=3)
    one.start(put_to=[0], count=2, at=3)
    assert one.declare_dead(0)  # no heartbeat: dead at once
    return keys, zero, one


def test_a_dead_worker_cannot_enter_an_iteration(redis_client, run):
    keys, zero, one = run
    before = redis_client.xlen(keys.progress)
    with pytest.raises(DeclaredDead, match=f"worker 0 of run {keys.run} was declared dead"):
        zero.try_advance(3, 4, {1: 1}, [1], {"loss": 1.0})
    assert redis_client.get(keys.iter(0)) == b"3"
    assert redis_client.llen(keys.tok(1, 0)) == 2  # nothing taken
    assert redis_client.xlen(keys.progress) == before  # nothing written
    owner, dead = one.try_advance(3, 4, {0: 1}, [0], {"loss": 1.0})  # a live one goes on
    assert owner is None and dead == {0}


def test_a_dead_workers_heartbeat_does_not_come_back(redis_client, run):
    keys, zero, _ = run
    hb = Heartbeat(zero, 1.0)
    hb.beat()
    assert hb.declared_dead and not redis_client.exists(keys.hb(0))


def test_a_replacement_beats_while_still_dead_and_joining(redis_client, run):
    keys, _, _ = run
    rep = RunControl(redis_client, keys, 0)
    assert rep.begin_rejoin("tcp://127.0.0.1:1", 1000) is None
    hb = Heartbeat(rep, 1.0)
    hb.may_be_dead = True
    hb.beat()
    assert not hb.declared_dead and redis_client.exists(keys.hb(0))
    assert 0 < redis_client.pttl(keys.hb(0)) <= 1000
    redis_client.srem(keys.joining, 0)  # what an Advance does once its heartbeat lapsed
    hb.beat()
    assert hb.declared_dead


def test_a_live_worker_beats_and_hears_the_stop(redis_client, run):
    keys, _, one = run
    hb = Heartbeat(one, 2.0)
    hb.beat()
    assert not hb.declared_dead and hb.stopped is None
    assert 1000 < redis_client.pttl(keys.hb(1)) <= 2000
    one.stop_run("worker 0 died")
    hb.beat()
    assert hb.stopped == "worker 0 died"


def test_an_empty_stop_key_stops_the_run_too(redis_client, run):
    """Fault ``empty_stop``: ``SET hop:{R}:stop ""`` stops every worker as any stop does (the
    launcher and watch took it for a stop while the workers went on), with a word for the
    reason; so does one of control characters only."""
    keys, zero, _ = run
    hb = Heartbeat(zero, 2.0)
    for value in ("", "\x1b\x07"):
        redis_client.set(keys.stop, value)
        hb.beat()
        assert hb.stopped == "stopped (no readable reason given)"
        assert zero.stop_run("worker 1 died") == hb.stopped  # the first stop stays


def test_a_stop_key_of_another_type_is_a_refusal_not_an_outage(redis_client, run):
    """Fault ``stop_key_wrong_type``: ``HSET hop:{R}:stop a b``. Every beat is refused; the
    heartbeat says so at once instead of riding it out as a lost Redis for its patience (the
    workers trained on, their heartbeats expired, until --timeout), and the line the worker
    gives quotes Redis's reason, not the Lua source."""
    keys, zero, _ = run
    hb = Heartbeat(zero, 0.3, patience_s=600.0)
    hb.beat()
    redis_client.hset(keys.stop, "a", "b")
    hb._thread.start()
    hb._thread.join(timeout=30)  # it ends on the refusal, long before its patience
    assert not hb._thread.is_alive() and isinstance(hb.error, redis.ResponseError)
    assert (
        read.refusal(hb.error)
        == "WRONGTYPE Operation against a key holding the wrong kind of value"
    )


def _replace(redis_client, keys: RunKeys, worker: int) -> RunControl:
    """A replacement for dead ``worker``, joined and committed at its neighbours' iteration."""
    rep = RunControl(redis_client, keys, worker)
    assert rep.begin_rejoin("tcp://127.0.0.1:1", 1000) is None
    assert rep.incarnation == 1
    assert rep.commit_rejoin(3, [1], [1], max_ig=2, workers=2) is None
    return rep


@pytest.mark.parametrize("counter", [b"10000000", b"1e3", b"x"])
def test_a_forged_counter_rebuilds_no_queue(redis_client, run, counter):
    """Fault ``forged_counter_at_rejoin``: an out-neighbour's counter far ahead (rebuilding
    its queue meant that many tokens in one script: Redis frozen for every client, or the
    script's own error), or no count.
    The commit is refused, naming the neighbour, and nothing is rebuilt."""
    keys, _, _ = run
    rep = RunControl(redis_client, keys, 0)
    assert rep.begin_rejoin("tcp://127.0.0.1:1", 1000) is None
    redis_client.set(keys.iter(1), counter)
    queues = [
        redis_client.lrange(keys.tok(1, 0), 0, -1),
        redis_client.lrange(keys.tok(0, 1), 0, -1),
    ]
    # as an out-neighbour only: as an in-neighbour far ahead, its queue would be negative
    why = rep.commit_rejoin(3, [], [1], max_ig=2, workers=2)
    assert why is not None and why.startswith("worker 1"), why
    assert queues == [redis_client.lrange(keys.tok(1, 0), 0, -1),
                      redis_client.lrange(keys.tok(0, 1), 0, -1)]  # fmt: skip
    assert redis_client.sismember(keys.dead, 0)


def test_the_process_a_replacement_outdated_can_neither_advance_nor_beat(redis_client, run):
    keys, zero, _ = run
    rep = _replace(redis_client, keys, 0)
    assert not redis_client.sismember(keys.dead, 0)  # out of the dead set: only the
    with pytest.raises(DeclaredDead):  # incarnation tells the old process apart
        zero.try_advance(3, 4, {1: 1}, [1], {"loss": 1.0})
    old = Heartbeat(zero, 1.0)
    old.beat()
    assert old.declared_dead
    assert zero.standing() == (True, False) and rep.standing() == (True, True)
    assert rep.try_advance(3, 4, {1: 1}, [1], {"loss": 1.0}) == (None, frozenset())
    new = Heartbeat(rep, 1.0)
    new.beat()
    assert not new.declared_dead


def test_an_outdated_joiner_cannot_commit_nor_undo_the_next_one(redis_client, run):
    keys, _, _ = run
    first = RunControl(redis_client, keys, 0)
    assert first.begin_rejoin("tcp://127.0.0.1:1", 1000) is None
    redis_client.delete(keys.hb(0))  # its heartbeat lapsed
    second = RunControl(redis_client, keys, 0)
    assert second.begin_rejoin("tcp://127.0.0.1:2", 1000) is None
    assert second.incarnation == 2
    assert (
        first.commit_rejoin(3, [1], [1], max_ig=2, workers=2)
        == "another replacement took its place"
    )
    first.abort_rejoin()
    assert redis_client.sismember(keys.joining, 0) and redis_client.exists(keys.hb(0))
    hb = Heartbeat(first, 1.0)
    hb.may_be_dead = True
    hb.beat()
    assert hb.declared_dead
    assert second.commit_rejoin(3, [1], [1], max_ig=2, workers=2) is None


def test_a_restore_after_a_rejoin_keeps_the_replacement_alive(redis_client, run):
    """Redis restarted empty after a replacement came in: a survivor whose last view still
    had worker 0 dead must not put it back in the dead set once 0 is back, in either order."""
    keys, _, one = run
    rep = _replace(redis_client, keys, 0)
    for first, second in ((rep, one), (one, rep)):
        for key in (keys.dead, keys.incarnation, keys.iter(0), keys.iter(1), keys.hb(0)):
            redis_client.delete(key)  # what a restart without persistence loses
        for ctl in (first, second):
            dead = [0] if ctl is one else []
            ctl.restore(3, heartbeat_ms=1000, endpoint="tcp://x:1", config="{}", dead=dead)
        assert redis_client.hget(keys.incarnation, 0) == b"1"
        assert not redis_client.sismember(keys.dead, 0)  # (one, rep): 0 took itself out


@pytest.mark.parametrize("woke", [False, True])
def test_a_restore_puts_back_a_dead_worker_that_was_not_replaced(redis_client, run, woke):
    """Even if, frozen and declared dead, it woke during the restart and restored first."""
    keys, zero, one = run
    for key in (keys.dead, keys.iter(0), keys.iter(1), keys.hb(0)):
        redis_client.delete(key)
    if woke:
        zero.restore(3, heartbeat_ms=1000, endpoint="tcp://x:0", config="{}", dead=[])
    one.restore(3, heartbeat_ms=1000, endpoint="tcp://x:1", config="{}", dead=[0])
    assert redis_client.sismember(keys.dead, 0)
    assert zero.standing()[1] is False  # dead again: it leaves at its next look


def test_a_dead_worker_publishes_no_result(redis_client, run):
    keys, zero, one = run
    with pytest.raises(DeclaredDead):
        zero.publish_result({"iterations": 3}, "finished")
    assert not redis_client.hexists(keys.result, 0) and not redis_client.exists(keys.hb(0))
    one.publish_result({"iterations": 3}, "finished")
    assert redis_client.get(keys.hb(1)) == b"finished" and redis_client.pttl(keys.hb(1)) == -1
    assert redis_client.hexists(keys.result, 1)


def test_without_its_counter_a_heartbeat_judges_nothing(redis_client, run):
    """A restarted Redis a survivor has restored into first (dead set back, this worker's
    counter not yet): a lost broker, not a death."""
    keys, zero, _ = run
    redis_client.delete(keys.iter(0))
    hb = Heartbeat(zero, 1.0)
    hb.beat()
    assert not hb.declared_dead and redis_client.exists(keys.hb(0))


# -- the Advance's pinned connection (coord.client.PinnedScript) -----------------------------------
def _advance_once(control: RunControl, k: int) -> None:
    owner, dead = control.try_advance(k, k + 1, {}, [], {"loss": 1.0})
    assert owner is None and dead == set()


@pytest.fixture
def alone(redis_client) -> tuple[RunKeys, RunControl]:
    """Worker 0 of a fresh one-worker run: every Advance goes through at once."""
    keys = RunKeys(f"pin{os.getpid()}-{uuid.uuid4().hex[:12]}")
    control = RunControl(redis_client, keys, 0)
    control.start(put_to=[], count=0, at=0)
    return keys, control


def test_the_advance_survives_redis_forgetting_its_script(redis_client, alone):
    keys, control = alone
    _advance_once(control, 0)  # loads the script and pins a connection
    redis_client.script_flush()  # as after a restart: EVALSHA now meets NOSCRIPT
    _advance_once(control, 1)
    _advance_once(control, 2)
    assert redis_client.get(keys.iter(0)) == b"3"


def test_an_advance_after_a_flush_sends_the_script_itself(redis_client, alone):
    """Fault ``script_flush`` every call (as from a client flushing every 20 ms): the
    fallback is EVAL of the source, which no flush can land inside, not a SCRIPT LOAD and
    another EVALSHA that one could."""
    keys, control = alone

    def calls(name: str) -> int:
        return redis_client.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0)

    _advance_once(control, 0)
    evals, loads = calls("eval"), calls("script|load")
    for k in range(1, 6):
        redis_client.script_flush()
        _advance_once(control, k)
    assert redis_client.get(keys.iter(0)) == b"6"
    assert calls("eval") - evals == 5 and calls("script|load") == loads


def test_every_script_call_survives_a_flush_before_it(redis_client, alone):
    """Fault ``script_flush`` before each call of the other scripts: a direct one falls back
    to EVAL, and the heartbeat's pipeline queues EVAL (its SCRIPT LOAD and EVALSHA were two
    round trips a flush could fall between)."""
    keys, control = alone
    hb = Heartbeat(control, 5.0)

    def evalshas() -> int:
        return redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)

    for _ in range(3):
        redis_client.script_flush()
        before = evalshas()
        hb.beat()
        assert evalshas() == before  # nothing in the pipeline that a flush could fail
        assert redis_client.exists(keys.hb(0))
        redis_client.script_flush()
        counter, current = control.standing()  # EVALSHA meets NOSCRIPT, EVAL answers
        assert counter and current


def test_a_killed_advance_connection_fails_once_then_reconnects(redis_client, alone):
    keys, control = alone
    _advance_once(control, 0)
    name = f"pinned-{uuid.uuid4().hex[:8]}"
    control._advance._conn.send_command("CLIENT", "SETNAME", name)
    assert control._advance._conn.read_response() == b"OK"
    victims = [c["id"] for c in redis_client.client_list() if c.get("name") == name]
    assert len(victims) == 1
    redis_client.client_kill_filter(_id=victims[0])
    with pytest.raises(redis.ConnectionError):  # said, not retried blindly: the caller checks
        _advance_once(control, 1)
    assert redis_client.get(keys.iter(0)) == b"1"  # that Advance did not go through
    _advance_once(control, 1)  # the next call connects again
    assert redis_client.get(keys.iter(0)) == b"2"


def test_a_heartbeat_whose_thread_fails_says_so_instead_of_going_quiet(redis_client):
    """Fault ``stats_raise``: the counters the heartbeat writes fail with a bug's exception.
    The thread ended silently, and the neighbours declared the live worker dead; now it
    leaves the error for the worker's next look, which fails with one line."""
    keys = RunKeys(f"hbf{os.getpid()}-{uuid.uuid4().hex[:12]}")
    control = RunControl(redis_client, keys, 0)
    control.start(put_to=[], count=0, at=0)
    calls = []

    def stats() -> dict[str, int]:
        calls.append(1)
        if len(calls) > 1:  # the start's beat passes; the thread's first one fails
            raise KeyError("inbox")
        return {}

    hb = Heartbeat(control, 1.0, stats=stats).start()  # beats every 1/3 s
    hb._thread.join(timeout=10)
    assert not hb._thread.is_alive()
    assert isinstance(hb.error, KeyError)
