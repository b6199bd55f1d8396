"""The wire format of the data plane, and the checks every received message passes.

A message is multipart: frame 0 is a msgpack header, then one raw buffer frame per tensor, in
the layout's order. No pickle: a header is plain maps, lists, strings and ints, and a tensor is
its bytes, so nothing a peer sends can run code or build arbitrary objects here.

Tensors travel little-endian (the ``float32`` on the wire is ``<f4``); on the usual little-endian
hosts that is the native order, so neither side copies.

``Validator.decode`` is the one gate between the network and the protocol: whatever a peer
sends, it returns a ``Message`` that matches the run's layout or raises ``FrameError`` with a
reason from ``DROP_REASONS``, never anything else, so a bad frame is counted and dropped.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import zmq

WIRE_VERSION = 1
KIND_UPDATE = "update"  # Hop: a worker's parameters of iteration ``iter``
KIND_ACK = "ack"  # Hop notify-ack
KIND_GRAD = "grad"  # worker -> parameter server: gradient of iteration ``iter``, version ``tag``
KIND_PARAMS = "params"  # parameter server -> worker: version ``tag``; enter iteration ``iter``
KIND_ACTIVATE = "activate"  # wagma: the activator of group round ``iter`` asks for models
KIND_CONTRIB = "contrib"  # wagma: a model for round ``iter``, after ``tag`` local steps
KIND_SUM = "sum"  # wagma: round ``iter``'s group sum; ``meta``: each member's steps in it
KIND_PHASE = "phase"  # wagma: partial sum of the global average of ``iter``, phase ``tag``
KINDS = (
    KIND_UPDATE,
    KIND_ACK,
    KIND_GRAD,
    KIND_PARAMS,
    KIND_ACTIVATE,
    KIND_CONTRIB,
    KIND_SUM,
    KIND_PHASE,
)
TENSORLESS = frozenset({KIND_ACK, KIND_ACTIVATE})
MAX_TAG = 2**31 - 1

Params = dict[str, np.ndarray]
"""Named arrays in insertion order. Treated as immutable once built: they are sent zero-copy,
so a sender must not write into a snapshot it has handed to ``Outbox.send``."""

Layout = tuple[tuple[str, str, tuple[int, ...]], ...]
"""(name, dtype name, shape) per tensor, in order."""

ALLOWED_DTYPES = frozenset({"float16", "float32", "float64"})

DROP_REASONS = (
    "garbage",  # frame 0 is not msgpack, or not a map; no frames at all
    "bad_header",  # a field missing or of the wrong type; header too large
    "wrong_version",
    "wrong_run",
    "unknown_sender",  # src is not a worker id of this run
    "not_neighbour",  # a worker that may not send this kind to us
    "bad_kind",  # not a kind this receiver takes
    "bad_iteration",  # iter not an int in [0, max_iteration]
    "bad_layout",  # tensors or frame count differ from the expected layout
    "wrong_length",  # a tensor frame's byte length is not prod(shape) * itemsize
    "non_finite",  # a tensor holds a NaN or an infinity: averaged in, it would spread
)

HEADER_BASE_BYTES = 64 * 1024
HEADER_BYTES_PER_TENSOR = 64


class FrameError(Exception):
    """A received message that must be dropped; ``reason`` is one of ``DROP_REASONS``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(slots=True)
class Message:
    """A validated message: tensors in ``payload`` (None for the tensorless kinds), ``tag`` and
    ``meta`` as the kind defines them (0 and () when absent)."""

    kind: str
    src: int
    iteration: int
    payload: Params | None
    tag: int = 0
    meta: tuple[int, ...] = ()


_WIRE = {name: np.dtype(name).newbyteorder("<") for name in ALLOWED_DTYPES}
"""The explicit little-endian dtype each allowed dtype name stands for on the wire."""
_NAMES = {np.dtype(name): name for name in ALLOWED_DTYPES}
"""An allowed dtype's name, looked up by the dtype itself (``dtype.name`` is computed anew
in Python every time: a third of encoding a small update)."""


def finite(a: np.ndarray) -> bool:
    """Whether every number of ``a`` is finite: one summing pass (a sum is finite if every
    term is, unless it overflows; then the exact check decides)."""
    if a.size < 4096:  # small: the exact check costs less than the summing one's set-up
        return bool(np.isfinite(a).all())
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is expected, and settled
        total = a.sum(dtype=np.float64 if a.dtype == np.float64 else np.float32)
    return bool(np.isfinite(total) or np.isfinite(a).all())


def layout_of(params: Params) -> Layout:
    """The layout a snapshot has: what receivers check every update against."""
    return tuple((name, a.dtype.name, tuple(a.shape)) for name, a in params.items())


def _dtype_name(a: np.ndarray) -> str:
    name = _NAMES.get(a.dtype) or a.dtype.name  # the second: another byte order
    if name not in ALLOWED_DTYPES:
        raise ValueError(f"dtype {a.dtype} cannot be sent: allowed are {sorted(ALLOWED_DTYPES)}")
    return name


