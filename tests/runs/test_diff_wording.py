"""What the diff says: a run that got faster is never given a
"slowest change", and no row reads "same" next to a change beyond 5%.

Synthetic traces with two ``ProfilerStep#N`` spans each, so every figure is
known by hand.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import torchlens
from torchlens.frontends import kinds
from torchlens.frontends.cli.main import main


def _x(name, ts, dur, cat="cpu_op", pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
            "ts": ts, "dur": dur, "args": args}


def _trace(path: Path, step_us: float, ops: dict[str, float],
           gemm_us: float | None = None, rank: int | None = None) -> Path:
    """Two steps of ``step_us``; in each, one call of every op for its µs (and one
    ``gemm`` kernel of ``gemm_us``)."""
    events = []
    for i in range(2):
        t0 = 100 + i * 1000
        events.append(_x(f"ProfilerStep#{i + 1}", t0, step_us, "user_annotation"))
        t = t0 + 1
        for name, us in ops.items():
            events.append(_x(name, t, us))
            t += us + 1
        if gemm_us is not None:
            corr = i + 1
            events.append(_x("cudaLaunchKernel", t0 + 1, 1, "cuda_runtime", correlation=corr))
            events.append(_x("gemm", t0 + 3, gemm_us, "kernel", pid=0, tid=7,
                             correlation=corr, stream=7, device=0))
    doc: dict = {"traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": 2}
    path.write_text(json.dumps(doc))
    return path


def test_a_faster_run_names_its_largest_speedup_first_and_its_slowdown_too(tmp_path) -> None:
    # B: steps 100 -> 70 µs; aten::mm 60 -> 20 µs per step; aten::tanh added (15 µs)
    a = _trace(tmp_path / "a.json", 100, {"aten::mm": 60})
    b = _trace(tmp_path / "b.json", 70, {"aten::mm": 20, "aten::tanh": 15})
    d = torchlens.load(str(a)).diff(str(b))
    assert d.diff.step_time.regression_pct < 0
    assert "slowest" not in d.verdict
    said = d.verdict.split("; ")
    # profiled steps alone: the change is said with the warning that no noise bound judged it
    assert "with no run-to-run noise bound: that needs both runs' step records" in said[0]
    assert said[1] == "largest speedup: op aten::mm -40.0 µs per step"
    # what got slower on a faster run is still named (a walk: a collective's
    # +12.8 ms hid behind the ops that sped up)
    assert said[2] == "largest slowdown: op aten::tanh +15.0 µs per step (added)"
    # the other way round, B is slower: its largest slowdown is named
    back = torchlens.load(str(b)).diff(str(a))
    assert back.diff.step_time.regression_pct > 0
    assert "largest slowdown: op aten::mm +40.0 µs per step" in back.verdict
    assert "speedup" not in back.verdict


def test_a_small_change_is_not_called_same(tmp_path, capsys) -> None:
    # aten::add 20 -> 12 µs per step (-40%, -8 µs); gemm 20 -> 19.5 µs (-2.5%);
    # aten::mm 60 -> 120 µs (+100%): slower
    a = _trace(tmp_path / "a.json", 200, {"aten::mm": 60, "aten::add": 20}, gemm_us=20)
    b = _trace(tmp_path / "b.json", 200, {"aten::mm": 120, "aten::add": 12}, gemm_us=19.5)
    d = torchlens.load(str(a)).diff(str(b))
    rows = {r.name: r for r in d.diff.ops + d.diff.kernels}
    assert rows["aten::add"].delta_pct == -40.0
    assert rows["aten::add"].status == "small"
    assert rows["gemm"].status == "same"
    assert rows["aten::mm"].status == "slower"
    same_pct = d.diff.thresholds.same_pct
    for r in rows.values():
        assert r.status != "same" or abs(r.delta_pct or 0.0) <= same_pct, r
    assert d.diff.summary["small"] == 1 and d.diff.summary["same"] == 1
    # the report's tables: no row reads "same" next to a change beyond 5%
    page = kinds.report_html(d.profile, d.analysis())
    cells = [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
              for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
             for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", page, re.S)]
    drawn = [c for c in cells if c and c[0] in ("same", "small", "slower", "faster")]
    assert len(drawn) == 3
    for c in drawn:
        pct = float(c[6].replace("%", "").replace("+", "").replace("−", "-"))
        assert c[0] != "same" or abs(pct) <= same_pct, c
    # the legend says what small means
    assert "small: beyond 5% but within 10 µs per step" in html.unescape(page)
    # the gate is the step time's alone: a small change fails nothing
    assert main(["diff", str(a), str(b), "--fail-if-slower", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 small" in out and "aten::add" not in out  # the text lists real changes only


def test_per_step_figures_of_several_ranks_say_they_are_a_mean_over_ranks(tmp_path) -> None:
    # two ranks each: aten::mm 20 -> 60 µs per step on both; the verdict's
    # +40 µs is per step and rank (not the 80 µs of both ranks together),
    # and says so, so it is not read against a view's per-rank figures
    a = [_trace(tmp_path / f"a{r}.json", 100, {"aten::mm": 20}, rank=r) for r in (0, 1)]
    b = [_trace(tmp_path / f"b{r}.json", 140, {"aten::mm": 60}, rank=r) for r in (0, 1)]
    d = torchlens.load([str(p) for p in a]).diff([str(p) for p in b])
    assert ("largest slowdown: op aten::mm +40.0 µs per step and rank, mean of 2 ranks"
            in d.verdict), d.verdict
    # ranks that differ: each run's count
    d = torchlens.load([str(p) for p in a]).diff([str(b[0])])
    assert "per step and rank, mean of 2 ranks of A and 1 of B" in d.verdict, d.verdict
    # one trace against one: per step, as before
    one = torchlens.load(str(a[0])).diff(str(b[0]))
    assert "+40.0 µs per step" in one.verdict and "rank" not in one.verdict.split("; ")[-1]
