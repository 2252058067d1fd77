"""Every benchmarks/ path that README.md or docs/*.md cite exists, so each quoted figure's record can be found."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A path starting at benchmarks/; one after "<commit>:" names a file in git history, not the tree.
CITED = re.compile(r"(?<![\w:/.-])benchmarks/[\w./{},-]*[\w/}]")


def cited_paths(text):
    """benchmarks/ paths in text, with a {a,b} brace group expanded to one path per member."""
    paths = []
    for match in CITED.findall(text):
        brace = re.search(r"\{([^}]*)\}", match)
        if brace:
            paths += [match[:brace.start()] + part + match[brace.end():] for part in brace.group(1).split(",")]
        else:
            paths.append(match)
    return paths


def test_cited_paths_finds_links_code_spans_and_braces():
    text = ("[t](benchmarks/records/h100/a.md) `benchmarks/x.py --flag`, benchmarks/r/b.{md,json}; "
            "`git show 6dd2aef:benchmarks/old/gone.txt`")
    assert cited_paths(text) == ["benchmarks/records/h100/a.md", "benchmarks/x.py",
                                 "benchmarks/r/b.md", "benchmarks/r/b.json"]


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_benchmark_paths_exist(doc):
    text = doc.read_text()
    base = doc.parent if doc.parent.name == "benchmarks" else ROOT
    missing = []
    for path in cited_paths(text):
        if not (ROOT / path).exists():
            missing.append(path)
    if doc.parent.name == "benchmarks":  # its own links are relative: records/...
        missing += [p for p in re.findall(r"\]\((records/[^)]+)\)", text) if not (base / p).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} cites benchmarks paths that do not exist: {missing}"


def test_benchmarks_folder_stays_small():
    """benchmarks/ keeps the tools a maintainer reruns and the latest record per measurement;
    raw sweeps and one-off experiments live in git history (cited by commit)."""
    total = sum(path.stat().st_size for path in (ROOT / "benchmarks").rglob("*") if path.is_file())
    assert total < 1_400_000, f"benchmarks/ holds {total:,} bytes (limit 1.4 MB): move raw data to git history"