def _tensor_buffer(a: np.ndarray) -> memoryview:
    """A flat byte view of ``a`` in wire order, copying only if ``a`` is not C-contiguous or
    not little-endian."""
    wire = _WIRE[_dtype_name(a)]
    if a.dtype != wire:
        a = a.astype(wire)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return memoryview(a.reshape(-1).view(np.uint8))


def _header(
    run: str,
    src: int,
    iteration: int,
    kind: str,
    tensors: list,
    tag: int = 0,
    meta: Sequence[int] = (),
) -> bytes:
    head: dict[str, Any] = {
        "v": WIRE_VERSION,
        "run": run,
        "src": src,
        "iter": iteration,
        "kind": kind,
        "tensors": tensors,
    }
    if tag:
        head["tag"] = tag
    if meta:
        head["meta"] = list(meta)
    return msgpack.packb(head, use_bin_type=True)


def encode(
    run: str,
    src: int,
    iteration: int,
    kind: str,
    params: Params | None = None,
    *,
    tag: int = 0,
    meta: Sequence[int] = (),
) -> list:
    """[header, one buffer per tensor]: the buffers are views of ``params``, not copies."""
    if (params is None) != (kind in TENSORLESS):
        has = "needs" if params is None else "takes no"
        raise ValueError(f"a {kind} message {has} tensors")
    if params is None:
        return [_header(run, src, iteration, kind, [], tag, meta)]
    tensors = [[name, _dtype_name(a), list(a.shape)] for name, a in params.items()]
    buffers = [_tensor_buffer(a) for a in params.values()]
    return [_header(run, src, iteration, kind, tensors, tag, meta), *buffers]


def encode_update(run: str, src: int, iteration: int, params: Params) -> list:
    """Hop's update: a worker's parameters of ``iteration``."""
    return encode(run, src, iteration, KIND_UPDATE, params)


def encode_ack(run: str, src: int, iteration: int) -> list[bytes]:
    """A notify-ack ACK: a header alone, with no tensors."""
    return encode(run, src, iteration, KIND_ACK)


def _is_int(x: object) -> bool:
    return type(x) is int  # bool is not a worker id or an iteration


def _as_bytes(frame: object) -> memoryview:
    """A flat byte view of one received frame, whatever form it came in."""
    if isinstance(frame, zmq.Frame):
        frame = frame.buffer
    try:
        view = memoryview(frame)  # type: ignore[arg-type]
    except TypeError:
        raise FrameError("garbage", "a frame is not a buffer") from None
    if view.format == "B" and view.ndim == 1:
        return view
    if not view.c_contiguous:
        raise FrameError("garbage", "a frame is not contiguous")
    return view.cast("B")


