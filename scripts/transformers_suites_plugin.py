"""pytest plugin for scripts/transformers_suites.py: runs transformers' own model tests with
gpuparity in the models, and records every test's outcome.

Load it with `-p transformers_suites_plugin` (this folder on PYTHONPATH) and
`--gpuparity-mode MODE --gpuparity-report FILE.json`. Modes:

  baseline  nothing changed: what the suite gives in this environment without gpuparity
  impl      attn_implementation="gpuparity" for every model built without an explicit choice
            (transformers' default would be "sdpa"); an explicit "eager"/"sdpa" in a test is kept
  patch     gpuparity.patch(model) on every model right after its post_init (the outermost model
            only: a composite's sub-models are patched with it)

The suites build models as `model_class(config)` (or from_pretrained, which builds the same
way): the attention is chosen in PreTrainedModel._check_and_adjust_attn_implementation (None
means "the default") and post_init ends every model's __init__, so those two are the hooks.

Each test's record says whether it asserts an attention implementation's name (its source
compares _attn_implementation with a name, as `self.assertEqual(model.config._attn_implementation,
"sdpa")`, or its failure compares "gpuparity" with one): such a test fails by design in `impl`
mode, an expected difference rather than a finding.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import sys
import time
from typing import Any, Callable, Dict, Optional

MODES = ("baseline", "impl", "patch")
NAME = "gpuparity"

# An assertion that names an attention implementation: compares _attn_implementation (or an
# attn_implementation argument's effect) with a string.
_ASSERTS_NAME = re.compile(
    r"(assert\w*\s*\(?[^\n]*_attn_implementation[^\n]*[\"'](?:eager|sdpa|flash_attention_\w+|flex_attention)[\"'])"
    r"|(assert\w*\s*\(?[^\n]*[\"'](?:eager|sdpa|flash_attention_\w+|flex_attention)[\"'][^\n]*_attn_implementation)")

# A failure that compares "gpuparity" with another implementation's name (the assertion sits in
# a helper the test calls, which its own source does not show): "'gpuparity' != 'sdpa'".
_IMPLEMENTATIONS = r"(?:eager|sdpa|flash_attention_\w+|flex_attention)"
_NAME_IN_FAILURE = re.compile(rf"['\"]gpuparity['\"]\s*[!=]=\s*['\"]{_IMPLEMENTATIONS}['\"]"
                              rf"|['\"]{_IMPLEMENTATIONS}['\"]\s*[!=]=\s*['\"]gpuparity['\"]")

_state: Dict[str, Any] = {"mode": "baseline", "installed": [], "models": 0, "patched": 0, "patch_errors": [],
                          "defaulted": 0, "patched_types": []}
_tests: Dict[str, Dict[str, Any]] = {}     # nodeid -> its record


def asserts_implementation_name(function: Optional[Callable]) -> bool:
    """Whether a test function's source asserts an attention implementation's name."""
    if function is None:
        return False
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return bool(_ASSERTS_NAME.search(source))


# --------------------------------------------------------------------------- installing a mode
def _enclosing_model_init(model) -> bool:
    """True while `model` is built inside another transformers model's __init__ (a sub-model of a
    composite): the outer model's post_init comes later and patches the whole."""
    from transformers import PreTrainedModel
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            if owner is not model and isinstance(owner, PreTrainedModel):
                return True
        frame = frame.f_back
    return False


