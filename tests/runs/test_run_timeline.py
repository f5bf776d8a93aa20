"""The run report's joint timeline: the size of a 64-rank report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchlens.frontends.cli.main import main

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_report_of_64_ranks_is_one_file_under_10_mb(tmp_path):
    folder = tmp_path / "r64"
    made = subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_rank_set.py"),
                           str(folder), "--ranks", "64", "--jobs", "2", "--compresslevel", "1"],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    out = tmp_path / "run.html"
    assert main(["report", str(folder), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "Timeline of every rank" in page and "Clocks across ranks" in page
    assert out.stat().st_size < 10_000_000
    # every rank is a lane group of the timeline, with its clock offset in the table
    assert page.count("rank 63") >= 1
