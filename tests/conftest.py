import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/helpers.py

from hypothesis import HealthCheck, settings

_common = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("default", max_examples=150, **_common)
settings.register_profile("thorough", max_examples=3000, **_common)  # HYPOTHESIS_PROFILE=thorough
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
