"""Shared snapshot list for the allocator tests (files stay in ../shared/testdata)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchlens.model.snapshot import load_snapshot

SNAPSHOTS = (
    Path(__file__).resolve().parents[3].parent / "shared" / "testdata" / "snapshots"
)
SNAPSHOT_FILES = sorted(SNAPSHOTS.glob("*.pickle")) if SNAPSHOTS.is_dir() else []
SNAPSHOT_PARAMS = [pytest.param(p, id=p.stem) for p in SNAPSHOT_FILES]

_cache: dict[str, dict[str, Any]] = {}


def load_cached(path: Path) -> dict[str, Any]:
    """Each snapshot is loaded once per session (several tests read it)."""
    key = str(path)
    if key not in _cache:
        _cache[key] = load_snapshot(path)
    return _cache[key]
