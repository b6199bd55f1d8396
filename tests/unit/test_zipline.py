"""ElasticBSP's barrier choice: ZipLine is exact (against brute force), GridScan is not."""

from bisect import bisect_right

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopbus.baselines.zipline import Barrier, brute_force, gridscan, predict, zipline

SOLVERS = [zipline, gridscan, brute_force]


def _rows(values, max_r=4):
    """One worker's predicted end times: ascending, repeats allowed."""
    return st.lists(values, min_size=1, max_size=max_r).map(sorted)


def _instances(max_n=4, max_r=4):
    """Small instances: ties across workers, repeats within a worker, rounding-prone floats."""
    ints = st.integers(0, 6)
    floats = st.floats(0, 10, allow_nan=False, allow_infinity=False)
    tenths = st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.6, 0.7, 1.0, 1.1, 2.5])
    same_r = st.integers(1, max_r).flatmap(
        lambda r: st.lists(
            st.lists(ints, min_size=r, max_size=r).map(sorted), min_size=1, max_size=max_n
        )
    )
    predicted = st.lists(
        st.builds(predict, st.floats(0, 1), st.floats(0.1, 0.6), st.integers(1, max_r)),
        min_size=1,
        max_size=max_n,
    )
    return st.one_of(
        *(st.lists(_rows(v, max_r), min_size=1, max_size=max_n) for v in (ints, floats, tenths)),
        same_r,
        predicted,
    )


def _reference(times) -> Barrier:
    """An independent O(N n log R) oracle: try every predicted time as the barrier, each worker
    taking its latest time at or before it; smallest (spread, barrier) wins."""
    best = None
    for t in sorted({x for row in times for x in row}):
        choice = [bisect_right(row, t) - 1 for row in times]
        if min(choice) < 0:
            continue  # some worker has nothing by t
        spread = t - min(row[i] for row, i in zip(times, choice, strict=True))
        if best is None or (spread, t) < (best.spread, best.t_sync):
            best = Barrier(tuple(choice), spread, t)
    assert best is not None
    return best


def _check_valid(times, b: Barrier) -> None:
    assert isinstance(b.spread, float) and isinstance(b.t_sync, float)
    assert len(b.choice) == len(times)
    chosen = []
    for row, i in zip(times, b.choice, strict=True):
        assert isinstance(i, int) and 0 <= i < len(row)
        # inside [t_sync - spread, t_sync], tested as the solvers compute widths (t_sync - t),
        # since t_sync - spread can round below the earliest chosen time
        assert row[i] <= b.t_sync and b.t_sync - row[i] <= b.spread
        assert i + 1 == len(row) or row[i + 1] > b.t_sync  # the latest time inside the window
        chosen.append(row[i])
    assert b.t_sync == max(chosen)
    assert b.spread == max(chosen) - min(chosen)


@settings(max_examples=2000)
@given(_instances())
def test_zipline_equals_brute_force(times):
    z, b = zipline(times), brute_force(times)
    assert z.spread == b.spread
    assert z.t_sync == b.t_sync
    assert z.choice == b.choice


@settings(max_examples=2000)
@given(_instances())
def test_gridscan_is_never_better_than_zipline(times):
    z, g = zipline(times), gridscan(times)
    assert z.spread <= g.spread
    assert (z.spread, z.t_sync) <= (g.spread, g.t_sync)  # the earliest optimum, too


@settings(max_examples=300)
@given(_instances())
def test_every_answer_is_a_valid_barrier(times):
    for solve in SOLVERS:
        _check_valid(times, solve(times))


@settings(max_examples=200)
@given(_instances(max_n=12, max_r=10))
def test_zipline_equals_reference_on_larger_instances(times):
    times = [[float(x) for x in row] for row in times]
    z = zipline(times)
    assert z == _reference(times)
    _check_valid(times, gridscan(times))


def test_heterogeneous_cluster_at_scale():
    """100 workers x 30 predictions from random intervals, as the parameter server sees them."""
    import random

    rnd = random.Random(7)
    times = [predict(rnd.random(), rnd.uniform(0.1, 0.6), 30) for _ in range(100)]
    z, g = zipline(times), gridscan(times)
    assert z == _reference(times)
    _check_valid(times, g)
    assert z.spread <= g.spread


def test_hand_checked_three_workers():
    """Intervals 3, 2.5 and 4.5. The narrowest windows are [4, 5] ({4, 5, 4.5}) and [9, 10]
    ({10, 10, 9}), both 1 wide; no three times lie closer. The earlier one wins (Sec. 4.2)."""
    times = [predict(-2.0, 3.0, 4), predict(0.0, 2.5, 4), predict(0.0, 4.5, 4)]
    assert times == [[1.0, 4.0, 7.0, 10.0], [2.5, 5.0, 7.5, 10.0], [4.5, 9.0, 13.5, 18.0]]
    want = Barrier(choice=(1, 1, 0), spread=1.0, t_sync=5.0)
    for solve in SOLVERS:
        assert solve(times) == want


