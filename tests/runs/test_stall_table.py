"""A run folder whose step records name a stalling rank (rank 1 pauses 150 ms
every 10 steps, between two steps) and whose profiled traces show it last at a
collective: the straggler table and ``run.stragglers()`` give that rank the
verdict's cause and wait, with no empty cell beside a verdict that names it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.ranks.test_stall_words import _run
from tests.runs.test_collectives import _write_run
from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    Manifest,
    RankEntry,
    write_manifest,
)
from torchlens.formats.run_folder.records import write_steps
from torchlens.frontends.cli.main import main
from torchlens.frontends.runs.api import load_run
from torchlens.model.units import format_ms
from torchlens.render.tables import MISSING


def _folder(tmp_path: Path) -> Path:
    run = _write_run(tmp_path / "run", world=2, late_rank=1)
    records = _run(source="rss")
    for r, recs in enumerate(records):
        write_steps(str(run), r, recs)
    write_manifest(str(run), Manifest(
        source=SOURCE_RUN, world_size=2,
        ranks=[RankEntry(rank=r, traces=[f"rank{r}.json"], steps=len(records[r]))
               for r in range(2)]))
    return run


def test_the_stalling_ranks_row_carries_the_verdicts_cause_and_wait(tmp_path: Path) -> None:
    run = load_run(str(_folder(tmp_path)), workers=1)
    said = run.slow_rank().finding
    assert said.value("rank") == 1 and said.value("cause") == "stall"
    row = run.stragglers().set_index("rank").loc[1]
    assert row["cause"] == "stall" and "6 stalls of" in row["cause_words"]
    # per stall, the others' wait the verdict names; per step, its wait per step
    assert row["caused_mean_us"] == said.value("waited_ms") * 1e3
    # all together, over the same steps: never less than one stall's wait
    assert row["caused_us"] == said.value("waited_ms") * said.value("stalls") * 1e3
    assert row["wait_per_step_us"] == said.value("wait_per_step_ms") * 1e3


def test_the_report_table_gives_the_stalling_rank_no_empty_cell(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    said = load_run(str(folder), workers=1).slow_rank().finding
    out = tmp_path / "run.html"
    assert main(["report", str(folder), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    section = page.split("Who the others waited for", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", section, re.S)
    cells = {re.sub(r"<[^>]+>", "", r.split("</td>", 1)[0]).strip(): r for r in rows}
    named = cells["1"]
    assert MISSING not in named, named
    assert format_ms(said.value("waited_ms")) in named and "6 stalls of" in named
