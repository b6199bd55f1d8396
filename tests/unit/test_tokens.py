"""TokenQ semantics (Sec. 4.2): the in-memory ledger every other implementation must match."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopbus.protocol.tokens import TokenLedger


def test_put_take_size():
    t = TokenLedger()
    t.put(0, 1, 3)
    t.put(2, 1)
    assert t.size(0, 1) == 3 and t.size(2, 1) == 1 and t.size(1, 0) == 0
    assert t.can_take([0, 2], 1) and not t.can_take([0, 2], 1, count=2)
    assert t.short([0, 2], 1, count=2) == (2,)
    t.take([0, 2], 1)
    assert (t.size(0, 1), t.size(2, 1)) == (2, 0)


def test_taking_more_than_there_is_refused_and_changes_nothing_for_that_queue():
    t = TokenLedger()
    t.put(0, 1, 1)
    with pytest.raises(ValueError, match=r"TokenQ\(0->1\)"):
        t.take([0], 1, count=2)
    assert t.size(0, 1) == 1


@given(st.integers(1, 6), st.lists(st.sampled_from(["i", "j"]), max_size=80))
def test_theorem2_invariant_on_one_edge(max_ig, moves):
    """Edge i -> j (TokenQ(j->i) at j). j enters iterations freely; i only with a token.
    After every move, TokenQ(j->i).size == Iter(j) - Iter(i) + max_ig, and i never gets more
    than max_ig ahead of j."""
    i, j = 0, 1
    t = TokenLedger()
    t.put(j, i, max_ig)
    it = {i: 0, j: 0}
    for who in moves:
        if who == "j":
            it[j] += 1
            t.put(j, i)
        elif t.can_take([j], i):
            t.take([j], i)
            it[i] += 1
        assert t.size(j, i) == it[j] - it[i] + max_ig
        assert it[i] - it[j] <= max_ig
