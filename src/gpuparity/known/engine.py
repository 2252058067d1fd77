"""Match the known-issue base against a platform report, then confirm or rule out each entry
that may apply with its probe, run crash-isolated in a process of its own (forked from a fork
server that imported torch once, or, for entries marked "probe_isolation": "spawn", a fresh one)."""
from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import json
import os
import re
import threading
from importlib import resources
from typing import Any, Callable, Dict, List, Optional, Sequence

from .. import platform as platform_mod
from ..cachedir import cache_dir, write_json
from ..isolate import ForkServer, call_isolated, describe_exit
from . import outcomes as kept_outcomes
from .rules import evaluate_rule, kernel_param_state, validate_rule

DOES_NOT_APPLY = "does not apply"
MAY_APPLY = "may apply"
CONFIRMED = "confirmed"      # its probe failed here (or crashed, or hung)
RULED_OUT = "ruled out"      # its probe passed here: not reproduced here
# Display order: what needs action first.
STATUS_ORDER = (CONFIRMED, MAY_APPLY, RULED_OUT, DOES_NOT_APPLY)

SCHEMA_VERSION = 1
PROBE_MODULE = "gpuparity.known.probes"
REQUIRED_FIELDS = ("id", "title", "symptom", "affects", "fixed_in", "rule", "probe", "remedy", "remedy_env",
                   "sources", "unconfirmed")
SCOPES = (MAY_APPLY, CONFIRMED)
# bug: broken here when confirmed; config: setup or install; behaviour: by design or documented,
# so a confirmed behaviour informs (e.g. TF32 in effect) without anything being broken.
KINDS = ("bug", "config", "behaviour", "limitation")
# How a probe's process starts: "fork" from the evaluation's fork server (torch imported once), or
# "spawn", a fresh interpreter, for a probe whose verdict depends on what a process reads when it
# starts (docs/known-issues.md, "How probes run").
ISOLATIONS = ("fork", "spawn")
# torch.nn.attention.SDPBackend names an entry's `sidestep_sdpa` may set aside (known/sidestep.py)
SDPA_KERNELS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")

Progress = Callable[[int, int, str], None]
VERSION_ONLY_NOTE = "only version ranges rule it out: not expected here, but a probe that can run here decides"


@dataclasses.dataclass
class KnownIssueResult:
    """One entry of the base as evaluated on one platform."""
    id: str
    title: str
    status: str                       # one of STATUS_ORDER
    why: List[str]                    # the facts and probe findings behind the status, in words
    remedy: str
    remedy_env: Dict[str, Optional[str]]
    sources: List[str]
    probe_outcome: Optional[Dict[str, Any]] = None
    probe: Optional[str] = None
    symptom: str = ""
    affects: str = ""
    fixed_in: str = ""
    unconfirmed: bool = False
    group: str = ""
    remedy_env_scope: str = MAY_APPLY
    kind: str = "bug"                 # one of KINDS
    # What the rule's version clauses say: True when they match (or cannot tell), False when
    # only a version range rules the entry out. An expectation, not a verdict: a probe that runs
    # here decides (evaluate), so a version rule never hides a bug a probe reproduces.
    expected: bool = True
    reviewed: str = ""                # the date the entry's sources were last read (YYYY-MM-DD)

    @property
    def applies(self) -> bool:
        """Confirmed here, or not ruled out by version, arch or probe."""
        return self.status in (CONFIRMED, MAY_APPLY)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- loading
_ISSUES: Optional[List[Dict[str, Any]]] = None


def _probe_names() -> set:
    from . import probes
    return set(getattr(probes, "PROBES", ()))