def test_gridscan_misses_the_optimum():
    """Algorithm 1 designates worker 0 (earliest first time, 1). Its anchors 1, 3, 6 pick the
    closest times of the others: {1, 9, 2} (d=8), {3, 9, 3} (d=6), {6, 9, 3} (d=6), so GridScan
    settles on a barrier at 9 with spread 6. The optimum is [6, 10]: 6, 10 and 10 (spread 4;
    worker 1 has 9 and 10 in that window and takes the later 10)."""
    times = [[1, 3, 6], [9, 10, 12], [2, 3, 10]]
    assert gridscan(times) == Barrier(choice=(2, 0, 1), spread=6.0, t_sync=9.0)
    assert zipline(times) == Barrier(choice=(2, 1, 2), spread=4.0, t_sync=10.0)
    assert brute_force(times) == zipline(times)


def test_gridscan_designated_row_and_closeness_ties():
    """Algorithm 1 as read here: the designated row is worker 1 (earliest first time, 0), and
    of two equally close times the earlier is taken. Anchors 0, 2, 5 give {1, 0, 7} (d=7),
    {1, 2, 7} (d=6) and, with 1 and 9 both 4 from 5, {1, 5, 7} (d=6): barrier 7, spread 6.
    Designating worker 0 instead, or taking 9 on the tie, would find the optimum {9, 5, 9}."""
    times = [[1, 9, 12], [0, 2, 5], [7, 9, 10]]
    assert gridscan(times) == Barrier(choice=(0, 2, 0), spread=6.0, t_sync=7.0)
    assert zipline(times) == Barrier(choice=(1, 2, 1), spread=4.0, t_sync=9.0)


def test_ties_go_to_the_earliest_barrier_and_the_latest_time_in_it():
    assert zipline([[0, 10], [1, 11]]) == Barrier((0, 0), 1.0, 1.0)
    assert zipline([[5], [5], [5]]) == Barrier((0, 0, 0), 0.0, 5.0)
    assert zipline([[1, 1, 2], [1]]) == Barrier((1, 0), 0.0, 1.0)  # repeated time: the later one
    assert zipline([[3.0, 4.0, 8.0]]) == Barrier((0,), 0.0, 3.0)  # one worker: its first time
    assert zipline([[0, 4], [3, 7], [5, 6]]) == Barrier((1, 0, 0), 2.0, 5.0)  # {4, 3, 5}


def test_predict():
    assert predict(1.0, 0.5, 3) == [1.5, 2.0, 2.5]
    assert predict(2.0, 0.25, 1) == [2.25]
    assert predict(7.0, 0.0, 2) == [7.0, 7.0]  # allowed: a zero interval gives repeats
    assert predict(0.1, 0.1, 3) == [0.1 + 0.1, 0.1 + 2 * 0.1, 0.1 + 3 * 0.1]
    with pytest.raises(ValueError, match="r must be at least 1"):
        predict(0.0, 1.0, 0)
    with pytest.raises(ValueError, match="interval >= 0"):
        predict(0.0, -0.1, 3)
    with pytest.raises(ValueError, match="interval >= 0"):
        predict(0.0, float("nan"), 3)


@pytest.mark.parametrize("solve", SOLVERS)
@pytest.mark.parametrize(
    ("times", "message"),
    [
        ([], "times is empty"),
        ([[1.0, 2.0], []], "worker 1 has no predicted end times"),
        ([[1.0, 2.0], [3.0, 2.5]], r"worker 1's predicted end times must be ascending"),
        ([[0.0, 2.0, 1.0]], r"times\[0\]\[1\] = 2.0 > times\[0\]\[2\] = 1.0"),
        ([[0.0], [1.0, float("nan")]], "worker 1 has a non-finite"),
    ],
)
def test_bad_input_is_refused(solve, times, message):
    with pytest.raises(ValueError, match=message):
        solve(times)


def test_rows_may_start_below_the_previous_row_and_be_numpy():
    import numpy as np

    times = [[5.0, 6.0], [1.0, 5.5]]  # row 1 starts below row 0's end: not a descent
    assert zipline(times) == brute_force(times) == Barrier((0, 1), 0.5, 5.5)
    assert zipline(np.array(times)) == zipline(times)
    assert gridscan(np.array(times)) == gridscan(times)


def test_brute_force_refuses_huge_instances():
    with pytest.raises(ValueError, match="use zipline"):
        brute_force([list(range(10))] * 8)  # 10^8 choices
