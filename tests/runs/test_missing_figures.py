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
    """A CPU-only trace measured no figure of the GPU time table: analyze leaves
    the table of "n/a" out and says in one line what was not measured and why."""
    from torchlens.analysis.runs.analyze import NO_GPU_TIMELINE

    assert main(["analyze", str(traces_dir / CPU_ONLY)]) == 0
    out = capsys.readouterr().out
    assert not any(line.split()[:1] == ["34"] for line in out.splitlines()), out
    assert MISSING not in out and NO_GPU_TIMELINE in out
    assert "None" not in out and "nan" not in out.lower().replace("nanosecond", "")


def test_a_dataframe_holds_nan_for_every_missing_figure(traces_dir) -> None:
    run = load_run(str(traces_dir / CPU_ONLY), workers=1)
    temporal = run.temporal()
    assert temporal["span_us"].isna().all() and temporal["span_us"].dtype == float
    for table in (temporal, run.stragglers(), run.overlap(), run.launches()):
        assert not table.map(lambda v: v is None).any().any(), table.columns.tolist()


def test_the_report_table_says_the_missing_word_and_json_says_null(traces_dir, capsys) -> None:
    from torchlens.frontends import kinds
    from torchlens.render import tables
    from torchlens.render.runs.report import TEMPORAL

    run = load_run(str(traces_dir / CPU_ONLY), workers=1)
    # a report table cell of a missing figure: the missing word, never blank
    table = str(tables.html_table(run.analysis().temporal, TEMPORAL))
    assert f'data-v="-1e308">{MISSING}</td>' in table
    assert 'data-v="-1e308"></td>' not in table
    # the CPU run's page leaves its GPU sections out, n/a and all, and says so
    page = kinds.report_html(run.profile)
    assert "Not measured on this run" in page and 'id="temporal"' not in page
    assert 'data-v="-1e308"></td>' not in page  # never a blank cell
    capsys.readouterr()
    assert main(["analyze", str(traces_dir / CPU_ONLY), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["temporal"][0]["span_us"] is None
    assert pd.isna(load_run(str(traces_dir / CPU_ONLY), workers=1).temporal().loc[0, "idle_pct"])
