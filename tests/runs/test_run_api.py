"""A folder of per-rank traces as one result: ``torchlens.load(RUN_DIR)`` and
``torchlens analyze RUN_DIR --json``."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

import torchlens
from torchlens.frontends.cli.main import main
from torchlens.frontends.runs.api import load_run


@pytest.fixture
def two_ranks(tmp_path, traces_dir):
    run = tmp_path / "run"
    run.mkdir()
    for r in (0, 1):
        (run / f"sampled_rank-{r}.json.gz").symlink_to(traces_dir / f"sampled_rank-{r}.json.gz")
    return run


def test_analyze_json_has_every_rank_and_names_what_it_could_not_use(two_ranks, capsys,
                                                                     traces_dir):
    (two_ranks / "notes.json").write_text('{"lr": 0.1}')
    cut = (traces_dir / "sampled_rank-1.json.gz").read_bytes()
    (two_ranks / "rank_5.json.gz").write_bytes(gzip.compress(gzip.decompress(cut)[:200_000]))
    assert main(["analyze", str(two_ranks), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # strict JSON: no NaN
    assert doc["schema"] == 2 and doc["ranks"] == [0, 1] and doc["world_size"] == 128
    kinds = {(p["kind"], p["path"].rsplit("/", 1)[-1]) for p in doc["problems"]}
    assert ("not a trace", "notes.json") in kinds and ("truncated", "rank_5.json.gz") in kinds
    assert any(k == "missing rank" for k, _ in kinds)
    from torchlens.analysis.runs import temporal_breakdown
    from torchlens.formats.kineto import load_trace

    for row in doc["temporal"]:
        # one trace per rank: the run's row is that trace's own breakdown (whose
        # figures tests/runs/test_figures.py checks against the raw JSON)
        own = temporal_breakdown(load_trace(traces_dir / f"sampled_rank-{row['rank']}.json.gz"))
        assert row["compute_us"] == pytest.approx(own.compute_us, rel=1e-12)
        assert row["idle_pct"] == pytest.approx(own.idle_pct, rel=1e-12)
        assert row["idle_pct"] + row["compute_pct"] + row["non_compute_pct"] == \
            pytest.approx(100.0)
    assert {r["rank"] for r in doc["overlap"]} == {0, 1}
    assert {r["kind"] for r in doc["kernels"]} >= {"compute", "communication"}


def test_load_of_a_folder_is_a_run_with_dataframes_and_workers_change_nothing(two_ranks):
    run = torchlens.load(str(two_ranks))
    one = load_run(str(two_ranks), workers=1)
    assert run.ranks == [0, 1]
    assert run.to_json() == one.to_json()  # the process pool gives what one process gives
    temporal = run.temporal()
    assert list(temporal["rank"]) == [0, 1] and temporal["gpu"].all()
    assert set(run.idle()["rank"]) == {0, 1}
    assert run.top_kernels()["total_us"].is_monotonic_decreasing or len(run.top_kernels())
    assert "2 ranks" in repr(run)


def test_a_folder_with_nothing_usable_exits_non_zero_and_says_why(tmp_path, capsys):
    (tmp_path / "a.json").write_text("[1, 2")
    assert main(["analyze", str(tmp_path)]) != 0
    out, err = capsys.readouterr()
    assert "a.json" in err and out == ""  # said once, on stderr


def test_a_cpu_only_run_folder_has_ranks_with_no_gpu_figures(tmp_path, traces_dir):
    run = tmp_path / "cpu"
    run.mkdir()
    shutil.copy(traces_dir / "cpu_only_gloo_rank34.json.gz", run / "trace.json.gz")
    res = load_run(str(run))
    (row,) = res.to_json()["temporal"]
    assert row["gpu"] is False and row["compute_us"] is None and row["idle_pct"] is None
    json.dumps(res.to_json(), allow_nan=False)


def test_steps_and_skew_use_the_torchprof_breakdown_of_each_rank(two_ranks, traces_dir):
    from torchlens.analysis.trace.steps import step_breakdown
    from torchlens.formats.kineto import load_trace

    run = load_run(str(two_ranks), workers=1)
    own = {r: step_breakdown(load_trace(traces_dir / f"sampled_rank-{r}.json.gz"))
           for r in (0, 1)}
    steps = run.steps()
    for r in (0, 1):
        mine = steps[steps["rank"] == r]
        assert list(mine["step"]) == list(own[r]["step"])
        assert list(mine["dur_us"]) == pytest.approx(list(own[r]["dur_us"]))
    for row in run.to_json()["step_skew"]:
        t = {r: float(own[r].set_index("step").loc[row["step"], "dur_us"]) for r in (0, 1)}
        median = (t[0] + t[1]) / 2
        assert row["longest_rank"] == max(t, key=t.get)
        assert row["skew_pct"] == pytest.approx(100 * (max(t.values()) - median) / median)


def test_report_of_a_folder_is_one_page_with_findings_tables_and_named_bad_files(
        two_ranks, tmp_path):
    (two_ranks / "<img src=x onerror=alert(1)>.json").write_text('{"not": "a trace"}')
    out = tmp_path / "run.html"
    assert main(["report", str(two_ranks), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    for heading in ("Findings", "GPU time per rank", "Step time across ranks",
                    "Who the others waited for (slow ranks)", "Collectives across ranks",
                    "Communication overlapped by compute", "Kernels by kind",
                    "Idle time per stream", "Inputs that could not be used"):
        assert heading in page, heading
    assert "<img src=x" not in page and "&lt;img src=x" in page
    # the collectives table says how each arrival was measured, in the JSON's word
    table = page.split("Collectives across ranks", 1)[1]
    assert "arrived by" in table and ">kernel<" in table
    assert "kernel = each rank&#39;s arrival is its first NCCL kernel&#39;s start" in table
    assert "https://" not in page.split("<script", 1)[0]  # opens offline


def test_a_run_saves_and_reloads_as_a_tlprof_with_the_same_text(two_ranks, tmp_path):
    from torchlens.frontends import kinds

    run = load_run(str(two_ranks), workers=1)
    path = run.save(str(tmp_path / "run.tlprof"))
    again = torchlens.load(path)
    assert again.kind == "run"
    assert kinds.text(again) == kinds.text(run.profile)
    assert "rank 0: compute" in kinds.text(again)
