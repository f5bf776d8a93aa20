"""%ddp_check on real FSDP on gloo, 2 CPU ranks.

FSDP's collectives are all_gather / reduce_scatter of flat buffers whose
shapes repeat layer after layer; its parameters are shards, different on
every rank by design. A correct FSDP job must pass (no drift reported for
shards that were never meant to agree), a rank that skips one layer must be
named at that layer's all_gather, and per-rank memory must say what is
sharded and what is gathered.
"""

from __future__ import annotations

import subprocess
import sys

import cloudpickle
import pytest

from torchlens.frontends.ddp.api import ddp_check

from . import fsdp_jobs
from .conftest import assert_clean

cloudpickle.register_pickle_by_value(fsdp_jobs)
pytestmark = pytest.mark.usefixtures("no_leftovers")


def run(fn, **kw):
    kw.setdefault("steps", 2)
    kw.setdefault("timeout", 20)
    result = ddp_check(fn, world_size=2, backend="gloo", live=False, **kw)
    assert_clean(result)
    return result


def _statuses(result):
    return {i.name: i.status for i in result.checklist}


def test_correct_fsdp2_job_passes_and_says_what_is_sharded():
    result = run(fsdp_jobs.fsdp2_step)
    status = _statuses(result)
    assert not [n for n, s in status.items() if s in ("failed", "warning")], result.checklist
    for name in ("collective sequence", "parameter sync", "determinism", "memory"):
        assert status[name] == "passed", result.item(name)
    coll = result.collectives()
    assert {"all_gather_into_tensor", "reduce_scatter_tensor"} <= set(coll["op"])
    assert set(coll["module"].dropna()) >= {"layers.0", "layers.1", "layers.2"}
    sync = result.item("parameter sync").evidence
    # 6 sharded parameters (3 weights, 3 biases): each rank holds its own shard
    assert "6 sharded parameters" in sync and "same global shape and sharding" in sync
    mem = result.item("memory")
    fsdp = mem.details["fsdp"]
    for r in (0, 1):  # 3 x (8x8 + 8) float32 = 864 B gathered, half of it per rank
        assert fsdp[r]["unsharded_bytes"] == 864
        assert fsdp[r]["sharded_bytes"] == 432
    assert "432 B sharded of 864 B" in mem.evidence
    for r in (0, 1):  # backward prefetches: two layers (2 x 288 B) gathered at once
        assert fsdp[r]["gathered_peak_bytes"] == 576, fsdp[r]
        assert fsdp[r]["gathered_how"] == "measured: gathered parameters alive at once"
        assert len(fsdp[r]["gathered_peak_modules"]) == 2, fsdp[r]
        assert set(fsdp[r]["gathered_peak_modules"]) <= {"layers.0", "layers.1", "layers.2"}
        assert fsdp[r]["optimizer_state_bytes"] == 0  # plain SGD keeps no state
    assert ("gathered at once 576 B (measured: gathered parameters alive at once" in
            mem.evidence), mem.evidence
    assert "2 modules together" in mem.evidence and "a prefetch" in mem.evidence
    assert "optimizer state 0 B (measured: SGD's state tensors" in mem.evidence


def test_adam_state_is_measured_per_rank_as_two_moments_of_the_shards():
    result = run(fsdp_jobs.fsdp2_adam, steps=1)
    mem = result.item("memory")
    for r in (0, 1):
        f = mem.details["fsdp"][r]
        # exp_avg and exp_avg_sq of each rank's 432 B of shards, plus 6 float32 step counts
        assert f["optimizer_state_bytes"] == 2 * f["sharded_bytes"] + 6 * 4 == 888, f
        assert f["optimizers"] == ["Adam"]
    assert "optimizer state 888 B (measured: Adam's state tensors" in mem.evidence, mem.evidence


def test_rank_that_skips_a_layer_is_named_at_that_layers_all_gather():
    result = run(fsdp_jobs.fsdp2_skips_layer, steps=1, timeout=8)
    item = result.item("collective sequence")
    assert item.status == "failed", item
    assert item.details["index"] == 1 and item.details["skipped"] == [1]
    assert item.details["skips"][1]["fingerprint"]["module"] == "layers.1"
    assert ("rank 1 skipped a collective: it never issued rank 0's #1 all_gather_into_tensor"
            in item.evidence)
    assert "FSDP module layers.1" in item.evidence


