"""A figure that could not be measured reads the same way in every view:
``n/a`` in text and in the report's tables, NaN in a DataFrame, null in
``--json`` (docs/RUNS.md, "Missing figures"). A CPU-only trace has no GPU
timeline: its temporal figures are all missing."""

from __future__ import annotations

import json

import pandas as pd

from torchlens.frontends.cli.main import main
from torchlens.frontends.runs.api import load_run
from torchlens.model.units import MISSING

CPU_ONLY = "cpu_only_gloo_rank34.json.gz"


def test_analyze_writes_the_missing_word_never_none(traces_dir, capsys) -> None:
    assert main(["analyze", str(traces_dir / CPU_ONLY)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.split()[:1] == ["34"])
    assert "None" not in out and "nan" not in out.lower().replace("nanosecond", "")
    assert row.split()[3:] == [MISSING] * 8  # span .. non_compute_pct


def test_a_dataframe_holds_nan_for_every_missing_figure(traces_dir) -> None:
    run = load_run(str(traces_dir / CPU_ONLY), workers=1)
    temporal = run.temporal()
    assert temporal["span_us"].isna().all() and temporal["span_us"].dtype == float
    for table in (temporal, run.stragglers(), run.overlap(), run.launches()):
        assert not table.map(lambda v: v is None).any().any(), table.columns.tolist()


def test_the_report_table_says_the_missing_word_and_json_says_null(traces_dir, capsys) -> None:
    from torchlens.frontends import kinds

    page = kinds.report_html(load_run(str(traces_dir / CPU_ONLY), workers=1).profile)
    assert f'data-v="-1e308">{MISSING}</td>' in page
    assert 'data-v="-1e308"></td>' not in page  # never a blank cell
    capsys.readouterr()
    assert main(["analyze", str(traces_dir / CPU_ONLY), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["temporal"][0]["span_us"] is None
    assert pd.isna(load_run(str(traces_dir / CPU_ONLY), workers=1).temporal().loc[0, "idle_pct"])
