"""Every text view of a run leads with its one verdict, as the terminal of
``torchlens run`` does: ``torchlens analyze RUN`` (the verdict first, before
any table; a table with no measured figure left out for one line saying why),
and ``torchlens.load(RUN)``'s repr and notebook display (not only a crash)."""

from __future__ import annotations

from pathlib import Path

from torchlens.analysis.runs.analyze import NO_GPU_TIMELINE
from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    Manifest,
    RankEntry,
    write_manifest,
)
from torchlens.formats.run_folder.records import write_steps
from torchlens.frontends.cli.main import main
from torchlens.frontends.runs.api import load_run
from torchlens.model.records import StepMemory, StepRecord
from torchlens.model.units import MISSING

CPU_ONLY = "cpu_only_gloo_rank34.json.gz"
T0 = 1795804276.0


def _stalls(rank: int) -> list[StepRecord]:
    """100 steps of a CPU rank; rank 1 sleeps 150 ms before every 10th step,
    rank 0 waits for it in that step's backward."""
    mem = StepMemory(rss=1 << 28, source="rss")
    t, out = T0, []
    for s in range(100):
        ph = {"data": 0.1, "forward": 0.5, "backward": 2.0 + (s * 7 + rank * 3) % 5 * 0.1,
              "optimizer": 0.6, "collective": 0.0}
        other = 0.3 + (150.0 if rank == 1 and s % 10 == 8 else 0.0)
        ph["backward"] += 150.0 if rank == 0 and s % 10 == 9 else 0.0
        ms = sum(ph.values()) + other
        out.append(StepRecord(step=s, t0=t, t1=t + ms / 1e3,
                              phases={k: v / 1e3 for k, v in ph.items()}, mem=mem))
        t += ms / 1e3
    return out


def _folder(tmp_path: Path, traces_dir: Path, states: tuple[str, str] = ("finished",) * 2,
            errors: tuple[str | None, str | None] = (None, None)) -> Path:
    run = tmp_path / "run"
    ranks = []
    for r in (0, 1):
        (run / f"rank{r}").mkdir(parents=True)
        (run / f"rank{r}" / "step00004.pt.trace.json.gz").symlink_to(
            traces_dir / f"sampled_rank-{r}.json.gz")
        ranks.append(RankEntry(rank=r, traces=[f"rank{r}/step00004.pt.trace.json.gz"],
                               state=states[r], error=errors[r]))
        write_steps(str(run), r, _stalls(r))
    write_manifest(str(run), Manifest(source=SOURCE_RUN, world_size=128, ranks=ranks,
                                      exit_code=0))
    return run


def test_analyze_of_a_cpu_trace_leads_with_the_verdict_not_a_table_of_na(
        traces_dir, capsys) -> None:
    assert main(["analyze", str(traces_dir / CPU_ONLY)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("run: 1 rank of 300 analysed")
    assert lines[1].startswith("verdict: ")
    assert NO_GPU_TIMELINE in lines and "no device trace" in NO_GPU_TIMELINE
    assert not any(MISSING in line for line in lines), lines


def test_the_repr_of_a_run_leads_with_the_slow_rank_verdict(tmp_path, traces_dir) -> None:
    run = load_run(str(_folder(tmp_path, traces_dir)), workers=1)
    lines = repr(run).splitlines()
    assert lines[0].startswith("run: 2 ranks of 128 analysed")
    assert lines[1].startswith("verdict: rank 1 is the slow rank: every 10 steps"), lines
    assert "in steps 48, 58" in lines[1]
    assert lines[2] == "ranks: 2 of 128 analysed; slow rank: 1; every rank finished"
    bundle = run._repr_mimebundle_()
    assert bundle["text/plain"].startswith("run: rank 1 is the slow rank")
    assert "run: rank 1 is the slow rank" in bundle["text/html"]


def test_analyze_of_a_run_folder_says_the_verdict_first(tmp_path, traces_dir, capsys) -> None:
    assert main(["analyze", str(_folder(tmp_path, traces_dir))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("verdict: rank 1 is the slow rank"), lines


def test_the_repr_names_the_rank_that_failed_and_the_one_its_failure_stopped(
        tmp_path, traces_dir) -> None:
    gloo = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:42142"
    run = load_run(str(_folder(tmp_path, traces_dir, ("failed", "failed"),
                               (gloo, "RuntimeError: boom"))), workers=1)
    assert repr(run).splitlines()[2].endswith(
        "rank 0 stopped when rank 1 went away; rank 1 failed")