class Validator:
    """Decodes and checks received messages against what this worker expects: its run, who may
    send it which kind (Hop: its in-neighbours' updates and out-neighbours' acks; ``accept``
    adds other kinds and their senders), the model's layout, the iteration range.

    ``n_workers`` counts every node id of the run (a parameter server is one more)."""

    def __init__(
        self,
        run: str,
        n_workers: int,
        update_from: Collection[int],
        ack_from: Collection[int],
        layout: Layout,
        max_iteration: int,
        *,
        accept: Mapping[str, Collection[int]] | None = None,
    ) -> None:
        if n_workers < 1:
            raise ValueError("n_workers must be at least 1")
        senders = {KIND_UPDATE: update_from, KIND_ACK: ack_from, **(accept or {})}
        for kind, peers in senders.items():
            if kind not in KINDS:
                raise ValueError(f"unknown message kind {kind!r}")
            bad = [p for p in peers if not (_is_int(p) and 0 <= p < n_workers)]
            if bad:
                raise ValueError(f"peers {bad} are not worker ids in 0..{n_workers - 1}")
        self.senders = {k: frozenset(v) for k, v in senders.items() if v}
        for name, dtype, shape in layout:
            if dtype not in ALLOWED_DTYPES:
                raise ValueError(f"tensor {name!r}: dtype {dtype} is not allowed")
            if any(not _is_int(d) or d < 0 for d in shape):
                raise ValueError(f"tensor {name!r}: bad shape {shape}")
        self.run = run
        self.n_workers = n_workers
        self.update_from = frozenset(update_from)
        self.ack_from = frozenset(ack_from)
        self.layout: Layout = tuple((n, d, tuple(s)) for n, d, s in layout)
        self.max_iteration = max_iteration
        self._expect = [
            (name, dtype, list(shape), _WIRE[dtype], math.prod(shape) * _WIRE[dtype].itemsize)
            for name, dtype, shape in self.layout
        ]
        listed = [[n, d, list(s)] for n, d, s in self.layout]
        self._listed = repr(listed)  # what a valid header's tensors read as, exactly
        self.max_header_bytes = (
            HEADER_BASE_BYTES
            + HEADER_BYTES_PER_TENSOR * len(self.layout)
            + len(msgpack.packb(listed, use_bin_type=True))
            + len(msgpack.packb(run, use_bin_type=True))
        )
        self.max_tensors = len(self._expect)
        """Tensors (frames after the header) in the largest valid message."""
        self.max_tensor_bytes = max((e[4] for e in self._expect), default=0)
        """The largest tensor a valid message carries: whether the model is small."""
        self.max_frame_bytes = max(self.max_header_bytes, self.max_tensor_bytes)
        """The largest frame a valid message has: a bound for the inbox's ZMQ_MAXMSGSIZE."""

    def decode(self, frames: Sequence[zmq.Frame | bytes | memoryview]) -> Message:
        """The message ``frames`` carry, or ``FrameError`` saying why it must be dropped."""
        try:
            return self._decode(frames)
        except FrameError:
            raise
        except Exception as exc:  # a check missed a shape of input: still only a drop
            raise FrameError("garbage", f"{type(exc).__name__}") from exc

    def _decode(self, frames: Sequence[Any]) -> Message:
        if len(frames) == 0:
            raise FrameError("garbage", "no frames")
        head = _as_bytes(frames[0])
        if len(head) > self.max_header_bytes:
            raise FrameError("bad_header", f"header of {len(head)} bytes")
        try:
            h = msgpack.unpackb(head, raw=False, strict_map_key=True, use_list=True)
        except Exception:
            raise FrameError("garbage", "frame 0 is not msgpack") from None
        if not isinstance(h, dict):
            raise FrameError("garbage", "header is not a map")

        v = h.get("v")
        if not _is_int(v):
            raise FrameError("bad_header", "v")
        if v != WIRE_VERSION:
            raise FrameError("wrong_version", str(v))
        for key, typ in (("run", str), ("src", int), ("kind", str), ("tensors", list)):
            if type(h.get(key)) is not typ:
                raise FrameError("bad_header", key)
        if "iter" not in h:
            raise FrameError("bad_header", "iter")
        if h["run"] != self.run:
            raise FrameError("wrong_run")
        kind = h["kind"]
        allowed = self.senders.get(kind)
        if allowed is None:
            raise FrameError("bad_kind")
        src = h["src"]
        if not 0 <= src < self.n_workers:
            raise FrameError("unknown_sender", str(src))
        if src not in allowed:
            raise FrameError("not_neighbour", f"{kind} from {src}")
        iteration = h["iter"]
        if not _is_int(iteration) or not 0 <= iteration <= self.max_iteration:
            raise FrameError("bad_iteration")
        tag = h.get("tag", 0)
        if not _is_int(tag) or not 0 <= tag <= MAX_TAG:
            raise FrameError("bad_header", "tag")
        meta = h.get("meta", [])
        if (
            type(meta) is not list
            or len(meta) > self.n_workers
            or not all(_is_int(m) and 0 <= m <= MAX_TAG for m in meta)
        ):
            raise FrameError("bad_header", "meta")

        if kind in TENSORLESS:
            if h["tensors"] or len(frames) != 1:
                raise FrameError("bad_layout", f"a {kind} carries no tensors")
            return Message(kind, src, iteration, None, tag, tuple(meta))
        return Message(kind, src, iteration, self._payload(h["tensors"], frames), tag, tuple(meta))

    def _payload(self, tensors: list, frames: Sequence[Any]) -> Params:
        expect = self._expect
        if len(tensors) != len(expect) or len(frames) != 1 + len(expect):
            raise FrameError("bad_layout", "tensor or frame count")
        if repr(tensors) != self._listed:  # the layout exactly, types too (True, 4.0 are not 1, 4)
            self._check_layout(tensors)
        params: Params = {}
        for frame, (name, _, shape, wire, nbytes) in zip(frames[1:], expect, strict=True):
            buf = _as_bytes(frame)
            if len(buf) != nbytes:
                raise FrameError("wrong_length", f"tensor {name!r}: {len(buf)} != {nbytes}")
            a = np.frombuffer(buf, dtype=wire).reshape(shape)
            a.flags.writeable = False  # shared with the frame; snapshots are immutable
            if not finite(a):
                raise FrameError("non_finite", f"tensor {name!r}")
            params[name] = a
        return params

    def _check_layout(self, tensors: list) -> None:
        """Name the first tensor whose header entry differs from the layout."""
        for got, (name, dtype, shape, _, _) in zip(tensors, self._expect, strict=True):
            if not (
                type(got) is list
                and len(got) == 3
                and type(got[0]) is str
                and got[0] == name
                and type(got[1]) is str
                and got[1] == dtype
                and type(got[2]) is list
                and len(got[2]) == len(shape)
                and all(_is_int(d) for d in got[2])
                and got[2] == shape
            ):
                raise FrameError("bad_layout", f"tensor {name!r}")
        raise FrameError("bad_layout", "tensors")  # pragma: no cover - equal entries, equal repr