def install(mode: str) -> None:
    """Change transformers for `mode` (see the module docstring); uninstall() undoes it."""
    if mode not in MODES:
        raise ValueError(f"--gpuparity-mode: expected one of {', '.join(MODES)}, got {mode!r}")
    uninstall()
    _state.update(mode=mode, models=0, patched=0, patch_errors=[], defaulted=0, patched_types=[])
    if mode == "baseline":
        return
    from transformers import PreTrainedModel
    if mode == "impl":
        from gpuparity.integrations import transformers as hf
        hf.register()
        original = getattr(PreTrainedModel, "_check_and_adjust_attn_implementation", None)
        if original is None:
            import transformers
            raise RuntimeError(f"--gpuparity-mode impl: transformers {transformers.__version__} has no "
                               "PreTrainedModel._check_and_adjust_attn_implementation to default the attention "
                               "implementation through (transformers 5 has it); use --gpuparity-mode patch")

        def check_and_adjust(self, attn_implementation=None, *args, **kwargs):
            # None is "transformers' default" (sdpa); a model that cannot take a registered
            # implementation keeps transformers' own choice
            if attn_implementation is None and getattr(self, "_supports_attention_backend", False):
                attn_implementation = NAME
                _state["defaulted"] += 1
            return original(self, attn_implementation, *args, **kwargs)

        PreTrainedModel._check_and_adjust_attn_implementation = check_and_adjust
        _state["installed"].append(("_check_and_adjust_attn_implementation", original))
    elif mode == "patch":
        import gpuparity
        original = PreTrainedModel.post_init

        def post_init(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            _state["models"] += 1
            if not _enclosing_model_init(self):
                try:
                    gpuparity.patch(self)
                except Exception as exc:
                    _state["patch_errors"].append(f"{type(self).__name__}: {type(exc).__name__}: {exc}"[:300])
                    raise
                _state["patched"] += 1
                _state["patched_types"].append(type(self).__name__)
            return result

        PreTrainedModel.post_init = post_init
        _state["installed"].append(("post_init", original))


def uninstall() -> None:
    if not _state["installed"]:
        return
    from transformers import PreTrainedModel
    for name, original in reversed(_state["installed"]):
        setattr(PreTrainedModel, name, original)
    _state["installed"] = []


# --------------------------------------------------------------------------- pytest hooks
def pytest_addoption(parser) -> None:
    group = parser.getgroup("gpuparity", "gpuparity in transformers' own test suites")
    group.addoption("--gpuparity-mode", default="baseline", choices=MODES,
                    help="baseline (nothing changed), impl (attn_implementation='gpuparity' by default) or "
                         "patch (gpuparity.patch after post_init)")
    group.addoption("--gpuparity-report", default=None, metavar="FILE",
                    help="write every test's outcome here (JSON)")


def pytest_configure(config) -> None:
    install(config.getoption("gpuparity_mode"))
    _tests.clear()
    _state["started"] = time.time()


def _entry(nodeid: str) -> Dict[str, Any]:
    return _tests.setdefault(nodeid, {"nodeid": nodeid, "outcome": "not run", "duration_s": 0.0, "message": "",
                                      "asserts_implementation_name": False})


def pytest_collection_modifyitems(session, config, items) -> None:
    for item in items:
        _entry(item.nodeid)["asserts_implementation_name"] = asserts_implementation_name(
            getattr(item, "function", None))


def _message(report) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])[:500]
    crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
    return str(crash if crash is not None else report.longrepr or "")[:1000]


def pytest_runtest_logreport(report) -> None:
    entry = _entry(report.nodeid)
    entry["duration_s"] = round(entry["duration_s"] + report.duration, 3)
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "skipped"
    elif report.when == "call":
        outcome = "passed"
    else:
        return   # a setup or teardown that passed: the call decides
    if entry["outcome"] in ("failed", "error") and outcome not in ("failed", "error"):
        return   # a failure is not undone by a later phase
    entry["outcome"] = outcome
    if outcome != "passed":
        entry["message"] = _message(report)
        if outcome in ("failed", "error") and _NAME_IN_FAILURE.search(entry["message"]):
            entry["asserts_implementation_name"] = True


def pytest_sessionfinish(session, exitstatus) -> None:
    uninstall()
    path = session.config.getoption("gpuparity_report")
    if not path:
        return
    data = {"mode": _state["mode"], "exit_status": int(exitstatus),
            "seconds": round(time.time() - _state.get("started", time.time()), 1),
            "models_built": _state["models"], "models_patched": _state["patched"],
            "defaulted_to_gpuparity": _state["defaulted"], "patch_errors": _state["patch_errors"][:20],
            "tests": list(_tests.values())}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
