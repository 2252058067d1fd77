"""The data file: complete against shared/knowledge/known-issues.md, well formed, documented."""
import os
import re

import pytest

from gpuparity import platform as platform_mod
from gpuparity.known import load_issues
from gpuparity.known import probes
from gpuparity.known.engine import validate_issue
from gpuparity.known.rules import describe_rule, validate_rule
from gpuparity.report.known_table import BEGIN, END, markdown_table

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KNOWLEDGE = os.path.join(REPO_ROOT, "..", "shared", "knowledge", "known-issues.md")


def markdown_ids(path):
    """The ids in the first column of every table of the knowledge file."""
    ids = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if line.startswith("|") and cells and re.fullmatch(r"[A-Z0-9]+(-[A-Z0-9]+)+", cells[0]):
                ids.append(cells[0])
    return ids


@pytest.mark.skipif(not os.path.exists(KNOWLEDGE), reason="shared/knowledge/known-issues.md is not next to the repo")
def test_every_entry_of_the_knowledge_file_is_in_the_base():
    wanted = markdown_ids(KNOWLEDGE)
    assert len(wanted) >= 40, "the knowledge file parser found too few ids"
    have = {issue["id"] for issue in load_issues()}
    missing = [i for i in wanted if i not in have]
    assert not missing, f"in known-issues.md but not in issues.json: {missing}"
    # the rest came from gpuparity's own battery or from a review of the public trackers
    found_here = {issue["id"] for issue in load_issues() if issue.get("found_by") in ("gpuparity", "tracker review")}
    extra = sorted(have - set(wanted) - found_here)
    assert not extra, f"in issues.json but not in known-issues.md: {extra}"


@pytest.mark.skipif(not os.path.exists(KNOWLEDGE), reason="shared/knowledge/known-issues.md is not next to the repo")
def test_unconfirmed_flag_follows_the_knowledge_file():
    flagged = set()
    with open(KNOWLEDGE, encoding="utf-8") as handle:
        for line in handle:
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if line.startswith("|") and "unconfirmed" in line and re.fullmatch(r"[A-Z0-9]+(-[A-Z0-9]+)+", cells[0]):
                flagged.add(cells[0])
    issues = {issue["id"]: issue for issue in load_issues()}
    assert flagged and all(issues[i]["unconfirmed"] for i in flagged), \
        [i for i in flagged if not issues[i]["unconfirmed"]]


def test_entries_are_well_formed():
    names = set(probes.PROBES)
    for issue in load_issues():
        validate_issue(issue, names)
        assert issue["sources"], issue["id"]
        assert issue["remedy"].strip(), issue["id"]
        assert describe_rule(issue["rule"])


def test_every_entry_has_sources_a_reviewed_date_and_a_probe_or_why_not():
    for issue in load_issues():
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", issue.get("reviewed", "")), issue["id"]
        for source in issue["sources"]:
            # a URL, or a named non-tracker source (the user stories, torch's documentation, gpuparity's battery)
            assert source.startswith("https://") or re.match(r"user story|PyTorch .* docs|found by gpuparity", source), \
                (issue["id"], source)
        assert issue["probe"] or issue.get("no_probe", "").strip(), f"{issue['id']}: no probe and no no_probe reason"


def test_the_readme_counts_the_entries():
    with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    assert f"the {len(load_issues())}-entry known-issue base" in readme


def test_every_probe_is_used_and_every_used_probe_exists():
    used = {issue["probe"] for issue in load_issues() if issue["probe"]}
    assert used <= set(probes.PROBES)
    assert set(probes.PROBES) <= used, f"probes no entry uses: {set(probes.PROBES) - used}"


def _env_names(rule):
    for key, arg in rule.items():
        if key in ("env_set", "env_unset"):
            yield from (arg if isinstance(arg, (list, dict)) else [arg])
        elif key in ("any_of", "all_of"):
            for sub in arg:
                yield from _env_names(sub)
        elif key in ("not", "unconfirmed"):
            yield from _env_names(arg)


