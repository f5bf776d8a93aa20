"""``torchlens diff A B`` of two runs of one unchanged job: their median step
times differ by run-to-run noise, which the diff bounds by each run's own
step-to-step spread; a change within it is said as noise, not as a change,
while a planted slow rank is still named with its phase."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import torchlens
from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest, RankEntry
from torchlens.formats.run_folder.write import RankFiles, write_run_folder
from torchlens.frontends.cli.main import main
from torchlens.model.records import StepRecord

STEPS = 100


def _trace(rank: int, mm_us: float) -> dict:
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}",
               "ts": s * 20_000, "dur": 15_000, "pid": 1, "tid": 1} for s in range(2)]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": s * 20_000 + 100,
                "dur": mm_us, "pid": 1, "tid": 1} for s in range(2)]
    return {"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": 2}}


def _folder(root: Path, seed: int, backward_ms: float, data_ms: dict[int, float],
            mm_us: float = 500.0) -> Path:
    """A two-rank ``torchlens run`` folder whose steps jitter as on a shared
    machine: each phase draws around its centre (backward, where the gradient
    all-reduce waits, the most)."""
    rng = random.Random(seed)
    ranks = []
    for r in (0, 1):
        (root / f"rank{r}").mkdir(parents=True)
        (root / f"rank{r}" / "trace.pt.trace.json").write_text(json.dumps(_trace(r, mm_us)))
        t, recs = 1_800_000_000.0, []
        for s in range(STEPS):
            wait = max(0.0, data_ms[1 - r] - data_ms[r])  # for the other rank's data
            phases = {"data": (data_ms[r] + rng.uniform(0, 0.2)) / 1e3,
                      "forward": rng.uniform(1.0, 2.0) / 1e3,
                      "backward": (backward_ms + wait + rng.uniform(-3.0, 3.0)) / 1e3,
                      "optimizer": rng.uniform(0.5, 1.0) / 1e3, "collective": 0.0}
            dur = sum(phases.values())
            recs.append(StepRecord(step=s, t0=t, t1=t + dur, phases=phases))
            t += dur
        ranks.append(RankFiles(RankEntry(rank=r, host="box"), recs))
    write_run_folder(str(root), Manifest(source=SOURCE_RUN, world_size=2), ranks)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("noise")
    healthy = {0: 0.2, 1: 0.2}
    return {"a": _folder(root / "a", 1, 8.0, healthy),
            # the same job on a busier minute: every step ~1.5 ms longer, the op too
            "twin": _folder(root / "twin", 2, 9.5, healthy, mm_us=900.0),
            # rank 1 loads its data 15 ms longer; rank 0 waits in its backward
            "slow": _folder(root / "slow", 3, 8.0, {0: 0.2, 1: 15.2})}


def test_twin_runs_differ_within_noise_and_say_so(runs, capsys) -> None:
    d = torchlens.load(str(runs["a"])).diff(str(runs["twin"]))
    st = d.diff.step_time
    assert st.delta_us > 1000 and st.regression_pct > 5  # beyond the 5% "same" of old
    assert st.within_noise and abs(st.delta_us) <= st.noise_us
    assert st.noise_us == pytest.approx(st.a_spread_us + st.b_spread_us)
    noise = f"±{st.noise_us / 1e3:.1f} ms"
    assert f"within run-to-run noise ({noise}" in d.verdict
    assert "no change beyond noise" in d.verdict
    # no phase, op or gate verdict reads the noise as a change
    assert d.diff.headline is None and d.diff.verdict.severity == "passed"
    assert "largest slowdown" not in d.verdict and "phase" not in d.verdict
    assert all(r.within_noise for r in d.diff.rank_steps)

    assert main(["diff", str(runs["a"]), str(runs["twin"])]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("diff: step time") and "no change beyond noise" in first
    assert "op and kernel rows below are not changes" in out

    html = runs["a"].parent / "twin.html"
    assert main(["diff", str(runs["a"]), str(runs["twin"]), "-o", str(html)]) == 0
    capsys.readouterr()
    page = html.read_text(encoding="utf-8")
    ranks = page.split("Step time per rank", 1)[1].split("</table>", 1)[0]
    assert "run-to-run noise" in ranks and ranks.count("within noise") == 2
    assert noise in page

    assert main(["diff", str(runs["a"]), str(runs["twin"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["step_time"]["within_noise"] is True
    assert doc["rank_steps"][0]["noise_us"] > 0


def test_a_planted_slow_rank_is_a_change_beyond_noise(runs) -> None:
    d = torchlens.load(str(runs["a"])).diff(str(runs["slow"]))
    st = d.diff.step_time
    assert st.within_noise is False and st.delta_us > st.noise_us
    assert "within run-to-run noise" not in d.verdict
    assert "rank 1's data phase +15.0 ms a step" in d.verdict
    assert d.diff.verdict.severity == "warning"


def test_a_run_against_itself_is_within_noise(runs) -> None:
    d = torchlens.load(str(runs["a"])).diff(str(runs["a"]))
    assert d.diff.step_time.within_noise and "no change beyond noise" in d.verdict


def test_the_ci_gate_does_not_fail_on_noise_and_still_fails_on_a_slow_rank(runs, capsys) -> None:
    a, twin, slow = str(runs["a"]), str(runs["twin"]), str(runs["slow"])
    reg = torchlens.load(a).diff(twin).diff.step_time.regression_pct
    assert main(["diff", a, twin, "--fail-if-slower", f"{reg / 2:.1f}"]) == 0
    err = capsys.readouterr().err
    assert "within run-to-run noise" in err and "not a regression" in err
    assert main(["diff", a, slow, "--fail-if-slower", f"{reg / 2:.1f}"]) == 1
    assert "step time regressed" in capsys.readouterr().err


def test_a_rank_whose_steps_were_refused_is_said_in_the_diff(runs, tmp_path) -> None:
    import shutil

    b = tmp_path / "b"
    shutil.copytree(runs["twin"], b)
    outside = tmp_path / "outside.jsonl"
    (b / "rank1" / "steps.jsonl").rename(outside)
    (b / "rank1" / "steps.jsonl").symlink_to(outside)
    d = torchlens.load(str(runs["a"])).diff(str(b))
    said = [n for n in d.diff.notes if n.startswith("B: refused: a link")]
    assert said and "rank 1's step records were not read" in said[0], d.diff.notes
    assert said[0].endswith("; the diff compares what was read"), said[0]
