"""Shared fixtures for the known-issue tests: the recorded platform fingerprints."""
import copy
import json
import os

import pytest

PLATFORMS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "platforms"))


@pytest.fixture
def platform_file():
    """Path of a recorded platform report by name (tests/fixtures/platforms/NAME.json)."""
    return lambda name: os.path.join(PLATFORMS, f"{name}.json")


@pytest.fixture
def fixture_platform(platform_file):
    """A fresh copy of a recorded platform report by name, safe to modify."""
    def load(name):
        with open(platform_file(name)) as handle:
            return copy.deepcopy(json.load(handle))
    return load
