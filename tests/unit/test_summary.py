"""Iteration-time statistics of the summary object."""

import pytest

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


def test_a_resumed_replay_starts_every_worker_in_the_checkpoint_iteration():
    """hopbus train --resume: every worker begins in iteration 40, so the first entries (of
    41) widen no gap and the step times count from 40, not from 0."""
    from helpers import complete3

    from hopbus.protocol.spec import ProtocolSettings
    from hopbus.runtime.progress import Replay

    r = Replay(complete3(), ProtocolSettings(max_ig=3).gap_setting, t0=0.0, start=40)
    for t, (w, it) in enumerate([(0, 41), (1, 41), (2, 41), (0, 42)], start=1):
        r.feed({"worker": w, "iter": it, "t": float(t)})
    assert r.out_of_order == 0 and r.monitor.violations == 0
    assert r.monitor.max_any == 1
    assert r.stats.iterations == [42, 41, 41]
    assert r.stats.iter_time()["per_worker"] == [4 / 2, 2 / 1, 3 / 1]
    assert r.stats.jumps == 0


def test_the_printed_summary_names_the_workers_a_run_went_on_without():
    """A backup run that lost a worker finishes (exit 0): its printed summary says whom it
    lost and where, as summary.json's lost_workers does."""
    from rich.console import Console

    from hopbus.cli import render
    from hopbus.config import RunConfig, make_config
    from hopbus.sim.run import simulate

    cfg = make_config({"workers": 4, "iterations": 20, "mode": "backup"}, cls=RunConfig)
    _, _, s = simulate(cfg)
    s["lost_workers"] = [{"worker": 1, "iteration": 5, "t": 0.5}]
    console = Console(record=True, width=200)
    render.summary(console, s)
    text = console.export_text()
    assert "lost workers" in text and "worker 1 in iteration 5" in text, text
    assert "went on without them" in text and "replacements" not in text
    s["rejoined_workers"] = [{"worker": 1, "iteration": 9, "t": 0.9}]
    console = Console(record=True, width=200)
    render.summary(console, s)
    assert "worker 1 from iteration 9 (hopbus worker --rejoin)" in console.export_text()


def test_the_summary_table_shows_a_final_loss_without_an_accuracy():
    """A regression's script reports a test loss and no accuracy: the model row says the
    loss; with both, both; with neither, that none was reported (and how to). A script's
    numbers are not called test numbers: it may have evaluated on a validation_split."""
    from rich.console import Console

    from hopbus.cli import render
    from hopbus.config import RunConfig, make_config
    from hopbus.sim.run import simulate

    _, _, s = simulate(make_config({"workers": 4, "iterations": 5}, cls=RunConfig))
    s["virtual"] = False
    for acc, loss, said in (
        (None, 0.0108, "final test loss 0.0108 (mean over workers)"),
        (0.96, 0.12, "final test accuracy 0.9600, loss 0.1200 (mean over workers)"),
        (None, None, "no test loss or accuracy reported (a script that evaluated nothing"),
    ):
        s["final_accuracy"], s["final_loss"] = acc, loss
        console = Console(record=True, width=200)
        render.summary(console, s)
        text = console.export_text()
        assert said in text, text
    assert s["finished"]
    s["final_accuracy"], s["final_loss"], s["config"]["model"] = 0.96, 0.12, "script"
    console = Console(record=True, width=200)
    render.summary(console, s)
    text = console.export_text()
    said = "final accuracy 0.9600, loss 0.1200 (mean over workers, as the scripts reported them)"
    assert said in text, text


def test_text_from_redis_is_shown_as_itself_never_as_markup():
    """Fault ``markup_in_a_value``: a stats key ``dropped_[/x]`` (a closing tag of nothing:
    rich raised MarkupError), a device and an event holding a link and a blink: each shows
    as the text it is, and nothing styles or links the terminal."""
    from rich.console import Console

    from hopbus.cli import render
    from hopbus.config import RunConfig, make_config
    from hopbus.sim.run import simulate

    cfg = make_config({"workers": 4, "iterations": 20}, cls=RunConfig)
    _, _, s = simulate(cfg)
    s["virtual"] = False
    s["dropped_frames"] = {"[/x]": 1, "[link=https://evil.example/x]y[/link]": 2}
    console = Console(record=True, width=300, force_terminal=True)
    render.summary(console, s)
    text = console.export_text(clear=False)
    assert "[/x] 1" in text and "[link=https://evil.example/x]y[/link] 2" in text, text
    assert "\x1b]8;" not in console.export_text(styles=True)  # no hyperlink (OSC 8) made


def test_inspect_shows_an_events_markup_as_text():
    """The same for inspect's events, whose extra fields it lists (a dict's repr of them
    doubled their escapes: '[/x]' raised MarkupError again, as the property test found)."""
    from rich.console import Console

    from hopbus.cli import render

    snap = {
        "run": "r", "status": "running", "workers": [], "token_queues": [], "misplaced": [],
        "config": {"topology": "ring", "mode": "standard", "iterations": 5, "max_ig": 5,
                   "backup": 1, "staleness": 0, "skip_max": 0, "approach": "parallel"},
        "gaps": {"max_adjacent": None, "max_any_pair": None, "dead": [],
                 "bound": {"adjacent": 1, "any_pair": 1}},
        "progress_entries": 1,
        "progress": [{"id": "1-0", "worker": "0", "iter": "1", "blocked_on": "[/x]"}],
        "events": [{"id": "2-0", "kind": "error", "worker": "0", "message": "[/x] [link=y]z"}],
    }  # fmt: skip
    console = Console(record=True, width=300)
    render.inspect(console, snap)
    text = console.export_text()
    assert "message=[/x] [link=y]z" in text and "on [/x]" in text, text


def test_a_mean_of_numbers_too_large_to_add_is_still_a_mean():
    """A loss of 1e308 on two workers: fmean's sum overflowed, and the launcher died with a
    traceback and no summary.json. Ordinary numbers get fmean's very value."""
    import math
    import statistics

    from hopbus.summary import mean

    assert mean([1e308, 1e308]) == 1e308
    assert mean([1.7e308, 1.7e308, -1.0]) == pytest.approx(1.7e308 / 3 * 2)
    assert math.isnan(mean([math.inf, -math.inf]))
    assert mean([math.inf, 1.0]) == math.inf
    values = [0.1, 0.2, 0.7, 1e-9, 3.0]
    assert mean(values) == statistics.fmean(values)
