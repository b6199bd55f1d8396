"""Fixtures the integration tests share (helpers they import are in cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    """A ZeroMQ context of the test's own, destroyed without lingering."""
    context = zmq.Context()
    yield context
    context.destroy(linger=0)
