"""Writing report files: atomically, so a reader never sees half a report."""
from __future__ import annotations

import json
import os
from typing import Any, Dict


def write_json(path: str, data: Dict[str, Any]) -> str:
    if "schema_version" not in data:
        raise ValueError("report data must carry schema_version")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, default=str)
    os.replace(tmp, path)
    return path


def write_text(path: str, text: str) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)
    return path


def read_json(path: str, what: str = "file") -> Dict[str, Any]:
    """Read a gpuparity JSON file, with an error that names the file and the problem."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what}: {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ValueError(f"{what}: {path} is not a gpuparity JSON file (no schema_version)")
    return data
