"""The pure helpers behind ``ctx.epochs``, ``ctx.shard`` and a script's exit: nonsense in, one line
out; what a failed script's exception holds, freed before interpreter shutdown."""

from typing import ClassVar

import numpy as np
import pytest

from hopbus.api import _rows_in, _rows_of, fit_epochs
from hopbus.errors import UserError


def test_epochs_cover_the_iterations_left():
    assert fit_epochs(100, 10, 0.0, 35) == 4  # 10 batches an epoch
    assert fit_epochs(100, 10, 0.5, 35) == 7  # 5 batches an epoch on what the split leaves
    assert fit_epochs(100, 1000, 0.0, 3) == 3  # a batch larger than the data: one per epoch
    assert fit_epochs(100, 10, 0.0, 0) == 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((100, 0, 0.0), "batch_size must be a whole number of at least 1, not 0"),
        ((0, 32, 0.0), "samples must be a whole number of at least 1, not 0"),
        ((100.5, 32, 0.0), "samples must be a whole number"),
        ((True, 32, 0.0), "samples must be a whole number"),
        ((100, 32, 1.0), r"validation_split 1.0 is not a number in \[0, 1\)"),
        ((100, 32, "0.2"), "validation_split '0.2' is not a number"),
        ((100, 32, float("nan")), "validation_split nan is not a number"),
    ],
)
def test_epochs_refuse_nonsense_in_one_line(args, match):
    with pytest.raises(UserError, match=match):
        fit_epochs(*args, 10)


def test_rows_of_keep_each_kind():
    rows = np.array([2, 0])
    assert _rows_of(np.arange(5) * 10, rows).tolist() == [20, 0]
    assert _rows_of([1, 2, 3, 4, 5], rows) == [3, 1]
    assert _rows_of(("a", "b", "c"), rows) == ["c", "a"]
    with pytest.raises(UserError, match="cannot take rows of a dict by position"):
        _rows_of({"a": 1}, rows)


def test_what_has_no_rows_is_one_line():
    assert _rows_in(np.zeros((4, 2))) == 4 and _rows_in([1, 2]) == 2
    with pytest.raises(UserError, match=r"a dict has keys, not rows"):
        _rows_in({"a": np.arange(10)})
    for scalar in (np.float32(3), np.array(5), (i for i in range(3)), 7):
        with pytest.raises(UserError, match="has no rows to split"):
            _rows_in(scalar)


def test_a_tf_data_dataset_is_told_how_it_is_split():
    """A tf.data dataset got "cannot take rows of a _TensorSliceDataset by position; give
    numpy arrays" (of known length) or "has no rows to split" (unknown), neither naming the
    dataset's own shard()."""
    tf = pytest.importorskip("tensorflow", reason="the tf extra")
    sized = tf.data.Dataset.from_tensor_slices(np.arange(8))
    unsized = tf.data.Dataset.from_generator(
        lambda: iter(range(8)), output_signature=tf.TensorSpec((), tf.int64)
    )
    says = r"^ctx\.shard\(\): a tf\.data \w+ is split by the dataset itself: dataset\.shard\("
    with pytest.raises(UserError, match=says):
        _rows_of(sized, np.array([0, 1]))
    with pytest.raises(UserError, match=says):
        _rows_in(unsized.batch(2))


def test_a_figure_beyond_any_float_is_one_line():
    """Fault ``huge_loss``: ``ctx.end(new, loss=10**400)`` ended in an OverflowError
    traceback; a string loss already got one line."""
    from hopbus.runtime.reported import figure as _figure

    with pytest.raises(UserError, match=r"^end\(\): loss is an integer beyond any float's range$"):
        _figure("end()", "loss", 10**400)
    assert _figure("end()", "loss", np.float32(0.5)) == 0.5


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"run": 123}, "run must be a string, not int"),
        ({"run": "r", "redis": 123}, "redis must be a string, not int"),
        ({"run": "r", "redis": ""}, "redis is empty"),
        ({"run": "r", "id": "0"}, "id must be a whole number, not str"),
        ({"run": "r", "id": 1.7}, "id must be a whole number, not float"),
        ({"run": "r", "id": True}, "id must be a whole number, not bool"),
        ({"run": "r", "tensorboard": 3}, "tensorboard must be a folder's path, not int"),
    ],
)
def test_join_arguments_of_the_wrong_kind_are_one_line(kw, match):
    """Before any connection: they met tracebacks deep in the run's code (a float id at
    start(), True taken for worker 1 and its failure blamed on Redis)."""
    import hopbus

    with pytest.raises(UserError, match=match):
        hopbus.join(**kw)


