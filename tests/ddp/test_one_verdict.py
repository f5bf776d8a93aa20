"""One ``%ddp_check --profile`` run seen through every view: the checklist,
``slow_rank()``, the live section, the watch's
header, the run folder's report and its tables say one verdict with one set
of figures, in one colour.

Real gloo ranks: rank 2 of 3 waits 20 ms for each batch; 30 steps, so the
slow rank's window (the last 20 steps) leaves some out and the sentence
must say so.
"""

from __future__ import annotations

import html
import re
from statistics import median

import pandas as pd
import pytest
from bokeh.models import Div

from torchlens.frontends.cli.main import main
from torchlens.frontends.ddp.api import ddp_check
from torchlens.frontends.runs.api import load_run
from torchlens.model.findings import WARNING
from torchlens.render.findings import COLORS

from . import profiled
from .conftest import assert_clean

STEPS = 30
WINDOW = 20  # analysis.ranks.slow.WINDOW: the steps the verdict compares


@pytest.fixture(scope="module")
def straggler(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("verdict") / "run"
    res = ddp_check(profiled.straggler, world_size=3, backend="gloo", live=False, profile=True,
                    run_dir=str(run_dir), steps=STEPS, profile_every=10)
    assert res.records.outcome == "finished"
    assert_clean(res)
    return res, run_dir


def _text(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", str(markup)))


def _live_verdict(res) -> Div:
    from torchlens.render.ranks.view import rank_profile_figures

    layout = rank_profile_figures(res.records.profiling, 3, res.records.t0)
    return next(d for d in layout.select({"type": Div}) if "slow rank" in d.text)


def test_every_view_gives_the_checklists_verdict_with_its_figures(straggler):
    res, run_dir = straggler
    said = res.slow_rank().finding
    assert said.sentence.startswith("rank 2 is the slow rank: its data loading took")
    # the window is said: 30 steps ran, the last 20 were compared
    assert re.search(rf"last in \d+ of the last {WINDOW} steps\)", said.sentence)
    line = res.item("slow rank")
    assert line.evidence == said.sentence and line.figures == said.figures

    # the live section (and the static copy the notebook keeps)
    assert said.sentence in _text(_live_verdict(res).text)

    # the watch's header on the run folder
    from torchlens.analysis.ranks.verdict import LiveStatus
    from torchlens.frontends.ranks.watch_sources import folder_frame
    from torchlens.render.ranks.watch_status import status_html

    status = LiveStatus.of(folder_frame(str(run_dir)).status)
    assert status.slow_rank == 2 and status.verdict == str(said)
    assert said.sentence in _text(status_html("run", "ended", status))

    # the run folder's report leads with it, titled as the checklist's line
    run = load_run(str(run_dir), workers=1)
    assert run.findings()[0] == str(said)
    # torchlens.load(folder).slow_rank() is the same verdict (a walk got AttributeError)
    assert run.slow_rank().rank == 2 and str(run.slow_rank().finding) == str(said)
    # ... and no second sentence names the slow rank with other figures
    assert sum(" is the slow rank" in f for f in run.findings()) == 1
    assert run.stragglers().iloc[0]["rank"] == 2  # the traces' evidence stays in its table


def test_the_report_of_a_ddp_check_run_folder_leads_with_the_slow_rank(straggler, tmp_path):
    res, run_dir = straggler
    out = tmp_path / "run.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    page = _text(out.read_text())
    first = page.index("rank 2 is the slow rank")
    assert res.slow_rank().finding.sentence in page
    assert first < page.index("Who the others waited for")


def test_the_ranks_table_gives_the_median_step_and_no_uncounted_collectives(straggler):
    res, _ = straggler
    rows = res.analysis().rank_rows
    for r, recs in enumerate(res.records.profiling.steps):
        want = median(rec.t1 - rec.t0 for rec in recs)
        assert rows[r].steps_s == pytest.approx(want)
        assert rows[r].steps_s < 1.0  # one step, not the whole loop (seconds)
        # --profile without --strict counts no collectives: not "0"
        assert rows[r].collectives is None


def test_the_collectives_table_has_a_step_column_and_no_empty_columns(straggler):
    from torchlens.render.runs.report import collective_columns

    _, run_dir = straggler
    run = load_run(str(run_dir), workers=1)
    rows = run.analysis().collectives
    profiled_steps = sorted({rec.step for rec in run_dir_steps(run_dir) if rec.profiled})
    assert sorted({r.step for r in rows}) == profiled_steps
    labels = [c.label for c in collective_columns(rows)]
    assert labels[0] == "step"
    # gloo traces record no message size: no bytes, no bandwidth; no mismatch
    for empty in ("bytes", "bus bandwidth", "ranks disagree"):
        assert empty not in labels
    page = run.profile  # the report's own table
    from torchlens.render.runs.report import report_parts

    _, sections = report_parts(page, run.analysis(), [])
    table = next(_text(s) for s in sections if "Collectives across ranks" in _text(s))
    assert "bus bandwidth" not in table and "ranks disagree" not in table
    assert str(profiled_steps[0]) in table


def run_dir_steps(run_dir):
    from torchlens.formats.run_folder.records import read_steps

    return read_steps(str(run_dir), 0)


def test_the_slow_rank_verdict_is_one_colour_in_every_view(straggler):
    res, run_dir = straggler
    orange = COLORS[WARNING]
    assert res.slow_rank().finding.severity == WARNING
    # the live section: the warning's colour, not rank 2's line colour
    div = _live_verdict(res).text
    sentence_style = re.search(r'<span style="color:([^"]+)">rank 2 is the slow rank', div)
    assert sentence_style and sentence_style.group(1) == orange
    # the watch's header
    from torchlens.analysis.ranks.verdict import LiveStatus
    from torchlens.frontends.ranks.watch_sources import folder_frame
    from torchlens.render.ranks.watch_status import status_html

    block = str(status_html("run", "ended", LiveStatus.of(folder_frame(str(run_dir)).status)))
    assert re.search(rf'<span style="color:{orange}">rank 2 is the slow rank', block)


def test_a_profiled_run_without_strict_draws_no_false_zero_collectives_panel(tmp_path) -> None:
    """Item 6: the collectives chart was a flat 0 on a -1..1 axis when nothing counted them."""
    from torchlens.frontends.kinds import analyze
    from torchlens.render.ddp.heartbeats import rank_figures

    res = ddp_check(profiled.balanced, world_size=2, backend="gloo", profile=True, steps=6,
                    run_dir=str(tmp_path / "run"), live=False)
    a = analyze(res.profile)
    assert a.heartbeats and not any(hb.collectives for hb in a.heartbeats)
    layout = rank_figures(a.heartbeats, 2, res.records.fingerprints, res.records.t0)
    assert layout.children[1].visible is False


def test_the_stragglers_table_gives_the_verdicts_cause_and_no_second_ratio(straggler, tmp_path):
    """A walk read 90.1x in the findings and 110.4x in "Who the others waited
    for": the table judged the cause again from the few profiled steps."""
    res, run_dir = straggler
    said = res.slow_rank().finding
    ratio = f"{said.value('ratio'):.1f}x"
    run = load_run(str(run_dir), workers=1)
    table = run.stragglers().set_index("rank")
    assert ratio in table.loc[2, "cause_words"]
    assert table.drop(index=2)["cause_words"].isna().all()
    out = tmp_path / "run.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    page = _text(out.read_text())
    assert set(re.findall(r"(\d[\d,.]*x) the others' median", page)) == {ratio}


def test_the_stragglers_wait_per_step_is_the_verdicts(straggler):
    """A walk read "the others waited 39.4 ms per step" in the verdict and
    79,578 µs in stragglers() (the sum over the two waiting ranks)."""
    res, run_dir = straggler
    said = res.slow_rank().finding
    run = load_run(str(run_dir), workers=1)
    row = run.stragglers().set_index("rank").loc[2]
    assert row["wait_per_step_us"] == pytest.approx(said.value("wait_per_step_ms") * 1e3)
    # one wait figure per rank and window: no per-collective wait of the
    # profiled steps beside the verdict's (a walk read 77.3 ms per collective
    # beside 30.5 ms per step for one rank)
    assert pd.isna(row["caused_mean_us"]) and pd.isna(row["caused_each_us"])


def test_no_profiled_step_names_another_slow_rank(straggler):
    """A walk's report warned "step 4: rank 1 took 52.1 ms, 20% longer than the
    median rank" under the verdict that rank 2 is slow."""
    _, run_dir = straggler
    run = load_run(str(run_dir), workers=1)
    assert not any("longer than the median rank" in f for f in run.findings())
    assert run.step_skew() is not None  # the table stays, as evidence