def test_environment_variables_in_rules_are_captured_by_the_platform_report():
    # A rule on a variable `gpuparity env` does not record could never match a saved report.
    for issue in load_issues():
        for name in list(_env_names(issue["rule"])) + list(issue["remedy_env"]):
            assert name.startswith(platform_mod.ENV_PREFIXES), f"{issue['id']}: {name} is not in ENV_PREFIXES"


def test_the_brief_remedy_environments_are_there():
    env = {issue["id"]: issue["remedy_env"] for issue in load_issues()}
    assert env["NCCL-P2P-CONSUMER"] == {"NCCL_P2P_DISABLE": "1"}
    assert env["MIOPEN-IGEMM"] == {"MIOPEN_DEBUG_CONV_IMPLICIT_GEMM": "0"}
    assert env["DET-CUBLAS-WS"] == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert env["RCCL-GFX1201"] == {"NCCL_PROTO": "Simple"}


def test_every_entry_says_what_it_is_about():
    """The words a reader sees for an entry (`gpuparity known-issues`, docs/known-issues.md): a
    title and the symptom, each a sentence, not a placeholder; the base refuses an empty one."""
    for issue in load_issues():
        for field in ("title", "symptom", "affects", "remedy"):
            assert isinstance(issue[field], str) and len(issue[field].strip()) >= 3, (issue["id"], field)
        assert len(issue["title"].split()) >= 3 and len(issue["symptom"].split()) >= 3, issue["id"]
    good = load_issues()[0]
    for field in ("title", "symptom"):
        with pytest.raises(ValueError, match=f"{field} must be a non-empty sentence"):
            validate_issue({**good, field: "  "})


def test_malformed_entries_are_refused_with_the_field_named():
    good = load_issues()[0]
    with pytest.raises(ValueError, match="missing field.*remedy"):
        validate_issue({k: v for k, v in good.items() if k != "remedy"})
    with pytest.raises(ValueError, match="unknown clause 'vendr'"):
        validate_issue({**good, "rule": {"vendr": "amd"}})
    with pytest.raises(ValueError, match="not a probe"):
        validate_issue({**good, "probe": "no_such_probe"}, set(probes.PROBES))
    with pytest.raises(ValueError, match="remedy_env_scope"):
        validate_issue({**good, "remedy_env_scope": "always"})


def test_docs_table_is_generated_from_the_base():
    doc = os.path.join(REPO_ROOT, "docs", "known-issues.md")
    with open(doc, encoding="utf-8") as handle:
        text = handle.read()
    section = text.split(BEGIN, 1)[1].split(END, 1)[0]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == [issue["id"] for issue in load_issues()]     # every entry, with probe, sources, reviewed
    assert section.strip() == markdown_table(load_issues()).strip(), \
        "docs/known-issues.md is stale: run python -m gpuparity.report.known_table docs/known-issues.md"


def test_rule_validation_rejects_bad_ranges():
    with pytest.raises(ValueError, match="unknown comparison"):
        validate_rule({"torch_version": {"=<": "2.7"}})
    with pytest.raises(ValueError, match="is not a version"):
        validate_rule({"torch_version": {"<": "two"}})
    with pytest.raises(ValueError, match="unknown library"):
        validate_rule({"library": {"cublas": {"<": "1"}}})
    with pytest.raises(ValueError, match="non-empty list"):
        validate_rule({"any_of": []})


def test_the_documented_fact_behind_sdpa_causal_align_holds_here():
    # Lq=1, Lk=4, is_causal=True: top-left alignment lets the one query see key 0 only.
    import torch
    import torch.nn.functional as F
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 8, generator=generator, dtype=torch.float64) for n in (1, 4, 4))
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(causal, v[:, :, :1])
    entry = {issue["id"]: issue for issue in load_issues()}["SDPA-CAUSAL-ALIGN"]
    assert "top-left" in entry["rule"]["always"]
