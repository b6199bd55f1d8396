"""The parameters every worker starts from: worker 0's, broadcast through Redis.

Every worker of a run must start from the same x_0 (the paper's p0). hopbus's own models draw it
from the run's seed, but a user's script may build its model without a seed (Keras does by
default) or with a seed of its own, so worker 0 publishes its initial parameters once, as the
frames of an ordinary update (``hop:{R}:initial``, a hash: field ``0`` the header, ``1``... the
tensors), and every other worker takes them, as Horovod's broadcast callback does. The same
read is the check that every worker built the same model: a worker whose layout differs stops
with one line naming the first tensor that differs, before any training.

Whatever is in that key is decoded by the data plane's own validator: a malformed or forged
value is refused with one line, never unpickled, never a traceback.
"""

from __future__ import annotations

import msgpack
import redis

from hopbus.coord.keys import RunKeys
from hopbus.errors import RunFailure
from hopbus.transport import FrameError, Layout, Params, Validator, encode_update


def publish_initial(client: redis.Redis, keys: RunKeys, params: Params) -> None:
    """Worker 0: put its initial parameters where the others read them (one atomic step)."""
    frames = encode_update(keys.run, 0, 0, params)
    pipe = client.pipeline(transaction=True)
    pipe.delete(keys.initial)
    pipe.hset(keys.initial, mapping={str(i): bytes(f) for i, f in enumerate(frames)})
    try:
        pipe.execute()
    except redis.ResponseError as exc:  # e.g. a tensor over Redis's 512 MB string limit
        raise RunFailure(
            f"worker 0 could not publish its initial parameters in {keys.initial}: {exc}"
        ) from None


def describe(layout: Layout, i: int) -> str:
    name, dtype, shape = layout[i]
    return f"{name!r} {dtype}{list(shape)}"


def differs(mine: Layout, theirs: Layout) -> str | None:
    """The first difference between two models' layouts, in words (None: the same)."""
    for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
        if a[0] != b[0]:
            return f"tensor {i} is {describe(mine, i)} here but {describe(theirs, i)} on worker 0"
        if a != b:
            return f"tensor {a[0]!r} is {a[1]}{list(a[2])} here but {b[1]}{list(b[2])} on worker 0"
    if len(mine) != len(theirs):
        extra = mine if len(mine) > len(theirs) else theirs
        i = min(len(mine), len(theirs))
        where = "here only" if extra is mine else "on worker 0 only"
        return (
            f"this model has {len(mine)} tensors and worker 0's {len(theirs)}: tensor "
            f"{describe(extra, i)} is {where}"
        )
    return None


def read_initial(
    client: redis.Redis, keys: RunKeys, layout: Layout, n_workers: int
) -> tuple[Layout, Params | None] | None:
    """Worker 0's published parameters: None while there are none yet; else worker 0's layout
    and, if it equals ``layout``, the parameters (read-only arrays). RunFailure if the value
    there is not a valid update."""
    raw = client.hgetall(keys.initial)
    if not raw:
        return None
    frames = [raw.get(str(i).encode()) for i in range(len(raw))]
    bad = RunFailure(f"{keys.initial} does not hold valid initial parameters; hopbus clean the run")
    if any(f is None for f in frames):
        raise bad
    try:
        head = msgpack.unpackb(frames[0], raw=False, strict_map_key=True, use_list=True)
        theirs: Layout = tuple(
            (str(n), str(d), tuple(int(x) for x in s)) for n, d, s in head["tensors"]
        )
    except Exception:
        raise bad from None
    if theirs != tuple(layout):
        return theirs, None
    check = Validator(
        keys.run, n_workers, update_from=(0,), ack_from=(), layout=layout, max_iteration=0
    )
    try:
        msg = check.decode(frames)
    except FrameError:
        raise bad from None
    return theirs, msg.payload


__all__ = ["describe", "differs", "publish_initial", "read_initial"]