def test_strict_stops_the_skipping_rank_before_the_wrong_all_gather_runs():
    """Without --strict gloo pairs layer 2's all_gather with layer 1's (equal
    shapes): the job computes garbage silently. --strict compares the module too."""
    result = run(fsdp_jobs.fsdp2_skips_layer, steps=1, timeout=8, strict=True)
    err = result.records.ranks[0].error
    assert err.type == "CollectiveMismatch", err
    assert "collective #1" in err.message and "FSDP module layers.2" in err.message
    assert result.item("collective sequence").status == "failed"
    # the walk: the parameter-sync line said "rank 0 raised" for a rank --strict stopped
    sync = str(result.item("parameter sync"))
    assert "was stopped by --strict" in sync and "raised" not in sync, sync


def test_fsdp1_rank_that_skips_a_layer_is_named_with_the_layers_name():
    result = run(fsdp_jobs.fsdp1_skips_layer, steps=1, timeout=8)
    item = result.item("collective sequence")
    assert item.status == "failed", item
    modules = list(result.collectives().query("rank == 0")["module"])
    # the layers by name, not by class (three Linear layers look alike)
    assert {"layers.0", "layers.1", "layers.2"} <= set(modules), modules
    assert item.details["skipped"] == [1], item.details
    assert item.details["skips"][1]["fingerprint"]["module"] == "layers.1"
    assert "FSDP module layers.1" in item.evidence, item.evidence


def test_correct_fsdp1_job_has_no_false_drift():
    result = run(fsdp_jobs.fsdp1_step)
    status = _statuses(result)
    assert not [n for n, s in status.items() if s in ("failed", "warning")], result.checklist
    assert status["parameter sync"] == "passed"
    assert "sharded parameter" in result.item("parameter sync").evidence
    fsdp = result.item("memory").details["fsdp"]
    for r in (0, 1):  # FSDP1's flat parameters: from its handles' unshard to reshard
        assert fsdp[r]["gathered_how"] == "measured: gathered parameters alive at once"
        assert fsdp[r]["gathered_peak_bytes"] >= 288, fsdp[r]


def test_a_profiled_fsdp_run_folder_reads_back_with_torchlens_report(tmp_path):
    folder = tmp_path / "run"
    result = run(fsdp_jobs.fsdp2_loop, steps=6, profile=True, run_dir=str(folder))
    assert not [i for i in result.checklist if i.status == "failed"], result.checklist
    out = tmp_path / "run.html"
    # as a user runs it (in-process, the report's loader pool outlives the test)
    done = subprocess.run([sys.executable, "-m", "torchlens", "report", str(folder), "-o",
                           str(out)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert "reduce_scatter" in page or "all_gather" in page
    # the walk: the folder's report had no FSDP memory (each step's record now carries
    # it): three Linear(8, 8) layers, 288 B each gathered, half of them a rank's shard
    assert "FSDP memory per rank" in page
    assert "ranks 0-1: FSDP: 432 B sharded of 864 B gathered" in done.stdout, done.stdout
    memory = next(i for i in result.checklist if "gathered at once" in str(i))
    assert "gathered at once" in str(memory) and "measured" in str(memory)


def _shard(name, shard, shape=(8, 8), value=1.0):
    return {"kind": "parameter", "name": name, "shape": [4, 8], "dtype": "float32",
            "sum": value, "abs_sum": value, "sha1": f"{name}{shard}{value}", "head": [value],
            "shard": f"Shard(dim=0)@{shard}", "layout": "Shard(dim=0)",
            "global_shape": list(shape)}


def _two_ranks(params0, params1):
    from torchlens.model import DdpRun

    ranks = [{"rank": r, "steps": [{"step": 0, "end": 1.0, "modules": [
        {"name": "returned #0 (Stack)", "params": ps}]}]}
        for r, ps in enumerate((params0, params1))]
    return DdpRun(world_size=2, backend="gloo", outcome="finished", steps=1, ranks=ranks)


def test_replicas_of_one_shard_are_compared_and_a_different_global_shape_is_named():
    from torchlens.analysis.ddp.checks import check_parameter_sync

    # hybrid sharding: both ranks hold shard 0, one of them drifted
    drift = check_parameter_sync(_two_ranks([_shard("w", 0)], [_shard("w", 0, value=2.0)]))
    assert drift.severity == "failed" and "'w'" in drift.sentence
    # the ranks built different models: the same parameter, another global shape
    shape = check_parameter_sync(_two_ranks([_shard("w", 0)], [_shard("w", 1, shape=(8, 9))]))
    assert shape.severity == "failed" and "global shape [8x9]" in shape.sentence, shape
    # different shards of one parameter sharded alike: nothing to compare, no alarm
    ok = check_parameter_sync(_two_ranks([_shard("w", 0)], [_shard("w", 1, value=5.0)]))
    assert ok.severity == "passed" and "1 sharded parameter (FSDP)" in ok.sentence
