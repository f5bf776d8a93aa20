"""Shared fixtures: the real recorded data lives in ../shared/testdata (CI has it)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTDATA = REPO.parent / "shared" / "testdata"
TRACES = TESTDATA / "traces"
SNAPSHOTS = TESTDATA / "snapshots"


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    if not TRACES.is_dir():
        pytest.fail(f"shared test data missing: {TRACES} (clone beside ../shared)")
    return TRACES


@pytest.fixture(scope="session")
def snapshots_dir() -> Path:
    if not SNAPSHOTS.is_dir():
        pytest.fail(f"shared test data missing: {SNAPSHOTS}")
    return SNAPSHOTS
