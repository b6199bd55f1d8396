"""The curves of ``hopbus plot`` and the experiment figures that replay iteration changes: each
worker's mean iteration time (the summary's own rule) and the iteration gap over time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopbus.experiments.curves import gap_timeline, iteration_time_per_worker
from hopbus.summary import RunStats


def _e(worker: int, it: int, t: float, jump: int = 0) -> dict:
    return {"worker": worker, "iter": it, "jump": jump, "t": t, "loss": 1.0}


# Worker 2 never starts; worker 0 jumps from 2 to 5 (3 and 4 passed over); worker 1 repeats an
# iteration (a line that does not move it forward is skipped, as the summary's replay does).
ENTRIES = [
    _e(0, 1, 1.0),
    _e(1, 1, 1.5),
    _e(0, 2, 2.0),
    _e(0, 5, 3.0, jump=3),
    _e(1, 2, 4.0),
    _e(1, 2, 4.1),
    _e(3, 1, 5.0),
]


def test_iteration_time_per_worker_counts_jumped_iterations_and_leaves_out_idle_workers():
    per = iteration_time_per_worker(ENTRIES)
    assert per == {0: 3.0 / 5, 1: 4.0 / 2, 3: 5.0 / 1}  # worker 2 has no entry: not there


def test_iteration_time_per_worker_is_the_summarys_per_worker():
    stats = RunStats(4)
    for w, it, t in [(0, 1, 1.0), (1, 1, 1.5), (0, 2, 2.0), (0, 5, 3.0), (1, 2, 4.0), (3, 1, 5.0)]:
        stats.enter(w, it, t)
    summary = stats.iter_time()["per_worker"]
    assert summary[2] is None
    assert iteration_time_per_worker(ENTRIES) == {w: x for w, x in enumerate(summary) if x}


def test_gap_timeline_is_max_minus_min_over_started_workers_after_each_change():
    c = gap_timeline(ENTRIES)
    assert c.x == [1.0, 1.5, 2.0, 3.0, 4.0, 5.0]  # the repeated line at 4.1 adds no point
    # alone: 0; both in 1: 0; 2-1; the jump to 5: 5-1; worker 1 to 2: 5-2; worker 3 starts in 1
    assert c.y == [0.0, 0.0, 1.0, 4.0, 3.0, 4.0]


def test_gap_timeline_follows_the_slowest_worker_up():
    entries = [_e(0, 1, 0.1), _e(1, 1, 0.2), _e(0, 2, 0.3), _e(0, 3, 0.4), _e(1, 2, 0.5)]
    entries += [_e(1, 3, 0.6), _e(1, 4, 0.7)]
    assert gap_timeline(entries).y == [0.0, 0.0, 1.0, 2.0, 1.0, 0.0, 1.0]


def test_gap_timeline_keeps_the_file_order_and_never_goes_back_in_time():
    # worker 1's clock puts its change 0.4 ms before the one the stream has first
    entries = [_e(0, 1, 1.0), _e(1, 1, 0.9996), _e(0, 2, 1.2)]
    c = gap_timeline(entries)
    assert c.x == [1.0, 1.0, 1.2] and c.y == [0.0, 0.0, 1.0]


def test_lines_without_a_worker_an_iteration_or_a_time_are_ignored():
    junk = [{"worker": 0}, {"worker": "0", "iter": 1, "t": 1.0}, _e(0, 0, 1.0)]
    junk += [{"worker": 0, "iter": 1, "t": float("nan")}, {"worker": True, "iter": 1, "t": 1.0}]
    assert iteration_time_per_worker(junk) == {}
    assert gap_timeline(junk).x == []
    assert iteration_time_per_worker([*junk, _e(1, 2, 3.0)]) == {1: pytest.approx(1.5)}


def test_metrics_lines_no_run_could_write_are_passed_over(tmp_path):
    """Fault ``edited_metrics``: one line appended to metrics.jsonl with a worker id of 10**9
    (hopbus plot sized its per-worker tables by it: 23 GB), 10**30, or a t of 1e308 (an
    axis matplotlib cannot lay out) is passed over, as a line that does not parse is."""
    from hopbus.experiments.curves import read_metrics

    good = ['{"worker": 0, "iter": 1, "t": 0.5, "loss": 1.0}', '{"worker": 1, "iter": 1, "t": 0.6}']
    bad = [
        '{"worker": 1000000000, "iter": 1, "t": 0.1}',
        '{"worker": 1' + "0" * 30 + ', "iter": 1}',
        '{"worker": 1, "iter": 2, "t": 1e308}',
        '{"worker": 1, "iter": -1}',
        '{"worker": 2, "iter": 1}',
        '{"worker": true, "iter": 1}',
        "[" * 100_000,
        '{"worker": 1, "iter": 2, "t": NaN}',
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(good + bad) + "\n")
    with pytest.warns(UserWarning, match="metrics.jsonl: 8 lines passed over"):  # counted
        assert [e["worker"] for e in read_metrics(path, workers=2)] == [0, 1]
    with pytest.warns(UserWarning, match="7 lines passed over"):
        assert len(read_metrics(path)) == 3  # without the run's size: the most any graph has


def test_a_forged_jump_of_10_to_the_15_is_one_step_of_the_gap():
    """A metrics.jsonl line jumping a worker by 10**15 iterations (edited, or forged): the gap
    follows it at once (it walked up one iteration at a time: hopbus plot hung)."""
    far = 10**15
    entries = [_e(0, 1, 0.1), _e(1, 1, 0.2), _e(0, far, 0.3), _e(1, far + 2, 0.4)]
    assert gap_timeline(entries).y == [0.0, 0.0, far - 1.0, 2.0]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6)), max_size=40))
def test_gap_timeline_is_max_minus_min_of_where_the_started_workers_are(moves):
    where: dict[int, int] = {}
    expected = []
    t = 0.0
    entries = []
    for w, step in moves:
        t += 1.0
        it = where.get(w, 0) + step
        entries.append(_e(w, it, t))
        where[w] = it
        expected.append(float(max(where.values()) - min(where.values())))
    assert gap_timeline(entries).y == expected
