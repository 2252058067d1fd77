"""Hypothesis profiles for the fuzz suite: `ci` (default, bounded: the whole suite in well under
2 minutes on 2 cores) and `long` (HYPOTHESIS_PROFILE=long, for a search on demand)."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                      HealthCheck.function_scoped_fixture])
settings.register_profile("ci", max_examples=25, derandomize=True, **_COMMON)
settings.register_profile("long", max_examples=2000, **_COMMON)
settings.register_profile("dev", max_examples=300, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