def validate_issue(issue: Any, probe_names: Optional[set] = None) -> None:
    """Raise ValueError naming the entry and field when an entry of the base is malformed."""
    if not isinstance(issue, dict):
        raise ValueError(f"known issue: expected a JSON object, got {type(issue).__name__}")
    where = f"known issue {issue.get('id', '?')!r}"
    missing = [field for field in REQUIRED_FIELDS if field not in issue]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    for field in ("title", "symptom"):   # what a reader of the base sees first: never blank
        if not isinstance(issue[field], str) or not issue[field].strip():
            raise ValueError(f"{where}: {field} must be a non-empty sentence, got {issue[field]!r}")
    validate_rule(issue["rule"], f"{where}: rule")
    probe = issue["probe"]
    if probe is not None and probe_names is not None and probe not in probe_names:
        raise ValueError(f"{where}: probe {probe!r} is not a probe in {PROBE_MODULE}")
    if not isinstance(issue["remedy_env"], dict):
        raise ValueError(f"{where}: remedy_env must be an object of variable -> value (null = unset)")
    if issue.get("remedy_env_scope", MAY_APPLY) not in SCOPES:
        raise ValueError(f"{where}: remedy_env_scope must be one of {SCOPES}, got {issue.get('remedy_env_scope')!r}")
    if issue.get("kind", "bug") not in KINDS:
        raise ValueError(f"{where}: kind must be one of {KINDS}, got {issue.get('kind')!r}")
    if not isinstance(issue["sources"], list):
        raise ValueError(f"{where}: sources must be a list")
    for entry in issue.get("avoid", []):   # backends a confirmed issue rules out (known/avoid.py)
        if not (isinstance(entry, dict) and isinstance(entry.get("op"), str) and isinstance(entry.get("backend"), str)
                and set(entry) <= {"op", "backend", "dtype", "device", "when"}):
            raise ValueError(f"{where}: avoid entries must be objects with op and backend (and optionally dtype, "
                             f"device, when), got {entry!r}")
        if "when" in entry:
            validate_regime(entry["when"], f"{where}: avoid")
    if issue.get("probe_isolation", "fork") not in ISOLATIONS:
        raise ValueError(f"{where}: probe_isolation must be one of {ISOLATIONS}, got {issue.get('probe_isolation')!r}")
    if not isinstance(issue.get("no_probe", ""), str):
        raise ValueError(f"{where}: no_probe must be a sentence saying why there is no probe")
    # SDPA kernels (SDPBackend names): whose raised fault the entry is (its error_markers tell it
    # apart), and whose silent wrong numbers it describes (checks/attribute.py lists those entries)
    for field, what in (("sidestep_sdpa", "whose fault it is"), ("wrong_sdpa", "whose wrong numbers it describes")):
        kernels = issue.get(field, [])
        if not (isinstance(kernels, list) and all(name in SDPA_KERNELS for name in kernels)):
            raise ValueError(f"{where}: {field} must be a list of the SDPA kernels {what}, from {SDPA_KERNELS}, "
                             f"got {kernels!r}")
    if issue.get("sidestep_sdpa") and not issue.get("error_markers"):
        raise ValueError(f"{where}: sidestep_sdpa needs error_markers (the error it tells apart)")
    reviewed = issue.get("reviewed")
    if reviewed is not None and not (isinstance(reviewed, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", reviewed)):
        raise ValueError(f"{where}: reviewed must be a date YYYY-MM-DD, got {reviewed!r}")


def validate_regime(when: Any, where: str) -> None:
    """Raise ValueError naming the entry when an avoid entry's `when` is not a regime (a shape rule
    over a call's Problem features, known/avoid.py)."""
    if not isinstance(when, dict) or not when:
        raise ValueError(f"{where}: when must be a non-empty object of regime clauses, got {when!r}")
    for key, value in when.items():
        if key.endswith("_mod"):
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(n, int) for n in value)
                    and value[0] > 0):
                raise ValueError(f"{where}: when.{key} must be [modulus, remainder] (integers), got {value!r}")
        elif not isinstance(value, (bool, int, str)):
            raise ValueError(f"{where}: when.{key} must be a bool, int or string, got {value!r}")


def load_issues() -> List[Dict[str, Any]]:
    """Every entry of the base (a fresh copy), validated."""
    global _ISSUES
    if _ISSUES is None:
        text = resources.files("gpuparity.known").joinpath("issues.json").read_text(encoding="utf-8")
        data = json.loads(text)
        issues = data["issues"] if isinstance(data, dict) else data
        names = _probe_names()
        seen = set()
        for issue in issues:
            validate_issue(issue, names)
            if issue["id"] in seen:
                raise ValueError(f"known issue {issue['id']!r}: duplicate id")
            seen.add(issue["id"])
        _ISSUES = issues
    return copy.deepcopy(_ISSUES)


