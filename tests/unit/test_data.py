"""hopbus.data: each loader on real or hand-made files, one-line refusals, shards, batches."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hopbus.data import DATA_GRAMMAR, Batches, DataError, Dataset, load_dataset, shard
from hopbus.errors import UserError


def refused(spec: str, seed: int = 0) -> str:
    """The one-line DataError message ``load_dataset(spec)`` raises."""
    with pytest.raises(DataError) as info:
        load_dataset(spec, seed)
    message = str(info.value)
    assert "\n" not in message and message
    return message


# digits


def test_digits_shapes_range_and_fixed_split() -> None:
    ds = load_dataset("digits", seed=0)
    assert len(ds.y_train) + len(ds.y_test) == 1797
    assert ds.n_features == 64 and ds.n_classes == 10 and ds.name == "digits"
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    for x in (ds.x_train, ds.x_test):
        assert x.min() == 0.0 and x.max() == 1.0
    assert set(np.unique(ds.y_test)) == set(range(10))
    per_class_test = np.bincount(ds.y_test) / np.bincount(np.concatenate([ds.y_train, ds.y_test]))
    np.testing.assert_allclose(per_class_test, 0.25, atol=0.01)  # stratified
    other = load_dataset("digits", seed=99)  # the run's seed never moves the test set
    np.testing.assert_array_equal(other.x_test, ds.x_test)
    np.testing.assert_array_equal(other.y_train, ds.y_train)


def test_digits_does_not_import_sklearn() -> None:
    code = (
        "import sys; from hopbus.data import load_dataset; ds = load_dataset('digits'); "
        "print(len(ds.y_train), 'sklearn' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["1347", "False"]


# synthetic


def test_synthetic_defaults_and_determinism() -> None:
    a = load_dataset("synthetic", seed=3)
    assert a.x_train.shape == (3200, 32) and a.x_test.shape == (800, 32)
    assert a.n_classes == 2 and a.x_train.dtype == np.float32 and a.y_train.dtype == np.int64
    assert 0.3 < a.y_train.mean() < 0.7
    b = load_dataset("synthetic", seed=3)
    c = load_dataset("synthetic", seed=4)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.x_train, c.x_train)
    assert not np.array_equal(a.y_train, c.y_train)


def test_synthetic_sizes() -> None:
    ds = load_dataset("synthetic:100,7,5")
    assert ds.x_train.shape == (80, 7) and ds.x_test.shape == (20, 7) and ds.n_classes == 5
    assert set(np.unique(ds.y_train)) <= set(range(5))
    assert load_dataset("synthetic:50").x_train.shape == (40, 32)
    assert load_dataset("synthetic:50,3").n_classes == 2


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("synthetic:5", "SAMPLES must be in 10..10_000_000"),
        ("synthetic:100,0", "FEATURES"),
        ("synthetic:100,4,1", "CLASSES"),
        ("synthetic:ten", "integer"),
        ("synthetic:100,4,2,1", "at most"),
        ("synthetic:10000000,100000", "GiB"),
    ],
)
def test_synthetic_refuses(spec: str, needle: str) -> None:
    assert needle in refused(spec)


@pytest.mark.parametrize("spec", ["mnist", "", "digits:3", "svmlight"])
def test_unknown_spec_quotes_the_grammar(spec: str) -> None:
    assert DATA_GRAMMAR in refused(spec)
    assert issubclass(DataError, UserError)


@pytest.mark.parametrize("spec", ["cifar10", "cifar10:", "cifar10: "])
def test_cifar10_without_its_folder_says_how_to_give_it(spec: str) -> None:
    assert refused(spec) == (
        "cifar10 needs the folder of its batches: --data cifar10:DIR, or --data cifar10 "
        "--data-dir DIR"
    )


# svmlight


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_svmlight_one_based_labels_and_split(tmp_path: Path) -> None:
    lines = [f"{1 if i % 3 else -1} 1:{i} 4:0.5" for i in range(10)]
    path = write(tmp_path / "train.txt", "\n".join(lines) + "\n")
    ds = load_dataset(f"svmlight:{path}")
    assert ds.n_features == 4 and ds.n_classes == 2  # indices 1..4, one-based
    assert len(ds.y_train) == 8 and len(ds.y_test) == 2
    x = np.concatenate([ds.x_train, ds.x_test])
    y = np.concatenate([ds.y_train, ds.y_test])
    order = np.argsort(x[:, 0])
    np.testing.assert_array_equal(x[order, 0], np.arange(10))
    np.testing.assert_array_equal(x[:, 3], 0.5)
    np.testing.assert_array_equal(x[:, 1:3], 0.0)
    np.testing.assert_array_equal(y[order], [0 if i % 3 == 0 else 1 for i in range(10)])
    assert x.dtype == np.float32 and y.dtype == np.int64


def test_svmlight_test_file_padded_or_truncated(tmp_path: Path) -> None:
    train = write(tmp_path / "a", "-1 1:1 3:2\n1 2:1\n")
    wider = write(tmp_path / "b", "1 1:5 5:9\n")
    narrower = write(tmp_path / "c", "-1 1:7\n")
    ds = load_dataset(f"svmlight:{train},{wider}")
    assert ds.x_train.shape == (2, 3) and ds.x_test.shape == (1, 3)
    np.testing.assert_array_equal(ds.x_test, [[5, 0, 0]])
    np.testing.assert_array_equal(ds.y_train, [0, 1])
    ds = load_dataset(f"svmlight:{train},{narrower}")
    np.testing.assert_array_equal(ds.x_test, [[7, 0, 0]])
    np.testing.assert_array_equal(ds.y_test, [0])


def test_svmlight_refusals_name_the_file(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.txt", "1 1:1\nthis is not svmlight\n")
    assert bad in refused(f"svmlight:{bad}")
    missing = str(tmp_path / "missing.txt")
    assert missing in refused(f"svmlight:{missing}") and "no such file" in refused(
        f"svmlight:{missing}"
    )
    assert "directory" in refused(f"svmlight:{tmp_path}")
    good = write(tmp_path / "good.txt", "1 1:1\n-1 2:1\n")
    assert missing in refused(f"svmlight:{good},{missing}")
    one_label = write(tmp_path / "one.txt", "1 1:1\n1 2:1\n")
    assert "same label" in refused(f"svmlight:{one_label}")


@pytest.mark.parametrize(
    ("line", "why"),
    [  # inf once read as float32; a duplicate index; indices out of order; a huge index
        ("1 1:0.5 2:1e39", "field 3 has a value beyond float32's range (features are float32)"),
        ("1 1:0.5 1:0.7", "field 3's index is not above the one before (indices go up, once each)"),
        ("1 3:0.5 2:0.7", "field 3's index is not above the one before (indices go up, once each)"),
        ("1 1:0.5 3000000000:1", "field 3 has an index above 2147483647"),
        ("1 " + "9" * 5000 + ":1", "field 2 has an index above 2147483647"),  # no int() of it
        (
            "1 " + "0" * 5000 + "1:1 1:2",
            "field 3's index is not above the one before (indices go up, once each)",
        ),
        ("1 +1:0.5 -1:2", "field 3 has a negative index"),  # a sign the parser takes
        ("1 1:0.5 2:1_0", "field 3 has a value that is not a number"),  # not 10, as Python has it
        ("1_0 1:0.5", "its label is not a number"),
    ],
)
def test_svmlight_lines_the_parser_refuses_are_named(tmp_path: Path, line: str, why: str) -> None:
    """Faults ``float32_overflow``, ``duplicate_index``, ``unsorted_index``, ``huge_index``: the
    line and the field at fault, where the refusal said only "not svmlight's format"."""
    path = write(tmp_path / "x.txt", f"1 1:1 2:2\n-1 -0:1 +1:2 # a_note\n{line}\n")  # 2 is good
    assert refused(f"svmlight:{path}") == f"svmlight file {path!r}, line 3: {why}"


# cifar10


def write_batch(path: Path, n: int, seed: int, protocol: int = 2) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, n)]
    batch = {b"batch_label": b"test", b"labels": labels, b"data": data, b"filenames": [b"x"] * n}
    with path.open("wb") as f:
        pickle.dump(batch, f, protocol=protocol)
    return data, labels


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_cifar10_folder(tmp_path: Path, protocol: int) -> None:
    d1, l1 = write_batch(tmp_path / "data_batch_1", 4, seed=1, protocol=protocol)
    d3, l3 = write_batch(tmp_path / "data_batch_3", 3, seed=3, protocol=protocol)
    dt, lt = write_batch(tmp_path / "test_batch", 2, seed=9, protocol=protocol)
    with pytest.warns(UserWarning, match=r"training on 2 of the 5 batches \(data_batch_2, "):
        ds = load_dataset(f"cifar10:{tmp_path}")  # the others left out, and said so
    assert ds.x_train.shape == (7, 3072) and ds.x_test.shape == (2, 3072) and ds.n_classes == 10
    assert ds.x_train.dtype == np.float32
    np.testing.assert_allclose(ds.x_train, np.concatenate([d1, d3]) / 255, rtol=1e-6)
    np.testing.assert_allclose(ds.x_test, dt / 255, rtol=1e-6)
    np.testing.assert_array_equal(ds.y_train, l1 + l3)
    np.testing.assert_array_equal(ds.y_test, lt)


def test_cifar10_refuses_a_pickle_that_runs_code(tmp_path: Path) -> None:
    write_batch(tmp_path / "data_batch_1", 2, seed=1)
    marker = tmp_path / "pwned"
    # protocol 0 by hand: os.system("touch MARKER")
    (tmp_path / "test_batch").write_bytes(f"cos\nsystem\n(S'touch {marker}'\ntR.".encode())
    message = refused(f"cifar10:{tmp_path}")
    assert "os.system" in message and "test_batch" in message
    assert not marker.exists()


def test_cifar10_missing_pieces(tmp_path: Path) -> None:
    assert "no such directory" in refused(f"cifar10:{tmp_path / 'nope'}")
    assert "data_batch_1" in refused(f"cifar10:{tmp_path}")
    write_batch(tmp_path / "data_batch_2", 2, seed=1)
    assert "test_batch" in refused(f"cifar10:{tmp_path}")
    (tmp_path / "test_batch").write_bytes(b"garbage")
    assert "not a CIFAR-10 batch" in refused(f"cifar10:{tmp_path}")
    with (tmp_path / "test_batch").open("wb") as f:
        pickle.dump({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}, f)
    assert "3072" in refused(f"cifar10:{tmp_path}")
    # a scalar where the labels go (len() of it raised), and an empty test set (its loss of
    # 0.0 would have met any --target-loss at once)
    for labels, rows, said in [(5, 2, "no list of labels"), ([], 0, "got (0, 3072) and 0")]:
        with (tmp_path / "test_batch").open("wb") as f:
            pickle.dump({b"data": np.zeros((rows, 3072), np.uint8), b"labels": labels}, f)
        message = refused(f"cifar10:{tmp_path}")
        assert "N above 0" in message and said in message, message
    # ragged lists (np.ndim raised), and labels that are not integers (3.7 was cast to 3)
    for labels in ([[1], [2, 3]], [3.7, 1.0], ["3", "1"]):
        with (tmp_path / "test_batch").open("wb") as f:
            pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": labels}, f)
        message = refused(f"cifar10:{tmp_path}")
        assert "labels" in message, (labels, message)


# shard and Batches


def numbered(n: int) -> Dataset:
    """A data set whose single feature is the row's number, to track rows through shards."""
    x = np.arange(n, dtype=np.float32).reshape(-1, 1)
    return Dataset("numbered", x, np.arange(n) % 2, x[:1], np.zeros(1, np.int64), 2)


