"""One suite, two implementations: the in-memory TokenLedger (the reference the simulator uses)
and the Redis lists the cluster uses must agree on every sequence of operations."""

import itertools
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hopbus.coord.keys import RunKeys
from hopbus.coord.tokens import RedisTokenQueues
from hopbus.protocol.tokens import TokenLedger

_runs = itertools.count()


@pytest.fixture(params=["memory", "redis"])
def make_queues(request):
    if request.param == "memory":
        return TokenLedger
    client = request.getfixturevalue("redis_client")
    return lambda: RedisTokenQueues(client, RunKeys(f"contract-{next(_runs)}"))


def test_put_then_take_counts(make_queues):
    q = make_queues()
    q.put(1, 0, 3)
    q.put(2, 0, 1)
    assert q.size(1, 0) == 3 and q.size(2, 0) == 1 and q.size(0, 1) == 0
    assert q.can_take([1, 2], 0, 1)
    assert not q.can_take([1, 2], 0, 2)
    assert q.short([1, 2], 0, 2) == (2,)
    q.take([1, 2], 0, 1)
    assert (q.size(1, 0), q.size(2, 0)) == (2, 0)


def test_take_is_all_or_nothing(make_queues):
    q = make_queues()
    q.put(1, 0, 2)
    with pytest.raises(ValueError, match=r"TokenQ\(2->0\) holds 0 tokens, 1 needed"):
        q.take([1, 2], 0, 1)
    assert q.size(1, 0) == 2  # nothing taken from the queue that had enough


def test_queues_are_directed_and_per_pair(make_queues):
    q = make_queues()
    q.put(0, 1, 2)
    assert q.size(0, 1) == 2 and q.size(1, 0) == 0 and q.size(0, 2) == 0
    assert q.short([0], 2, 1) == (0,)


ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "take"]),
        st.integers(0, 2),  # owner
        st.integers(0, 2),  # taker
        st.integers(0, 3),  # count
    ),
    max_size=25,
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # fresh run id each
@given(ops)
def test_random_sequences_agree(redis_client, seq):
    mem = TokenLedger()
    red = RedisTokenQueues(redis_client, RunKeys(f"contract-{next(_runs)}"))
    for op, owner, taker, count in seq:
        if op == "put":
            mem.put(owner, taker, count)
            red.put(owner, taker, count)
        else:
            owners = [owner, (owner + 1) % 3]
            outcomes = []
            for q in (mem, red):
                try:
                    q.take(owners, taker, count)
                    outcomes.append(None)
                except ValueError as exc:
                    outcomes.append(str(exc))
            assert outcomes[0] == outcomes[1]
        for o, t in itertools.product(range(3), repeat=2):
            assert mem.size(o, t) == red.size(o, t)


# -- what only Redis has: the blocking pop a worker uses while a queue is short -------------


def test_blocking_pop_waits_for_a_put_from_another_client(redis_url, redis_client):
    import redis

    keys = RunKeys(f"contract-{next(_runs)}")
    taker = RedisTokenQueues(redis_client, keys)
    other = redis.Redis.from_url(redis_url)
    taker.put(1, 0, 1)
    started = threading.Event()

    def put_later():
        started.wait()
        # Put only once the taker is really blocked on TokenQ(2->0): it shows in CLIENT LIST.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any(c.get("cmd") == "blpop" for c in other.client_list()):
                break
        RedisTokenQueues(other, keys).put(2, 0, 1)

    t = threading.Thread(target=put_later)
    t.start()
    started.set()
    assert taker.pop_one(2, 0, timeout=10)
    t.join()
    other.close()
    assert taker.size(1, 0) == 1 and taker.size(2, 0) == 0  # only the queue asked for


def test_blocking_pop_gives_up_after_its_timeout(redis_client):
    keys = RunKeys(f"contract-{next(_runs)}")
    q = RedisTokenQueues(redis_client, keys)
    q.put(1, 0, 5)
    assert not q.pop_one(3, 0, timeout=0.3)
    assert q.size(1, 0) == 5 and q.size(3, 0) == 0
    assert q.pop_one(1, 0, timeout=0.3) and q.size(1, 0) == 4