def load_platform(path: str) -> Dict[str, Any]:
    """A saved `gpuparity env --json` report. ValueError (naming the file) when it is not one."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"--platform: no such file: {path}")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--platform: {path} is not valid JSON ({exc}); expected the output of "
                         "`gpuparity env --json`") from None
    if isinstance(data, dict) and "schema_version" not in data and isinstance(data.get("platform"), dict):
        data = data["platform"]  # a report that embeds the platform, e.g. doctor --json
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ValueError(f"--platform: {path} has no schema_version; expected the output of `gpuparity env --json`")
    if data["schema_version"] != platform_mod.SCHEMA_VERSION:
        raise ValueError(f"--platform: {path} has schema_version {data['schema_version']!r}; this gpuparity "
                         f"reads schema_version {platform_mod.SCHEMA_VERSION}")
    return data


# --------------------------------------------------------------------------- evaluation
def default_device(report: Dict[str, Any]) -> str:
    if report.get("vendor") in ("amd", "nvidia") and report.get("cuda_available") is True:
        return "cuda:0"
    return "cpu"


def _is_this_machine(report: Dict[str, Any]) -> bool:
    here = platform_mod.current()
    return (report is here or (report.get("hostname") == here.get("hostname")
                               and platform_mod.fingerprint_key(report) == platform_mod.fingerprint_key(here)))


def _gpu_only(issue: Dict[str, Any]) -> bool:
    """Whether the probe says nothing on a CPU device: explicit in the entry, else implied by a
    top-level vendor clause that excludes CPU builds (a CUDA bug cannot be ruled out on a CPU)."""
    if "probe_needs_gpu" in issue:
        return bool(issue["probe_needs_gpu"])
    vendor = issue["rule"].get("vendor")
    if vendor is None:
        return False
    vendors = [vendor] if isinstance(vendor, str) else list(vendor)
    return "cpu" not in vendors


def _kernel_param_notes(issue: Dict[str, Any], report: Dict[str, Any]) -> List[str]:
    params = issue.get("remedy_kernel_params") or []
    if not params:
        return []
    states = {param: kernel_param_state(report, param) for param in params}
    if any(not isinstance(state, bool) for state in states.values()):
        return ["the kernel command line could not be read, so it is unknown whether the remedy's kernel "
                f"parameters ({' '.join(params)}) are set"]
    present = [p for p, state in states.items() if state]
    absent = [p for p, state in states.items() if not state]
    if not absent:
        return [f"the remedy's kernel parameters are already set here ({' '.join(present)})"]
    if present:
        return [f"kernel parameters: {' '.join(present)} already set; {' '.join(absent)} not set"]
    return [f"the remedy's kernel parameters are not set here ({' '.join(absent)})"]


def _rule_status(issue: Dict[str, Any], report: Dict[str, Any]) -> KnownIssueResult:
    rule = evaluate_rule(issue["rule"], report)
    if rule.applies:
        status = MAY_APPLY
        why = rule.matched + [f"cannot tell: {text}" for text in rule.unknown] + rule.soft_missed
        why += _kernel_param_notes(issue, report)
    else:
        status = DOES_NOT_APPLY
        why = list(rule.missed)
        if rule.version_only:
            why.append(VERSION_ONLY_NOTE)
    why = list(dict.fromkeys(why))  # clauses of one rule often share a sentence (the build)
    return KnownIssueResult(
        id=issue["id"], title=issue["title"], status=status, why=why, remedy=issue["remedy"],
        remedy_env=dict(issue["remedy_env"]), sources=list(issue["sources"]), probe=issue["probe"],
        symptom=issue["symptom"], affects=issue["affects"], fixed_in=issue["fixed_in"],
        unconfirmed=bool(issue["unconfirmed"]), group=issue.get("group", ""),
        remedy_env_scope=issue.get("remedy_env_scope", MAY_APPLY), kind=issue.get("kind", "bug"),
        expected=rule.applies, reviewed=str(issue.get("reviewed", "")))


def _version_excluded(issue: Dict[str, Any], report: Dict[str, Any]) -> bool:
    """Ruled out by version ranges alone: the platform is the kind the entry is about."""
    rule = evaluate_rule(issue["rule"], report)
    return not rule.applies and rule.version_only


_EVIDENCE = re.compile(r"(?i)error|fault|violation|illegal|abort|exception|denied|killed|timed? ?out")
_NOISE = ("Fatal Python error", "Current thread", "Thread 0x", "Stack (most recent", "  File ", "Extension modules")


def evidence_line(stderr_tail: str) -> str:
    """The most telling line of a crashed probe's stderr: the first error-like line that is not
    the interpreter's own crash banner or traceback, else the banner, else the last line."""
    lines = [line.strip() for line in (stderr_tail or "").splitlines() if line.strip()]
    for line in lines:
        if _EVIDENCE.search(line) and not line.startswith(_NOISE):
            return line[:300]
    for line in lines:
        if line.startswith("Fatal Python error"):
            return line[:300]
    return lines[-1][:300] if lines else ""


