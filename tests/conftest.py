"""Shared fixtures: random tiny checkpoints, built once per session."""

from __future__ import annotations

import pytest

from tests.checkpoints import make_drafter, make_target


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    directory = tmp_path_factory.mktemp("target")
    make_target(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_drafter(tmp_path_factory):
    directory = tmp_path_factory.mktemp("drafter")
    make_drafter(directory)
    return directory


@pytest.fixture(autouse=True)
def _clean_knobs(monkeypatch):
    """Tests start from an environment without PEGAINFER_* levers (CI may export some)."""
    import os

    for name in list(os.environ):
        if name.startswith("PEGAINFER_SPEC_") or name == "PEGAINFER_TEST_LOG":
            monkeypatch.delenv(name)
