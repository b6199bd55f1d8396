"""The launcher's flapping rule (runtime/launcher.Outage), apart from any Redis: fault
``flapping_broker`` (answers, then drops the connection, again and again) ends the run once
--timeout has passed since the outage began; a broker that holds for STEADY_S starts afresh."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hopbus.runtime.launcher import STEADY_S, Outage


def test_one_note_per_outage_and_the_timeout_counts_from_its_first_loss():
    o = Outage(timeout=10.0)
    assert o.lost(100.0) == (True, False)  # the first loss: noted
    o.answered(100.5)  # answered again, but not for STEADY_S yet
    assert o.lost(100.9) == (False, False)  # the same outage: no second note
    o.answered(101.0)
    assert o.lost(110.5) == (False, True)  # 10.5 s since the first loss: give up


def test_a_broker_that_holds_for_steady_s_starts_a_new_outage():
    o = Outage(timeout=10.0)
    o.lost(100.0)
    o.answered(100.0 + STEADY_S / 2)
    o.answered(100.0 + STEADY_S * 2)  # looks went through for longer than STEADY_S
    assert o.since is None
    assert o.lost(109.0) == (True, False)
    assert o.lost(118.0) == (False, False)  # 9 s into the new outage
    assert o.lost(119.5)[1]


@given(
    gaps=st.lists(st.floats(0.0, STEADY_S * 0.99), min_size=1, max_size=60),
    timeout=st.floats(0.5, 20.0),
)
def test_flapping_faster_than_steady_s_ends_once_timeout_has_passed(gaps, timeout):
    """Losses at most STEADY_S apart, with answers between them: never more than one note,
    and the rule gives up exactly when the time since the first loss exceeds timeout."""
    o = Outage(timeout=timeout)
    now, start, notes = 50.0, 50.0, 0
    for gap in gaps:
        first, too_long = o.lost(now)
        notes += first
        assert too_long == (now - start > timeout)
        o.answered(now + gap / 2)
        now += gap
    assert notes == 1
