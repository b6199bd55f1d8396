"""Iteration-time statistics of the summary object."""

from hopbus import summary


def test_p50_sample_stays_bounded_and_unbiased(monkeypatch):
    monkeypatch.setattr(summary, "P50_SAMPLE", 1000)
    stats = summary.RunStats(2)
    t = [0.0, 0.0]
    for k in range(1, 20001):
        for w in (0, 1):
            t[w] += 1.0 if w == 0 else 3.0  # half the steps take 1 s, half 3 s
            stats.enter(w, k, t[w])
    assert len(stats.steps) == 1000
    assert 0.4 < sum(s == 1.0 for s in stats.steps) / 1000 < 0.6
    assert stats.iter_time()["per_worker"] == [1.0, 3.0]
