"""Token queues as Redis lists: TokenQ(I->J) is the list ``hop:{R}:tok:I:J``.

The owner RPUSHes one token per iteration it enters (the value is that iteration, Fig. 7 line
10); the taker pops them. Each list has exactly one taker, so a worker may take its tokens one
queue at a time with blocking pops and can never starve anybody (see protocol/tokens.py).

``RedisTokenQueues`` has the same put/size/can_take/take/short semantics as the in-memory
``TokenLedger`` (tests/contract runs one suite against both); it adds ``take_blocking``, which
waits with BLPOP in short slices so that the caller can notice a dead neighbour or a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import redis

from hopbus.coord.keys import RunKeys

# Take `count` tokens from every listed queue, or none at all (ARGV[1] = count).
_TAKE_ALL = """
local n = tonumber(ARGV[1])
for i = 1, #KEYS do
  if redis.call('LLEN', KEYS[i]) < n then return i end
end
if n > 0 then
  for i = 1, #KEYS do redis.call('LPOP', KEYS[i], n) end
end
return 0
"""

SLICE_S = 0.5  # longest single BLPOP, so that a waiting worker looks around this often


class TokenWaitTimeoutError(Exception):
    """No token arrived from ``owner`` within the timeout."""

    def __init__(self, owner: int, waited: float) -> None:
        super().__init__(f"no token from worker {owner} for {waited:.1f} s")
        self.owner = owner
        self.waited = waited


class RedisTokenQueues:
    def __init__(self, client: redis.Redis, keys: RunKeys) -> None:
        self.r = client
        self.keys = keys
        self._take_all = client.register_script(_TAKE_ALL)

    def put(self, owner: int, taker: int, count: int = 1, first: int = 0) -> None:
        """``owner`` puts ``count`` tokens (values first, first+1, ...) in TokenQ(owner->taker)."""
        if count > 0:
            self.r.rpush(self.keys.tok(owner, taker), *range(first, first + count))

    def size(self, owner: int, taker: int) -> int:
        return int(self.r.llen(self.keys.tok(owner, taker)))

    def sizes(self, owners: Sequence[int], taker: int) -> dict[int, int]:
        """Sizes of TokenQ(o->taker) for every o, in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for o in owners:
            pipe.llen(self.keys.tok(o, taker))
        return {o: int(n) for o, n in zip(owners, pipe.execute(), strict=True)}

    def can_take(self, owners: Iterable[int], taker: int, count: int = 1) -> bool:
        owners = list(owners)
        return all(n >= count for n in self.sizes(owners, taker).values())

    def short(self, owners: Iterable[int], taker: int, count: int = 1) -> tuple[int, ...]:
        owners = list(owners)
        return tuple(o for o, n in self.sizes(owners, taker).items() if n < count)

    def take(self, owners: Iterable[int], taker: int, count: int = 1) -> None:
        """Take ``count`` tokens from every TokenQ(o->taker), all or nothing (atomic)."""
        owners = list(owners)
        if not owners:
            return
        short = self._take_all(keys=[self.keys.tok(o, taker) for o in owners], args=[count])
        if short:
            o = owners[int(short) - 1]
            have = self.size(o, taker)
            raise ValueError(f"TokenQ({o}->{taker}) holds {have} tokens, {count} needed")

    def pop_one(self, owner: int, taker: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for one token of TokenQ(owner->taker) and take it."""
        return self.r.blpop([self.keys.tok(owner, taker)], timeout=timeout) is not None

    def take_blocking(
        self,
        owners: Sequence[int],
        taker: int,
        count: int,
        *,
        patience: float,
        on_wait: Callable[[int, float], None] | None = None,
    ) -> float:
        """Take ``count`` tokens from every TokenQ(o->taker), waiting for them, one queue at a
        time. Returns the seconds spent waiting. ``on_wait(owner, waited)`` is called after every
        empty slice (it may raise, e.g. when the owner's heartbeat is gone); if no token comes
        from one owner for ``patience`` seconds, raises TokenWaitTimeoutError."""
        waited_total = 0.0
        for o in owners:
            key = self.keys.tok(o, taker)
            need = count
            while need:
                got = self.r.lpop(key, need)  # what is there already, without blocking
                need -= len(got) if got else 0
                if not need:
                    break
                t0 = time.monotonic()
                while True:
                    got1 = self.r.blpop([key], timeout=SLICE_S)
                    waited = time.monotonic() - t0
                    if got1 is not None:
                        need -= 1
                        break
                    if on_wait is not None:
                        on_wait(o, waited)
                    if waited >= patience:
                        raise TokenWaitTimeoutError(o, waited)
                waited_total += time.monotonic() - t0
        return waited_total