@pytest.mark.parametrize("text", ["1_0", "\u0967", " 1e400x"])
def test_a_number_from_the_environment_is_ascii_digits(monkeypatch, text):
    """HOPBUS_ID=1_0 joined as worker 10, and a Devanagari one as worker 1."""
    from hopbus.api import _env_number

    monkeypatch.setenv("HOPBUS_ID", text)
    with pytest.raises(UserError, match=r"HOPBUS_ID=.* is not a whole number"):
        _env_number("HOPBUS_ID", int, None)
    monkeypatch.setenv("HOPBUS_ID", "12")
    assert _env_number("HOPBUS_ID", int, None) == 12


def test_the_writer_lets_through_what_the_progress_reader_takes():
    """Fault ``implausible_evaluation``: a --model's evaluate() (or a script's log()) wrote an
    accuracy of 5, or an infinite one, into a progress entry; the reader refused that entry
    and then every later step of the worker, as forged. The writer now refuses exactly what
    the reader would (coord/read.accuracy), naming evaluate(); NaN passes both."""
    from hopbus.runtime.progress import parse_entry
    from hopbus.runtime.reported import entry_figures, scored
    from hopbus.runtime.reported import figure as _figure

    for value in (0.0, 0.5, 1.0, float("nan"), 5.0, float("inf"), -0.1):
        fields = {b"worker": b"0", b"iter": b"3", b"eval_accuracy": repr(value).encode()}
        taken = parse_entry(fields) is not None
        try:
            _figure("log()", "eval_accuracy", value)
        except UserError:
            written = False
        else:
            written = True
        assert taken == written, value
    assert scored((0.3, np.float64(0.25))) == (0.3, 0.25)
    with pytest.raises(UserError, match=r"^evaluate\(\): accuracy 5 is not a fraction"):
        scored((0.3, 5.0))
    with pytest.raises(UserError, match=r"^evaluate\(\): returned float, not \(loss, accuracy\)"):
        scored(0.3)
    # any pair: an array of two (a script's evaluate returning np.array([loss, acc])), None
    # for a figure not measured, which an entry carries as NaN (null in metrics.jsonl)
    assert scored(np.array([0.3, 0.25])) == (pytest.approx(0.3), 0.25)
    e = entry_figures((0.3, None))
    assert e["eval_loss"] == 0.3 and np.isnan(e["eval_accuracy"])
    fields = {k.encode(): repr(v).encode() for k, v in e.items()}
    fields.update({b"worker": b"0", b"iter": b"3"})
    assert parse_entry(fields) is not None


class _Held:
    """What fit's frame holds (a tf.data iterator, in the real case); each one made is
    followed by a weak reference (not through the frame's f_locals, which would keep it)."""

    made: ClassVar[list] = []

    def __init__(self) -> None:
        import weakref

        _Held.made.append(weakref.ref(self))


def _fit(held: _Held) -> None:
    raise ValueError("fit's own error")


def _script(wrap: str) -> None:
    held = _Held()
    kept = None
    try:
        _fit(held)
    except ValueError as e:
        if wrap == "while handling":  # __context__ only
            raise RuntimeError("raised while handling it") from None
        kept = e
    raise RuntimeError("the script's own words") from kept  # __cause__ only: raised after it


@pytest.mark.parametrize("wrap", ["from", "while handling"])
def test_what_a_wrapped_fit_error_holds_is_freed_before_shutdown(monkeypatch, wrap):
    """Fault ``wrapped_fit_error``: the script wraps fit's error in its own; the exception that
    ends it keeps fit's frame through the one it was raised from (``__cause__``, here without a
    ``__context__``) or while handling (``__context__`` alone), whose locals are cleared before
    the collection at exit, as the last traceback's are."""
    from hopbus.api import _free_before_shutdown

    try:
        _script(wrap)
    except RuntimeError as e:
        last = e
    held = _Held.made[-1]
    monkeypatch.setattr("sys.last_value", last, raising=False)
    monkeypatch.setattr("sys.last_traceback", last.__traceback__, raising=False)
    assert held() is not None
    _free_before_shutdown()
    assert held() is None