def run_probe(issue: Dict[str, Any], device: str, timeout: float,
              server: Optional[ForkServer] = None) -> Dict[str, Any]:
    """Run the entry's probe in a process of its own (forked from `server` unless the entry says
    "probe_isolation": "spawn"); the outcome as a JSON-able dict with "verdict": CONFIRMED /
    RULED_OUT / MAY_APPLY (inconclusive) and the evidence."""
    target = f"{PROBE_MODULE}:{issue['probe']}"
    limit = float(timeout) * float(issue.get("probe_timeout_factor", 1))
    call = server.call if server is not None and issue.get("probe_isolation", "fork") == "fork" else call_isolated
    outcome = call(target, {"device": device}, timeout=limit)
    waited = f"{limit:g} s"
    if outcome.status == "timeout":
        # A loaded machine (the doctor's battery runs alongside) can make a probe miss its limit:
        # a hang is only a hang if it happens again, with twice the time.
        outcome = call(target, {"device": device}, timeout=2 * limit)
        waited = f"{limit:g} s, nor within {2 * limit:g} s on a second try"
    record: Dict[str, Any] = {"target": target, "device": device, "status": outcome.status,
                              "duration_s": round(outcome.duration_s, 3), "runner": outcome.runner}
    if outcome.status in ("crash", "timeout"):
        what = (f"the probe process {describe_exit(outcome.returncode)} before answering" if outcome.status == "crash"
                else f"the probe gave no answer within {waited} (a hang?)")
        evidence = evidence_line(outcome.stderr_tail)
        record.update(verdict=CONFIRMED, failed=True, stderr_tail=outcome.stderr_tail,
                      detail=what + (f"; stderr: {evidence}" if evidence else ""))
        return record
    if outcome.status == "error":
        record.update(verdict=MAY_APPLY, failed=None, stderr_tail=outcome.stderr_tail,
                      detail=f"the probe raised {outcome.error}")
        return record
    value = outcome.value if isinstance(outcome.value, dict) else {}
    failed = value.get("failed")
    detail = str(value.get("detail", "")) or "the probe gave no detail"
    measured = {k: v for k, v in value.items() if k not in ("failed", "detail")}
    verdict = CONFIRMED if failed is True else RULED_OUT if failed is False else MAY_APPLY
    record.update(verdict=verdict, failed=failed, detail=detail, measured=measured)
    return record


