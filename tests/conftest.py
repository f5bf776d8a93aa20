"""Shared fixtures: the real recorded data lives in ../shared/testdata (CI has it).

Outside this project's CI that folder may not exist (a plain ``git clone``):
then every test that reads it is skipped with a reason that says where the
data comes from (``pytest_runtest_makereport``), unless ``CI`` is set, where
a missing folder is a failure.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

# A pytest started in the background by a non-interactive shell (`cmd &` in a script,
# as a CI runner may) ignores SIGINT, and SIG_IGN survives exec: every job the Ctrl-C
# tests start would ignore their Ctrl-C. A handler does not survive exec, so the jobs
# get the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _sigint_not_ignored() -> None:
    """The same before every test: an earlier test's library may set SIGINT ignored
    in this process again (the full suite's Ctrl-C tests failed so; alone they pass)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
# TORCHLENS_TESTDATA: another place for it (tests/test_shared_data.py points it nowhere)
TESTDATA = Path(os.environ.get("TORCHLENS_TESTDATA") or REPO.parent / "shared" / "testdata")
TRACES = TESTDATA / "traces"
# the tests build run folders of links to the shared traces rather than copies: a
# site's shared store of traces, which a run folder's links may lead into
# (docs/SECURITY.md); every other link out of a run folder is still refused
os.environ.setdefault("TORCHLENS_LINK_TARGETS", os.pathsep.join(
    str(p.resolve()) for p in (TESTDATA, REPO / "tests" / "data") if p.exists()))
SNAPSHOTS = TESTDATA / "snapshots"


MISSING_SHARED = (
    f"needs the shared test data in {TESTDATA} (real traces and snapshots from other "
    "people's GPU runs), which is not there: this project's CI clones the repository beside "
    "it; elsewhere these tests are skipped")


def _missing_shared(text: str) -> bool:
    return str(TESTDATA) in text or "shared test data missing" in text


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Test by test, not module by module: a test that stopped because the
    shared data is missing (its fixture's ``pytest.fail``, or a path under
    ``TESTDATA`` in its error) is reported skipped with ``MISSING_SHARED``;
    the tests of the same module that do not read the data run as usual."""
    outcome = yield
    report = outcome.get_result()
    if (report.failed and call.excinfo is not None and not TESTDATA.is_dir()
            and not os.environ.get("CI") and _missing_shared(
                f"{call.excinfo.value}\n{report.longreprtext}")):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {MISSING_SHARED}")


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
