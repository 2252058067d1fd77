"""report/files.py: JSON reports carry schema_version, writes leave no half file, reads name the file."""
from __future__ import annotations

import json
import os
import pathlib

import pytest

from gpuparity.report import files


def test_write_json_creates_the_folder_and_refuses_data_without_schema_version(tmp_path):
    path = files.write_json(str(tmp_path / "a" / "b.json"), {"schema_version": 1, "x": pathlib.PurePosixPath("/p")})
    assert json.loads(open(path).read()) == {"schema_version": 1, "x": "/p"}  # what JSON lacks, as text
    assert os.listdir(tmp_path / "a") == ["b.json"]  # no temporary file left behind
    with pytest.raises(ValueError, match="schema_version"):
        files.write_json(str(tmp_path / "c.json"), {"x": 1})
    assert not (tmp_path / "c.json").exists()


def test_write_text_round_trips(tmp_path):
    assert open(files.write_text(str(tmp_path / "d" / "t.md"), "# title\n")).read() == "# title\n"


def test_read_json_names_the_file_and_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="trace: .*missing.json does not exist"):
        files.read_json(str(tmp_path / "missing.json"), "trace")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        files.read_json(str(bad))
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="no schema_version"):
        files.read_json(str(other))
    good = tmp_path / "good.json"
    good.write_text('{"schema_version": 2}')
    assert files.read_json(str(good)) == {"schema_version": 2}
