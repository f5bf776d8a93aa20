"""Shared fixtures of the run tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def two_ranks(tmp_path, traces_dir):
    """A run folder of the two shared ``sampled_rank-*`` traces (links to them)."""
    run = tmp_path / "run"
    run.mkdir()
    for r in (0, 1):
        name = f"sampled_rank-{r}.json.gz"
        (run / name).symlink_to(traces_dir / name)
    return run
