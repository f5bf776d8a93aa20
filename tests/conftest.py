"""Shared fixtures: the real recorded data lives in ../shared/testdata (CI has it)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

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


@pytest.fixture
def kernel_like_shell():
    """An IPython shell that compiles cells as ipykernel does (files named
    ``/tmp/ipykernel_<pid>/<hash>.py``), with torchlens loaded, no kernel."""
    from ipykernel.compiler import XCachingCompiler
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance(compiler_class=XCachingCompiler)
    assert ip.run_cell("%load_ext torchlens", store_history=True).success
    yield ip
    InteractiveShell.clear_instance()


@cache
def _plain(path: Path) -> dict[str, Any]:
    with gzip.open(path) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def plain() -> Callable[[Path], dict[str, Any]]:
    """The trace file as the json module reads it (cached)."""
    return _plain
