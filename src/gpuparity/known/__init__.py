"""The known-issue base: backend bugs from public trackers, each with a rule over the platform
report, a crash-isolated probe and a remedy. `evaluate()` says which apply on a machine."""
from __future__ import annotations

from .engine import (CONFIRMED, DOES_NOT_APPLY, MAY_APPLY, RULED_OUT, STATUS_ORDER, KnownIssueResult,
                       evaluate, load_issues, load_platform, recommended_env, results_json, sort_results)

__all__ = ["CONFIRMED", "DOES_NOT_APPLY", "MAY_APPLY", "RULED_OUT", "STATUS_ORDER", "KnownIssueResult",
           "evaluate", "load_issues", "load_platform", "recommended_env", "results_json", "sort_results"]
