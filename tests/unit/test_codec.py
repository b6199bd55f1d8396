"""The data plane's wire format: round trips, zero copies, and every way a frame is dropped."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st

from hopbus.transport import (
    DROP_REASONS,
    KIND_ACK,
    KIND_ACTIVATE,
    KIND_GRAD,
    KIND_PARAMS,
    KIND_SUM,
    KIND_UPDATE,
    FrameError,
    Message,
    Params,
    Validator,
    encode,
    encode_ack,
    encode_update,
    layout_of,
)

RUN = "run-a"
N = 5
UPDATE_FROM = (1, 2)
ACK_FROM = (3,)
MAX_ITER = 1000


def snapshot(seed: int = 0) -> Params:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float64),
        "h": rng.standard_normal((2, 2, 2)).astype(np.float16),
    }


LAYOUT = layout_of(snapshot())


def validator(layout=LAYOUT) -> Validator:
    return Validator(RUN, N, UPDATE_FROM, ACK_FROM, layout, MAX_ITER)


def header(**changes) -> bytes:
    h = {
        "v": 1,
        "run": RUN,
        "src": 1,
        "iter": 7,
        "kind": KIND_UPDATE,
        "tensors": [[n, d, list(s)] for n, d, s in LAYOUT],
    }
    h.update(changes)
    return msgpack.packb(h, use_bin_type=True)


def good_frames() -> list:
    return encode_update(RUN, 1, 7, snapshot())


def with_header(**changes) -> list:
    return [header(**changes), *good_frames()[1:]]


def drop_reason(frames) -> str:
    with pytest.raises(FrameError) as info:
        validator().decode(frames)
    return info.value.reason


# ---- round trips -------------------------------------------------------------------------------

LAYOUTS = {
    "one vector": {"x": np.arange(10, dtype=np.float32)},
    "mixed dtypes": snapshot(3),
    "scalar and empty": {
        "s": np.array(2.5, dtype=np.float64),
        "e": np.zeros((0, 4), dtype=np.float32),
        "m": np.ones((2, 3), dtype=np.float16),
    },
    "many small": {
        f"layer{i}.{k}": np.full((i + 1, 2), i, np.float32) for i in range(20) for k in "wb"
    },
    "no tensors": {},
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_round_trip_keeps_names_dtypes_shapes_and_values(name):
    params = LAYOUTS[name]
    v = Validator(RUN, N, UPDATE_FROM, ACK_FROM, layout_of(params), MAX_ITER)
    msg = v.decode(encode_update(RUN, 2, 9, params))
    assert (msg.kind, msg.src, msg.iteration) == (KIND_UPDATE, 2, 9)
    assert list(msg.payload) == list(params)
    for key, a in params.items():
        got = msg.payload[key]
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(got, a)
    assert layout_of(msg.payload) == layout_of(params)


def test_round_trip_through_bytes_frames_shares_their_memory():
    frames = [bytes(f) for f in good_frames()]
    msg = validator().decode(frames)
    for frame, a in zip(frames[1:], msg.payload.values(), strict=True):
        assert np.shares_memory(a, np.frombuffer(frame, np.uint8))
        assert not a.flags.writeable


def test_round_trip_through_zmq_frames_shares_their_memory():
    frames = [zmq.Frame(bytes(f)) for f in good_frames()]
    msg = validator().decode(frames)
    for frame, a in zip(frames[1:], msg.payload.values(), strict=True):
        assert np.shares_memory(a, np.frombuffer(frame.buffer, np.uint8))


def test_encode_does_not_copy_contiguous_arrays():
    params = snapshot()
    frames = encode_update(RUN, 1, 0, params)
    for buf, a in zip(frames[1:], params.values(), strict=True):
        assert np.shares_memory(np.frombuffer(buf, np.uint8), a)


def test_non_contiguous_and_big_endian_arrays_arrive_as_little_endian_values():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    params = {"t": base.T, "be": np.arange(5, dtype=">f8")}
    v = Validator(RUN, N, UPDATE_FROM, ACK_FROM, layout_of(params), MAX_ITER)
    msg = v.decode(encode_update(RUN, 1, 0, params))
    np.testing.assert_array_equal(msg.payload["t"], base.T)
    np.testing.assert_array_equal(msg.payload["be"], np.arange(5))
    assert msg.payload["be"].dtype == np.dtype("<f8")


def test_ack_round_trip():
    frames = encode_ack(RUN, 3, 12)
    assert validator().decode(frames) == Message(KIND_ACK, 3, 12, None)
    assert validator().decode([zmq.Frame(frames[0])]).iteration == 12


def test_encode_refuses_dtypes_outside_the_allowed_set():
    with pytest.raises(ValueError, match="int64"):
        encode_update(RUN, 1, 0, {"x": np.arange(3)})


def test_validator_refuses_a_layout_it_could_never_accept():
    with pytest.raises(ValueError, match="int32"):
        Validator(RUN, N, (), (), (("x", "int32", (3,)),), MAX_ITER)
    with pytest.raises(ValueError, match="worker ids"):
        Validator(RUN, N, (N,), (), LAYOUT, MAX_ITER)


# ---- every drop reason -------------------------------------------------------------------------


def header_tensors() -> list:
    return [[n, d, list(s)] for n, d, s in LAYOUT]


def _short_tensor() -> list:
    frames = good_frames()
    frames[2] = bytes(frames[2])[:-1]
    return frames


def _with(index: int, name: str, value: float) -> Params:
    """A valid snapshot with one number of tensor ``name`` replaced by ``value``."""
    p = {k: a.copy() for k, a in snapshot().items()}
    p[name].reshape(-1)[index % p[name].size] = value
    return p


BAD = {
    "garbage": [
        [],
        [b"\xc1"],  # a byte msgpack never uses
        [b"\x92\x01"],  # an array cut short
        [msgpack.packb([1, 2, 3])],  # not a map
        [b"\x00" + header()],  # trailing data after one object
    ],
    "bad_header": [
        with_header(run=5),
        with_header(src="1"),
        with_header(src=True),
        with_header(kind=None),
        with_header(tensors={}),
        with_header(v="1"),
        [msgpack.packb({"v": 1, "run": RUN, "src": 1, "kind": KIND_UPDATE, "tensors": []})],
        [msgpack.packb({"v": 1, "pad": b"x" * 70_000})],
    ],
    "wrong_version": [with_header(v=2), with_header(v=0)],
    "wrong_run": [with_header(run="run-b"), with_header(run="")],
    "unknown_sender": [with_header(src=N), with_header(src=-1), with_header(src=2**64 - 1)],
    "not_neighbour": [
        with_header(src=0),  # a worker, but not an in-neighbour
        with_header(src=3),  # may ack, not update
        [header(src=1, kind=KIND_ACK, tensors=[])],  # may update, not ack
    ],
    "bad_kind": [with_header(kind="nack"), with_header(kind="")],
    "bad_iteration": [
        with_header(iter=-1),
        with_header(iter=MAX_ITER + 1),
        with_header(iter=1.0),
        with_header(iter=None),
        with_header(iter=False),
    ],
    "bad_layout": [
        good_frames()[:-1],  # a frame missing
        [*good_frames(), b""],  # one frame too many
        with_header(tensors=header_tensors()[::-1]),
        with_header(tensors=[["w", "float64", [4, 3]], *header_tensors()[1:]]),
        with_header(tensors=[["w", "int32", [4, 3]], *header_tensors()[1:]]),
        with_header(tensors=[["w", "float32", [3, 4]], *header_tensors()[1:]]),
        with_header(tensors=[["w", "float32", [4.0, 3]], *header_tensors()[1:]]),
        with_header(tensors=[["w", "float32", [True, 3]], *header_tensors()[1:]]),
        with_header(tensors=[["x", "float32", [4, 3]], *header_tensors()[1:]]),
        with_header(tensors=header_tensors()[:2]),
        [header(src=3, kind=KIND_ACK, tensors=[["w", "float32", [1]]])],
        [header(src=3, kind=KIND_ACK, tensors=[]), b""],
    ],
    "non_finite": [
        encode_update(RUN, 1, 7, _with(0, "w", np.nan)),
        encode_update(RUN, 1, 7, _with(5, "b", np.inf)),
        encode_update(RUN, 1, 7, _with(7, "h", -np.inf)),
    ],
    "wrong_length": [
        _short_tensor(),
        [*good_frames()[:-1], bytes(good_frames()[-1]) + b"\x00"],
        [good_frames()[0], b"", *good_frames()[2:]],
    ],
}


def test_every_drop_reason_has_a_case():
    assert set(BAD) == set(DROP_REASONS)


@pytest.mark.parametrize(
    ("reason", "frames"),
    [(reason, frames) for reason, cases in BAD.items() for frames in cases],
)
def test_bad_frames_are_dropped_for_the_right_reason(reason, frames):
    assert drop_reason(frames) == reason


def test_huge_but_finite_numbers_are_valid_data():
    """The finiteness check sums each tensor; a sum that overflows is checked exactly, so a
    tensor of finite numbers near the dtype's limit is never dropped."""
    p = snapshot()
    p["w"] = np.full((4, 3), np.finfo(np.float32).max, np.float32)  # its sum overflows float32
    p["h"] = np.full((2, 2, 2), np.finfo(np.float16).max, np.float16)
    msg = validator().decode(encode_update(RUN, 1, 7, p))
    assert np.array_equal(msg.payload["w"], p["w"]) and np.array_equal(msg.payload["h"], p["h"])


