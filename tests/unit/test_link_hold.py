"""How long a real worker's inbox holds a message: the simulator's rule, from the message."""

import numpy as np
import pytest

from hopbus.heterogeneity import Heterogeneity, SlowdownScope, message_delay
from hopbus.transport.codec import Message
from hopbus.transport.inbox import link_hold, payload_bytes

UPDATE = {"w": np.zeros((10, 25), np.float32), "b": np.zeros(10, np.float32)}  # 1,040 bytes


def update(src: int, iteration: int) -> Message:
    return Message("update", src, iteration, UPDATE)


def test_no_link_no_hold():
    assert link_hold(Heterogeneity.from_spec("random:6", 3), 0, SlowdownScope.ITERATION) is None


def test_an_update_pays_its_bytes_and_an_ack_none():
    het = Heterogeneity.from_spec("link:2/1MB@0-1", 2)
    hold = link_hold(het, 1, SlowdownScope.COMPUTE)
    assert hold is not None
    assert payload_bytes(update(0, 3)) == 1040
    assert hold(update(0, 3)) == pytest.approx(0.002 + 1040e-6)
    assert hold(Message("ack", 0, 3, None)) == pytest.approx(0.002)
    big = link_hold(het, 1, SlowdownScope.COMPUTE, message_bytes=36_902_440)
    assert big is not None
    assert big(update(0, 3)) == pytest.approx(0.002 + 36.90244)  # --message-bytes wins
    assert big(Message("ack", 0, 3, None)) == pytest.approx(0.002)  # an ACK stays empty


def test_iteration_scope_holds_as_the_simulator_schedules():
    het = Heterogeneity.from_spec("random:5:0.5+machines:1,1@1/100kB", 2, seed=4)
    hold = link_hold(het, 1, SlowdownScope.ITERATION)
    assert hold is not None
    factors = set()
    for k in range(40):
        expected = message_delay(het, 0, 1, k, 1040, scope=SlowdownScope.ITERATION)
        assert hold(update(0, k)) == pytest.approx(expected)
        factors.add(het.factor(0, k))
        assert expected == pytest.approx(het.factor(0, k) * (0.001 + 1040 / 100_000))
    assert factors == {1.0, 5.0}