def test_shards_partition_the_training_set() -> None:
    ds = numbered(103)
    parts = [shard(ds, w, 4, seed=5) for w in range(4)]
    ids = np.concatenate([x[:, 0] for x, _ in parts])
    assert sorted(ids) == list(range(103))  # disjoint and covering
    assert sorted(len(x) for x, _ in parts) == [25, 26, 26, 26]
    for x, y in parts:
        np.testing.assert_array_equal(y, x[:, 0].astype(np.int64) % 2)  # rows stay paired
    again = shard(ds, 2, 4, seed=5)[0]
    np.testing.assert_array_equal(again, parts[2][0])
    assert not np.array_equal(shard(ds, 2, 4, seed=6)[0], parts[2][0])


def test_too_many_workers() -> None:
    with pytest.raises(DataError, match="too few for 11 workers"):
        shard(numbered(10), 0, 11, seed=0)
    assert len(shard(numbered(10), 9, 10, seed=0)[0]) == 1


def test_batches_cycle_through_epochs_and_reshuffle() -> None:
    x = np.arange(10, dtype=np.float32).reshape(-1, 1)
    y = np.arange(10)
    batches = Batches(x, y, batch_size=4, seed=1)
    stream = [batches.next() for _ in range(5)]  # 20 rows: exactly two epochs
    assert all(len(bx) == 4 for bx, _ in stream)
    rows = np.concatenate([by for _, by in stream])
    np.testing.assert_array_equal(np.concatenate([bx for bx, _ in stream])[:, 0], rows)
    assert sorted(rows[:10]) == list(range(10)) and sorted(rows[10:]) == list(range(10))
    assert not np.array_equal(rows[:10], rows[10:])
    assert batches.epoch == 2
    same = Batches(x, y, batch_size=4, seed=1)
    np.testing.assert_array_equal(np.concatenate([next(same)[1] for _ in range(5)]), rows)
    other = Batches(x, y, batch_size=4, seed=2)
    other_rows = np.concatenate([other.next()[1] for _ in range(5)])
    assert not np.array_equal(other_rows, rows)