def test_the_header_bound_stops_garbage_before_msgpack_reads_it():
    v = validator()
    assert drop_reason([b"\xc1" * (v.max_header_bytes + 1)]) == "bad_header"
    assert drop_reason([b"\xc1" * v.max_header_bytes]) == "garbage"


# ---- fuzz: nothing but a valid Message or a FrameError --------------------------------------


def check_outcome(frames) -> None:
    """decode's contract: a Message that matches the layout, or a FrameError with a known
    reason that a check raised on purpose (not the catch-all for an unexpected exception)."""
    try:
        msg = validator().decode(frames)
    except FrameError as exc:
        assert exc.reason in DROP_REASONS
        assert exc.__cause__ is None, f"an unexpected {exc.__cause__!r} reached the catch-all"
        return
    assert isinstance(msg, Message)
    assert 0 <= msg.iteration <= MAX_ITER
    if msg.kind == KIND_ACK:
        assert msg.src in ACK_FROM and msg.payload is None
        return
    assert msg.kind == KIND_UPDATE and msg.src in UPDATE_FROM
    assert layout_of(msg.payload) == LAYOUT
    for a in msg.payload.values():
        assert a.nbytes == math.prod(a.shape) * a.itemsize


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)

frame_bytes = st.binary(max_size=64)


