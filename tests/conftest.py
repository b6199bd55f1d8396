import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/helpers.py

from hypothesis import HealthCheck, settings

_common = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("default", max_examples=150, **_common)
settings.register_profile("thorough", max_examples=3000, **_common)  # HYPOTHESIS_PROFILE=thorough
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# A shell starts background jobs (`pytest &`, nohup) with SIGINT ignored, and children inherit
# that: the Ctrl-C tests' hopbus processes would never see their SIGINT. Give them the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def redis_url():
    """A real redis-server of the tests' own, on a free port on 127.0.0.1 (never the machine's
    6379). Tests share it and keep apart by using their own run ids."""
    from hopbus.coord.broker import EmbeddedRedis

    with EmbeddedRedis(port=0) as server:
        yield server.url


@pytest.fixture
def redis_client(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
