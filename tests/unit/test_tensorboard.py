"""TensorBoard event files written without TensorFlow, read back by TensorFlow's own parsers."""

from __future__ import annotations

import struct

import pytest

from hopbus.runtime.tensorboard import ScalarWriter, crc32c, event, record


def test_crc32c_is_castagnoli():
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    assert crc32c(b"") == 0


def test_records_are_framed_as_tfrecords():
    data = b"hello"
    framed = record(data)
    (length,) = struct.unpack("<Q", framed[:8])
    assert length == len(data) and framed[12 : 12 + len(data)] == data
    assert len(framed) == 8 + 4 + len(data) + 4


def test_tensorflow_reads_the_scalars(tmp_path):
    tf = pytest.importorskip("tensorflow")
    from tensorflow.core.util import event_pb2

    writer = ScalarWriter(tmp_path / "worker-0", start=1)
    for step in range(1, 6):
        writer.add(step, {"train/loss": 1.0 / step, "test/accuracy": None, "lag": -2}, keep=True)
    assert not writer.due()  # so the session does not work out step 6's scalars
    writer.add(6, {"train/loss": 0.1})  # within EVERY_S of the last kept one: left out
    writer.flush()
    (path,) = (tmp_path / "worker-0").glob("events.out.tfevents.*")
    events = [event_pb2.Event.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]
    assert events[0].file_version == "brain.Event:2"
    # where its steps begin: TensorBoard drops what an earlier file holds from there on
    assert events[1].step == 1 and events[1].session_log.status == event_pb2.SessionLog.START
    scalars = [(e.step, v.tag, v.simple_value) for e in events[2:] for v in e.summary.value]
    assert [s for s in scalars if s[1] == "train/loss"] == [
        (k, "train/loss", pytest.approx(1.0 / k)) for k in range(1, 6)
    ]
    assert all(tag != "test/accuracy" for _, tag, _ in scalars)  # None is left out
    assert (3, "lag", -2.0) in scalars
    assert all(step != 6 for step, _, _ in scalars)
    assert event(0.0, 7, scalars={"x": 1.5})  # serializes on its own too


def test_a_folder_it_cannot_write_stops_the_scalars_not_the_run(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = ScalarWriter(blocker / "worker-0")  # a folder under a file: cannot be made
    assert writer.due()
    writer.add(1, {"loss": 1.0})
    writer.flush()
    assert not writer.due()  # stopped: nothing more is worked out for it
    writer.add(2, {"loss": 0.5})
    writer.flush()
    assert capsys.readouterr().err.count("TensorBoard scalars stop") == 1


def test_a_value_beyond_float32_is_infinite_not_a_crash():
    """A float64 loss on its way to inf passes 1e39: struct refused it, and the worker died
    of an OverflowError before its divergence could be said."""
    import math

    for v, shown in ((1e39, math.inf), (-1e300, -math.inf), (3.0e38, 3.0e38)):
        data = event(0.0, 1, scalars={"x": v})
        (value,) = struct.unpack("<f", data[-4:])
        assert value == pytest.approx(shown, rel=1e-6)
