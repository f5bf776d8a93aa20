"""torchlens keeps a trace's nanoseconds, HolisticTraceAnalysis rounds
them down to whole µs unless HTA_DISABLE_NS_ROUNDING=1. A user comparing the two
on an ns-resolution trace (the V100 one) sees different last digits; the
temporal breakdown says why, wherever it is shown."""

from __future__ import annotations

import html

import pytest

from torchlens.frontends.cli.main import main


@pytest.fixture
def v100_run(tmp_path, traces_dir):
    run = tmp_path / "run"
    run.mkdir()
    name = "v100_ddp_sgd_annotations_rank0.json.gz"
    (run / name).symlink_to(traces_dir / name)
    return run


def test_analyze_text_says_times_are_ns_and_hta_rounds(v100_run, capsys):
    assert main(["analyze", str(v100_run), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    table, after = out.split("compute_pct", 1)  # the temporal table's header
    note = [line for line in after.splitlines() if "HTA_DISABLE_NS_ROUNDING=1" in line]
    assert len(note) == 1, out
    assert "nanosecond" in note[0] and "rounds" in note[0]


def test_report_temporal_section_says_it_too(v100_run, tmp_path):
    out = tmp_path / "run.html"
    assert main(["report", str(v100_run), "-o", str(out)]) == 0
    page = html.unescape(out.read_text(encoding="utf-8"))
    section = page.split("GPU time per rank", 1)[1].split("<section", 1)[0]
    assert "HTA_DISABLE_NS_ROUNDING=1" in section and "nanosecond" in section