def test_batch_larger_than_data_is_all_of_it() -> None:
    x = np.ones((3, 2), np.float32)
    y = np.array([0, 1, 0])
    bx, by = next(iter(Batches(x, y, batch_size=32, seed=0)))
    assert bx.shape == (3, 2) and list(by) == [0, 1, 0]


def test_a_worker_makes_dense_only_its_own_share(tmp_path: Path) -> None:
    """svmlight and CIFAR-10 load as the worker's share (``keep``): the same rows a full load
    then ``shard`` gives, the test set whole, and nothing else made dense."""
    from hopbus.data import shard

    rows = "\n".join(f"{i % 3} 1:{i} 4:{i * 0.5}" for i in range(40))
    svm = write(tmp_path / "d.svm", rows + "\n")
    for i in range(1, 3):
        write_batch(tmp_path / f"data_batch_{i}", 30, seed=i)
    write_batch(tmp_path / "test_batch", 10, seed=9)
    for spec in (f"svmlight:{svm}", f"cifar10:{tmp_path}"):
        whole = load_dataset(spec)
        for w in range(3):
            mine = load_dataset(spec, keep=(w, 3, 7))
            assert mine.shard == (w, 3)
            x, y = shard(whole, w, 3, 7)
            np.testing.assert_array_equal(mine.x_train, x)
            np.testing.assert_array_equal(mine.y_train, y)
            np.testing.assert_array_equal(mine.x_test, whole.x_test)
            assert shard(mine, w, 3, 7)[0] is mine.x_train  # not cut again
        with pytest.raises(ValueError, match="share"):
            shard(mine, 0, 3, 7)