@given(st.lists(frame_bytes, max_size=6))
def test_fuzz_random_bytes(frames):
    check_outcome(frames)


@given(msgpack_values, st.lists(frame_bytes, max_size=4))
def test_fuzz_random_msgpack_headers(head, rest):
    check_outcome([msgpack.packb(head, use_bin_type=True), *rest])


field_values = {
    "v": st.sampled_from([1, 1, 2, "1", None]),
    "run": st.sampled_from([RUN, RUN, "other", 3]),
    "src": st.sampled_from([*UPDATE_FROM, *ACK_FROM, 0, N, -1, "1", True]),
    "iter": st.one_of(st.integers(-2, MAX_ITER + 2), st.sampled_from([1.5, None, "3", True])),
    "kind": st.sampled_from([KIND_UPDATE, KIND_UPDATE, KIND_ACK, "x", 1]),
}
tensor_entry = st.one_of(
    st.sampled_from(header_tensors()),
    st.lists(
        st.one_of(
            st.sampled_from(["w", "b", "h", "float32", "float16"]),
            st.lists(st.integers(-1, 5), max_size=3),
            msgpack_values,
        ),
        max_size=4,
    ),
)


@st.composite
def near_valid(draw):
    """Messages a mutation or two away from valid ones (sometimes none), so that the fuzz
    reaches the deep checks and the success path, not just the first type check."""
    kind = draw(st.sampled_from([KIND_UPDATE, KIND_ACK]))
    src = draw(st.sampled_from(UPDATE_FROM if kind == KIND_UPDATE else ACK_FROM))
    h = {"v": 1, "run": RUN, "src": src, "iter": draw(st.integers(0, MAX_ITER)), "kind": kind}
    h["tensors"] = header_tensors() if kind == KIND_UPDATE else []
    good = [bytes(b) for b in good_frames()[1:]] if kind == KIND_UPDATE else []
    for key in draw(st.sets(st.sampled_from(list(field_values)), max_size=2)):
        h[key] = draw(field_values[key])
    for key in draw(st.sets(st.sampled_from([*field_values, "tensors"]), max_size=1)):
        if draw(st.integers(0, 3)) == 0:
            del h[key]
    if draw(st.integers(0, 3)) == 0:
        h["tensors"] = draw(st.lists(tensor_entry, max_size=4))
    if good and draw(st.integers(0, 3)) == 0:  # one tensor frame resized
        i = draw(st.integers(0, len(good) - 1))
        good[i] = good[i][: draw(st.integers(0, len(good[i]) + 2))] + b"\x00" * draw(
            st.integers(0, 2)
        )
    body = draw(
        st.one_of(
            st.just(good),
            st.just(good),
            st.lists(st.sampled_from([*good, b"", b"\x00" * 24]), max_size=5),
            st.lists(frame_bytes, max_size=4),
        )
    )
    wrap = draw(st.sampled_from([bytes, memoryview, zmq.Frame]))
    return [wrap(b) for b in [msgpack.packb(h, use_bin_type=True), *body]]


