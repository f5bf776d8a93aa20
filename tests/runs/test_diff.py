"""``torchlens diff A B`` and ``run.diff(other)``.

Two small CPU runs are recorded here with torch.profiler: B multiplies larger
matrices (``aten::mm`` slower), drops a ``tanh`` (removed) and adds a
``sigmoid`` and an annotation whose name is HTML (added). Every expected
figure is computed from the raw trace JSON with plain Python.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import pytest

import torchlens
from torchlens.frontends.cli.main import main
from torchlens.model import payloads
from torchlens.model.findings import Finding

STEP = re.compile(r"^ProfilerStep#\d+$")
HTML_NAME = "<b>tag</b>"


def _record(out: Path, variant: str) -> Path:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    n = 64 if variant == "A" else 384
    x, w = torch.randn(n, n), torch.randn(n, n)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: B's larger mm is reliably slower
    try:
        with profile(activities=[ProfilerActivity.CPU],
                     schedule=schedule(wait=0, warmup=1, active=4, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
            for _ in range(5):
                y = torch.mm(x, w)
                if variant == "A":
                    y = torch.tanh(y)
                else:
                    y = torch.sigmoid(y)
                    with torch.profiler.record_function(HTML_NAME):
                        y = y + 1
                y.sum()
                prof.step()
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("diff")
    return _record(d / "a.json", "A"), _record(d / "b.json", "B")


def _events(path: Path) -> list[dict]:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    return [e for e in json.loads(raw)["traceEvents"] if e.get("ph") == "X"]


def _steps(events: list[dict]) -> list[tuple[float, float]]:
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if STEP.match(e["name"]) and e.get("cat") in ("cpu_op", "user_annotation"))


def _step_durs(events: list[dict]) -> list[float]:
    return [e["dur"] for e in events
            if STEP.match(e["name"]) and e.get("cat") in ("cpu_op", "user_annotation")]


def _inside(ts: float, steps: list[tuple[float, float]]) -> bool:
    return any(s <= ts < e for s, e in steps)


def _host_per_step(events: list[dict], cat: str, name: str) -> tuple[float, float]:
    """(µs, calls) per step of host events ``name`` that start inside a step."""
    steps = _steps(events)
    hits = [e["dur"] for e in events if e.get("cat") == cat and e["name"] == name
            and _inside(e["ts"], steps)]
    return sum(hits) / len(steps), len(hits) / len(steps)


def _kernel_per_step(events: list[dict], name: str) -> tuple[float, float]:
    """(µs, calls) per step of kernels ``name`` whose launch starts inside a step."""
    steps = _steps(events)
    gpu = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync")
    launched = {e["args"]["correlation"] for e in events
                if e.get("cat") not in gpu and "correlation" in e.get("args", {})
                and _inside(e["ts"], steps)}
    hits = [e["dur"] for e in events if e.get("cat") == "kernel" and e["name"] == name
            and e.get("args", {}).get("correlation") in launched]
    return sum(hits) / len(steps), len(hits) / len(steps)


def _row(frame, kind: str, name: str) -> dict:
    rows = frame[(frame["kind"] == kind) & (frame["name"] == name)].to_dict("records")
    assert len(rows) == 1, (kind, name)
    return rows[0]


def test_added_removed_and_slower_ops_are_named_with_their_figures(runs) -> None:
    a, b = runs
    d = torchlens.load(str(a)).diff(str(b))  # one trace file: a run of one rank
    ops = d.ops()
    ea, eb = _events(a), _events(b)
    mm = _row(ops, "cpu_op", "aten::mm")
    assert mm["status"] == "slower"
    assert mm["a_us"] == pytest.approx(_host_per_step(ea, "cpu_op", "aten::mm")[0])
    assert mm["b_us"] == pytest.approx(_host_per_step(eb, "cpu_op", "aten::mm")[0])
    assert mm["a_calls"] == mm["b_calls"] == 1.0
    tanh = _row(ops, "cpu_op", "aten::tanh")
    assert tanh["status"] == "removed" and tanh["b_us"] == 0 and tanh["a_calls"] == 1.0
    sig = _row(ops, "cpu_op", "aten::sigmoid")
    assert sig["status"] == "added" and sig["a_us"] == 0
    assert sig["b_us"] == pytest.approx(_host_per_step(eb, "cpu_op", "aten::sigmoid")[0])
    assert _row(ops, "user_annotation", HTML_NAME)["status"] == "added"
    # no ProfilerStep span is an op of its own
    assert not ops["name"].str.startswith("ProfilerStep#").any()
    # step time: CPU-only steps are the ProfilerStep spans themselves
    st = d.diff.step_time
    med_a = statistics.median(_step_durs(ea))
    med_b = statistics.median(_step_durs(eb))
    assert st.a_steps == st.b_steps == 4
    assert st.a_median_us == pytest.approx(med_a)
    assert st.b_median_us == pytest.approx(med_b)
    assert st.regression_pct == pytest.approx(100 * (med_b - med_a) / med_a)
    assert d.verdict.startswith("step time ") and "+" in d.verdict
    assert d.steps()[["rank_a", "rank_b"]].values.tolist() == [[0, 0]]
    assert d.kernels().empty  # CPU runs: no GPU work


def test_cli_gate_exit_codes(runs, capsys, tmp_path) -> None:
    a, b = runs
    med = [statistics.median(_step_durs(_events(p))) for p in (a, b)]
    reg = 100 * (med[1] - med[0]) / med[0]
    assert reg > 50  # B's 384x384 mm against A's 64x64
    assert main(["diff", str(a), str(b), "--fail-if-slower", f"{reg / 2:.1f}"]) == 1
    err = capsys.readouterr().err
    assert "regressed" in err and f"--fail-if-slower {float(f'{reg / 2:.1f}'):g}%" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["diff", str(a), str(b), "--fail-if-slower", f"{reg * 2:.1f}"]) == 0
    assert main(["diff", str(b), str(a), "--fail-if-slower", "0"]) == 0  # faster: fine
    capsys.readouterr()
    out = tmp_path / "d.html"
    assert main(["diff", str(a), str(b), "--json", "-o", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)  # strict JSON, nothing else on stdout
    assert doc["schema"] == 1 and doc["per"] == "step" and doc["a"]["ranks"] == [0]
    assert doc["verdict_code"] == "run_diff" and doc["verdict"]
    assert {r["name"] for r in doc["ops"] if r["status"] == "added"} >= {"aten::sigmoid",
                                                                          HTML_NAME}
    page = out.read_text()
    assert HTML_NAME not in page and "&lt;b&gt;tag&lt;/b&gt;" in page  # escaped
    assert 'id="verdict"' in page and 'id="ops"' in page


def test_cli_bad_input_is_one_line_and_exit_2(runs, capsys, tmp_path, traces_dir) -> None:
    a, _ = runs
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a trace")
    assert main(["diff", str(junk), str(a)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("torchlens: error: A (") and "no usable trace" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert main(["diff", str(a), str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    # no ProfilerStep spans: nothing to gate on, said, not passed silently
    plain = str(traces_dir / "a100_simple_add.json.gz")
    assert main(["diff", plain, plain]) == 0
    capsys.readouterr()
    assert main(["diff", plain, plain, "--fail-if-slower", "5"]) == 2
    assert "no step time" in capsys.readouterr().err


def test_two_ranks_of_a_real_job_per_step_figures_from_the_raw_json(traces_dir) -> None:
    a, b = (traces_dir / f"sampled_rank-{r}.json.gz" for r in (0, 1))
    d = torchlens.load([str(a)]).diff(str(b))
    ea, eb = _events(a), _events(b)
    assert (d.diff.units.a, d.diff.units.b) == (2, 2) and d.diff.per == "step"
    kernels = d.kernels()
    # the kernel with the most time in rank 0's steps, and one op
    top = max({e["name"] for e in ea if e.get("cat") == "kernel"},
              key=lambda n: _kernel_per_step(ea, n)[0])
    for kind, name, per_step in (("kernel", top, _kernel_per_step),
                                 ("cpu_op", "aten::_foreach_mul_",
                                  lambda ev, n: _host_per_step(ev, "cpu_op", n))):
        row = _row(kernels if kind == "kernel" else d.ops(), kind, name)
        (ua, ca), (ub, cb) = per_step(ea, name), per_step(eb, name)
        assert row["a_us"] == pytest.approx(ua, rel=1e-9)
        assert row["b_us"] == pytest.approx(ub, rel=1e-9)
        assert (row["a_calls"], row["b_calls"]) == (ca, cb)
        delta = ub - ua
        status = ("same" if abs(delta) <= 0.05 * ua else "small" if abs(delta) <= 10
                  else "slower" if delta > 0 else "faster")
        assert row["status"] == status
    # ranks 0 and 1 of one job: compared with each other, and said so
    assert any("rank 0" in n and "rank 1" in n for n in d.diff.notes)
    assert len(d.steps()) == 1
    # the step time is the step breakdown's (widened to GPU work): at least the spans
    raw_a = statistics.median(_step_durs(ea))
    assert d.diff.step_time.a_median_us >= raw_a
    assert d.diff.step_time.a_steps == 2


def test_diff_result_saves_and_renders_again(runs, tmp_path) -> None:
    a, b = runs
    d = torchlens.load([str(a)]).diff([str(b)])
    saved = d.save(str(tmp_path / "d.tlprof"))
    from torchlens.frontends import kinds

    again = torchlens.load(saved)
    assert again.kind == "diff" and kinds.text(again) == kinds.text(d.profile)
    assert d.verdict in repr(d)
    assert isinstance(again.payload.diff.verdict, Finding)
    assert again.payload.diff.verdict == d.diff.verdict and d.to_json()["verdict"] == d.verdict
    assert d.to_json()["verdict_code"] == "run_diff"
    # a diff saved by an older torchlens holds the verdict as a plain sentence
    old = payloads.to_json(again.payload)
    old["diff"]["verdict"] = "step time 1.0 ms -> 2.0 ms (+100.0%); older words"
    again.payload = payloads.from_json("diff", old)
    assert again.payload.diff.verdict.code == "run_diff"
    assert "diff: step time 1.0 ms -> 2.0 ms (+100.0%); older words" in kinds.text(again)
    assert "older words" in kinds.report_html(again)


def _x(name, ts, dur, cat, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
            "ts": ts, "dur": dur, "args": args}


def _gpu(name, ts, dur, corr):
    return _x(name, ts, dur, "kernel", pid=0, tid=7, correlation=corr, stream=7, device=0)


def _synthetic(path: Path, gemm_us: float) -> Path:
    """Two steps [100, 200) and [200, 300); work before, between and after them."""
    path.write_text(json.dumps({"traceEvents": [
        _x("ProfilerStep#1", 100, 100, "user_annotation"),
        _x("ProfilerStep#2", 200, 100, "user_annotation"),
        _x("aten::mm", 50, 20, "cpu_op"),                    # before the steps: left out
        _x("aten::mm", 110, 30, "cpu_op"),
        _x("aten::mm", 210, 40, "cpu_op"),
        _x("aten::add", 305, 9, "cpu_op"),                   # after them: left out
        _x("cudaLaunchKernel", 120, 5, "cuda_runtime", correlation=1),
        _gpu("gemm", 130, gemm_us, 1),                        # runs past its step: counts
        _x("cudaLaunchKernel", 310, 5, "cuda_runtime", correlation=2),
        _gpu("gemm", 320, 1000, 2),                          # launched after: left out
        _gpu("orphan", 150, 500, 3),                         # no launch in the trace
    ]}))
    return path


def test_only_work_launched_inside_steps_counts(tmp_path) -> None:
    a = _synthetic(tmp_path / "a.json", 100)
    b = _synthetic(tmp_path / "b.json", 160)
    d = torchlens.load(str(a)).diff(str(b))
    assert (d.diff.units.a, d.diff.units.b) == (2, 2)
    mm = _row(d.ops(), "cpu_op", "aten::mm")
    assert (mm["a_us"], mm["a_calls"], mm["status"]) == ((30 + 40) / 2, 1.0, "same")
    assert "aten::add" not in set(d.ops()["name"])
    gemm = _row(d.kernels(), "kernel", "gemm")
    # one gemm in two steps: 50 -> 80 µs per step, +60%, +30 µs: slower
    assert (gemm["a_us"], gemm["b_us"], gemm["a_calls"]) == (50.0, 80.0, 0.5)
    assert gemm["status"] == "slower" and gemm["delta_pct"] == pytest.approx(60.0)
    assert set(d.kernels()["name"]) == {"gemm"}
    assert "gemm +30.0 µs per step" in d.verdict


def test_per_trace_totals_keep_the_top_names_and_sum_the_rest(tmp_path) -> None:
    from torchlens.analysis.runs.op_totals import op_totals
    from torchlens.formats.kineto import load_trace
    from torchlens.model.run_figures import NameTotals, OtherNames

    t = op_totals(load_trace(_synthetic(tmp_path / "a.json", 100)), top=1)
    assert t.steps == 2
    assert t.kinds["cpu_op"] == NameTotals(names=["aten::mm"], count=[2], us=[70.0], rest=None)
    t = op_totals(load_trace(tmp_path / "a.json"), top=0)
    assert t.kinds["cpu_op"].rest == OtherNames(names=1, count=2, us=70.0)


def test_run_folders_compare_rank_by_rank_and_name_missing_ranks(tmp_path, traces_dir) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for r in (0, 1):
        (run / f"sampled_rank-{r}.json.gz").symlink_to(traces_dir / f"sampled_rank-{r}.json.gz")
    same = torchlens.load(str(run)).diff(str(run))
    assert same.diff.step_time.regression_pct == 0
    assert same.steps()[["rank_a", "rank_b"]].values.tolist() == [[0, 0], [1, 1]]
    assert set(same.ops()["status"]) | set(same.kernels()["status"]) == {"same"}
    assert same.regressed(0) is False and "no op or kernel got slower" in same.verdict
    # per step and rank: the mean over both ranks' steps
    ea, eb = (_events(traces_dir / f"sampled_rank-{r}.json.gz") for r in (0, 1))
    us = (_host_per_step(ea, "cpu_op", "aten::_foreach_mul_")[0]
          + _host_per_step(eb, "cpu_op", "aten::_foreach_mul_")[0]) / 2
    assert _row(same.ops(), "cpu_op", "aten::_foreach_mul_")["a_us"] == pytest.approx(us)
    fewer = torchlens.load(str(run)).diff(str(traces_dir / "sampled_rank-0.json.gz"))
    assert any("only A has rank(s) 1" in n for n in fewer.diff.notes)
    assert fewer.steps()["rank_a"].tolist() == [0]
    html = fewer._repr_mimebundle_()["text/html"]
    assert "only A has rank(s) 1" in html
