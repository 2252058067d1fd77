"""The repository stands on its own: every file that README.md, docs/*.md or a source file's
docstrings and comments cite exists inside the repository.

Checked: markdown links and backticked paths in README.md and docs/*.md; `NAME.md` words in
their prose; file names in src/ docstrings and comments. A cited path resolves from the repo
root, from the citing file's folder, or from the package root `src/gpuparity` (the docs name
modules as `ops/select.py`). A path that leaves the repository does not resolve. Names that
stand for the user's own files (`train.py`, `trace.json`, `path/to/file.py`, ...) are not
citations; EXAMPLE_NAMES lists them.
"""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "gpuparity"
EXT = r"(?:py|md|sh|json|toml|tmpl|yml|yaml|cfg)"
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
CODE_SPAN = re.compile(r"`([^`\s]+)`")
PATH_LIKE = re.compile(rf"^(?:\.{{1,2}}/)*[\w.-]+(?:/[\w.-]+)*\.{EXT}$")
MD_WORD = re.compile(r"(?<![\w/.`-])([A-Z][A-Z_]+\.md)\b")
FILE_NAME = re.compile(rf"(?<![\w/.:$<{{-])((?:\.{{1,2}}/)*[\w.-]+(?:/[\w.-]+)*\.{EXT})(?![\w/])")
# The user's files in examples and help texts, not files of this repository.
EXAMPLE_NAMES = {"file.py", "path/to/file.py", "a.json", "trace.json", "my_models.py", "train.py",
                 "fleet.json"}


def resolves(cited: str, folder: Path) -> bool:
    for base in (ROOT, folder, PACKAGE):
        target = (base / cited).resolve()
        if target.exists() and (target == ROOT or ROOT in target.parents):
            return True
    return False


def doc_citations(text: str):
    """Paths a markdown text cites: links, backticked paths (with a folder, or a .md file), and
    UPPER_CASE.md words in prose."""
    cited = [link for link in LINK.findall(text) if not re.match(r"^[a-z]+:", link)]
    cited += [span for span in CODE_SPAN.findall(text)
              if PATH_LIKE.match(span) and ("/" in span or span.endswith(".md"))]
    cited += MD_WORD.findall(text)
    return [path for path in cited if not path.startswith(("/", "~"))]


def source_citations(text: str):
    """File names in a Python file's comments and triple-quoted strings."""
    chunks = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            chunks.append(token.string)
        elif token.type == tokenize.STRING and token.string.lstrip("rbuRBU").startswith(('"""', "'''")):
            chunks.append(token.string)
    return [name for chunk in chunks for name in FILE_NAME.findall(chunk) if name not in EXAMPLE_NAMES]


def test_the_scanners_find_links_spans_words_and_comment_names():
    text = "[a](docs/x.md) `src/gpuparity/y.py --flag` `pip` see DESIGN.md `/etc/z.sh` [w](https://e.org/a.md)"
    assert doc_citations(text) == ["docs/x.md", "DESIGN.md"]
    source = '"""Cites pool.py and ../shared/X.md."""\nx = "not.py"  # and checks/plan.py\n'
    assert source_citations(source) == ["pool.py", "../shared/X.md", "checks/plan.py"]
    assert not resolves("../shared/DESIGN.md", ROOT / "docs")
    assert resolves("ops/select.py", ROOT / "docs")


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_cite_only_files_in_the_repository(doc):
    missing = sorted({path for path in doc_citations(doc.read_text()) if not resolves(path, doc.parent)})
    assert not missing, f"{doc.relative_to(ROOT)} cites files that are not in the repository: {missing}"


def test_sources_cite_only_files_in_the_repository():
    missing = []
    for source in SOURCES:
        missing += [f"{source.relative_to(ROOT)}: {name}" for name in source_citations(source.read_text())
                    if not resolves(name, source.parent)]
    assert not missing, "source comments or docstrings cite files that are not in the repository:\n" + \
        "\n".join(missing)