def evaluate(platform: Optional[Dict[str, Any]] = None, *, probes: bool = True, device: Optional[str] = None,
             timeout: float = 60, progress: Optional[Progress] = None, ids: Optional[Sequence[str]] = None,
             issues: Optional[List[Dict[str, Any]]] = None, probe_workers: int = 4,
             probe_isolation: str = "fork", reuse_outcomes: bool = False) -> List[KnownIssueResult]:
    """Every entry of the base on this machine (platform=None) or on a saved platform report.

    Rules decide "does not apply" / "may apply". With probes=True and the report being this
    machine's, each entry that may apply and has a probe is confirmed or ruled out by running
    the probe crash-isolated on `device` (default: the first GPU, else the CPU); a crash or
    hang of the probe counts as confirmed. The probe decides, not the version rule: an entry
    whose rule misses only on version ranges (torch, ROCm, CUDA, cuDNN, ...) is probed too, and
    a failing probe confirms it ("not expected here by version" stays in its why); only when
    its probe cannot run or cannot tell does the version rule's "does not apply" stand. A
    saved report from another machine is judged by its rules only. `ids` limits the evaluation to those entries; `timeout` is per probe;
    `issues` replaces the base (for tests and experiments with new entries). `probe_workers`:
    probes side by side on a GPU (one on the CPU). `probe_isolation`: "fork" forks each probe from
    one fork server that imported torch and the probes once (entries marked "spawn" still start
    fresh); "spawn" starts a fresh interpreter for every probe. Every decisive outcome is kept
    for this platform (known/outcomes.py); `reuse_outcomes` (doctor --quick) lets a kept one stand
    for running its probe again, marked "reused" with when it was probed.
    """
    if platform is not None and not isinstance(platform, dict):
        raise TypeError(f"platform: expected a platform report dict (gpuparity.platform.collect()), "
                        f"got {type(platform).__name__}")
    report = platform_mod.current() if platform is None else platform
    entries = load_issues() if issues is None else issues
    if issues is not None:
        for issue in issues:
            validate_issue(issue)
    if ids is not None:
        wanted = list(ids)
        unknown_ids = sorted(set(wanted) - {issue["id"] for issue in entries})
        if unknown_ids:
            raise ValueError(f"ids: no known issue {', '.join(unknown_ids)}")
        entries = [issue for issue in entries if issue["id"] in wanted]
    if timeout is None or float(timeout) <= 0:
        raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
    if probe_isolation not in ISOLATIONS:
        raise ValueError(f"probe_isolation: expected one of {ISOLATIONS}, got {probe_isolation!r}")
    if isinstance(probe_workers, bool) or not isinstance(probe_workers, int) or probe_workers < 1:
        raise ValueError(f"probe_workers: expected an integer >= 1, got {probe_workers!r}")

    if device is not None:
        _check_device(device)

    results = [_rule_status(issue, report) for issue in entries]
    run_probes = probes and (platform is None or _is_this_machine(report))
    if not run_probes:
        return results

    device = device or default_device(report)
    on_cpu = device.split(":")[0] == "cpu"
    pending = [(issue, result) for issue, result in zip(entries, results)
               if issue["probe"] and (result.status == MAY_APPLY or _version_excluded(issue, report))]
    runnable = []
    for issue, result in pending:
        if on_cpu and _gpu_only(issue):
            if result.expected:   # an entry the versions rule out stays quiet about its probe
                result.why.append(f"probe {issue['probe']} not run: it needs a GPU device, and the device is {device}")
        else:
            runnable.append((issue, result))
    lock = threading.Lock()
    finished = [0]
    outcomes_path = probe_outcomes_path(report)
    kept = kept_outcomes.load(outcomes_path) if reuse_outcomes else {}
    fresh: Dict[str, Dict[str, Any]] = {}

    codes = {issue["id"]: kept_outcomes.code_key(issue, PROBE_MODULE) for issue, _ in runnable}
    reused: Dict[str, Dict[str, Any]] = {}
    for issue_id, code in codes.items():
        outcome = kept_outcomes.reusable(kept.get(issue_id), code)
        if outcome is not None:
            reused[issue_id] = outcome

    def probe_one(item) -> None:
        issue, result = item
        outcome = reused.get(issue["id"])
        if outcome is None:
            outcome = run_probe(issue, device, timeout, server)
            if outcome["verdict"] in kept_outcomes.REUSABLE_VERDICTS:
                with lock:
                    fresh[issue["id"]] = kept_outcomes.entry(outcome, codes[issue["id"]])
        with lock:
            result.probe_outcome = outcome
            if outcome["verdict"] != MAY_APPLY or result.expected:
                result.status = outcome["verdict"]
            # else: the probe could not tell, so the version rule's "does not apply" stands
            prefix = {CONFIRMED: "probe failed here", RULED_OUT: "not reproduced here, its probe passed"}.get(
                outcome["verdict"], "probe inconclusive")
            if outcome.get("reused"):
                prefix += f" (at {outcome['probed_at']}, on this platform; kept by --quick)"
            if outcome["verdict"] == CONFIRMED and not result.expected:
                prefix += ", although its version rule did not expect it here"
            result.why.append(f"{prefix}: {outcome['detail']}")
            finished[0] += 1
            if progress:
                progress(finished[0], len(runnable), issue["id"])

    # Each probe is its own process; on a GPU a few run side by side (each its own CUDA context),
    # the longest first (as they took here last time: the last to start should be short ones).
    # On the CPU they run one at a time: the cores are the compute.
    for item in runnable:
        if item[0]["id"] in reused:
            probe_one(item)
    to_run = [item for item in runnable if item[0]["id"] not in reused]
    workers = 1 if on_cpu else max(1, min(probe_workers, len(to_run)))
    times_path = probe_times_path(report) if not on_cpu else None
    if times_path:
        to_run = longest_first(to_run, load_probe_times(times_path))
    forked = probe_isolation == "fork" and any(issue.get("probe_isolation", "fork") == "fork" for issue, _ in to_run)
    server = ForkServer(preload=[PROBE_MODULE]) if forked else None
    try:
        if server is not None:
            server.start()   # torch imports in the zygote while the first probes are handed out
        if workers == 1:
            for item in to_run:
                probe_one(item)
        else:
            with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(probe_one, to_run))
    finally:
        if server is not None:
            server.close()
    if fresh:
        kept_outcomes.save(outcomes_path, fresh)
    if times_path:
        save_probe_times(times_path, {issue["probe"]: result.probe_outcome["duration_s"] for issue, result in to_run
                                      if isinstance(result.probe_outcome, dict)
                                      and isinstance(result.probe_outcome.get("duration_s"), (int, float))})
    if progress:
        progress(len(runnable), len(runnable), "")
    return results