@given(near_valid())
def test_fuzz_near_valid_messages(frames):
    check_outcome(frames)


# ---- the related schemes' kinds: tag, meta, who may send what -------------------------------


def scheme_validator() -> Validator:
    """A worker of a 4-worker PS run (the server is node 4) that also speaks WAGMA's kinds."""
    return Validator(
        RUN,
        N,
        (),
        (),
        LAYOUT,
        MAX_ITER,
        accept={KIND_PARAMS: (4,), KIND_ACTIVATE: (1, 2), KIND_SUM: (1, 2), KIND_GRAD: (0,)},
    )


def test_tag_and_meta_round_trip():
    frames = encode(RUN, 1, 9, KIND_SUM, snapshot(), meta=[3, 10, 0])
    msg = scheme_validator().decode(frames)
    assert (msg.kind, msg.src, msg.iteration, msg.meta, msg.tag) == (KIND_SUM, 1, 9, (3, 10, 0), 0)
    msg = scheme_validator().decode(encode(RUN, 4, 12, KIND_PARAMS, snapshot(), tag=11))
    assert msg.tag == 11 and msg.payload is not None


def test_activate_carries_no_tensors():
    msg = scheme_validator().decode(encode(RUN, 2, 5, KIND_ACTIVATE))
    assert msg.payload is None
    with pytest.raises(ValueError, match="takes no tensors"):
        encode(RUN, 2, 5, KIND_ACTIVATE, snapshot())
    with pytest.raises(ValueError, match="needs tensors"):
        encode(RUN, 4, 5, KIND_PARAMS)


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        (encode(RUN, 1, 7, KIND_UPDATE, snapshot()), "bad_kind"),  # not taken by this receiver
        (encode(RUN, 3, 7, KIND_PARAMS, snapshot(), tag=1), "not_neighbour"),  # not the server
        (encode(RUN, 0, 7, KIND_GRAD, snapshot(), tag=-1 % 2**40), "bad_header"),  # tag too big
        (encode(RUN, 1, 7, KIND_SUM, snapshot(), meta=list(range(N + 1))), "bad_header"),
        (encode(RUN, 1, 7, KIND_SUM, snapshot(), meta=[-1]), "bad_header"),
    ],
)
def test_scheme_frames_are_dropped_for_the_right_reason(frames, reason):
    with pytest.raises(FrameError) as info:
        scheme_validator().decode(frames)
    assert info.value.reason == reason


def test_validator_refuses_an_unknown_kind_to_accept():
    with pytest.raises(ValueError, match="unknown message kind"):
        Validator(RUN, N, (), (), LAYOUT, MAX_ITER, accept={"gossip": (1,)})
