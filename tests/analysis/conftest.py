"""Plain-json reading of the shared traces: the independent side of each check."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest


@cache
def _plain(path: Path) -> dict[str, Any]:
    with gzip.open(path) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def plain() -> Callable[[Path], dict[str, Any]]:
    """The trace file as the json module reads it (cached)."""
    return _plain