def probe_outcomes_path(report: Dict[str, Any]) -> str:
    """Where this platform's decisive probe outcomes are kept (beside the verdict cache)."""
    return os.path.join(cache_dir(), f"probe-outcomes-{platform_mod.fingerprint_key(report)}.json")


def probe_times_path(report: Dict[str, Any]) -> str:
    """Where the seconds each probe took on this platform are kept (beside the verdict cache)."""
    return os.path.join(cache_dir(), f"probe-times-{platform_mod.fingerprint_key(report)}.json")


def load_probe_times(path: str) -> Dict[str, float]:
    """Probe name -> seconds it took here last time; {} when none were kept or the file is unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return {name: float(seconds) for name, seconds in data.items()
            if isinstance(name, str) and isinstance(seconds, (int, float))} if isinstance(data, dict) else {}


def save_probe_times(path: str, times: Dict[str, float]) -> None:
    """Merge `times` into the file at `path`; a cache that cannot be written only costs the order."""
    write_json(path, {**load_probe_times(path), **{name: round(float(s), 3) for name, s in times.items()}})


def longest_first(runnable: List[Any], seconds: Dict[str, float]) -> List[Any]:
    """(issue, result) pairs ordered by the seconds each probe took last time, longest first;
    probes never timed here come first (they may be long), in the base's order."""
    return sorted(runnable, key=lambda item: -seconds.get(item[0]["probe"], float("inf")))


def _check_device(device: str) -> None:
    import torch
    if not isinstance(device, str):
        raise TypeError(f"device: expected a string such as 'cuda:0' or 'cpu', got {type(device).__name__}")
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: {device!r} is not a torch device ({exc}); expected e.g. 'cuda:0' or 'cpu'") from None


def recommended_env(platform: Optional[Dict[str, Any]] = None,
                    results: Optional[List[KnownIssueResult]] = None) -> Dict[str, Optional[str]]:
    """Environment variables from the remedies of entries that apply here.

    Merge rule: confirmed entries first, then those that may apply, each group in the order
    of the base; the first value a variable gets wins. An entry whose remedy_env_scope is
    "confirmed" contributes only when its probe confirmed it (its remedy costs speed or could
    break a working setup, so a version match alone is not enough). A value of None means the
    remedy unsets that variable. Without `results`, the platform (default: this machine) is
    judged by its rules only.
    """
    if results is None:
        results = evaluate(platform, probes=False)
    env: Dict[str, Optional[str]] = {}
    for status in (CONFIRMED, MAY_APPLY):
        for result in results:
            if result.status != status:
                continue
            if status == MAY_APPLY and result.remedy_env_scope == CONFIRMED:
                continue
            for name, value in result.remedy_env.items():
                env.setdefault(name, value)
    return env


def sort_results(results: List[KnownIssueResult]) -> List[KnownIssueResult]:
    """Grouped by status in STATUS_ORDER, keeping the base's order inside each group."""
    rank = {status: index for index, status in enumerate(STATUS_ORDER)}
    return sorted(results, key=lambda r: rank.get(r.status, len(rank)))


def results_json(results: List[KnownIssueResult], report: Dict[str, Any], *, probes_ran: bool) -> Dict[str, Any]:
    """The document `gpuparity known-issues --json` writes."""
    return {
        "schema_version": SCHEMA_VERSION,
        "fingerprint": platform_mod.fingerprint_key(report),
        "platform": report,
        "probes_ran": probes_ran,
        "counts": {status: sum(1 for r in results if r.status == status) for status in STATUS_ORDER},
        "recommended_env": recommended_env(report, results),
        "results": [r.to_dict() for r in results],
    }
