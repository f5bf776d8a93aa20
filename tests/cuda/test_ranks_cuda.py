"""``%ddp_check --profile`` and ``torchlens run`` with one NCCL rank on a GPU:
CUDA memory per step, the largest free block, kernel lanes, NCCL kernels."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import cloudpickle
import msgspec

from . import nccl_loop
from .conftest import REPO, child_env

cloudpickle.register_pickle_by_value(nccl_loop)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _events(trace: Path) -> list[dict]:
    return json.loads(trace.read_text())["traceEvents"]


def _found(obj, key: str) -> list:
    """Every value of ``key`` anywhere in a nested JSON value."""
    if isinstance(obj, dict):
        return [v for k, v in obj.items() if k == key] + [x for v in obj.values()
                                                          for x in _found(v, key)]
    if isinstance(obj, list):
        return [x for v in obj for x in _found(v, key)]
    return []


def _check_run_folder(run: Path, figures: dict, summaries: list | None = None) -> None:
    """One NCCL rank: NCCL runs an in-place all_reduce of one rank without any
    kernel (nothing to exchange), so what is checked is the collective as the
    host issued it, the step's kernels on their stream, and CUDA memory. NCCL
    kernels on the GPU timeline are checked on the recorded multi-GPU traces
    (tests/runs, ../shared/testdata) and need two GPUs to check live."""
    steps = _lines(run / "rank0" / "steps.jsonl")
    mems = [s.get("mem") or {} for s in steps]
    assert all(m.get("source") == "cuda" for m in mems), mems[:3]
    assert all((m.get("allocated") or 0) > 0 for m in mems), mems[:3]
    # GPU phase times between CUDA events, read back at later steps without waiting
    gpu = [g for s in steps for g in s.get("gpu") or []]
    figures["gpu_phase_steps"] = len(gpu)
    own = sorted(s["tl_s"] for s in steps if s.get("tl_s") is not None and not s.get("profiled"))
    figures["torchlens_s_per_unprofiled_step_median"] = own[len(own) // 2] if own else None
    figures["gpu_phase_example"] = gpu[len(gpu) // 2] if gpu else None
    assert len(gpu) >= len(steps) // 2, steps[:3]
    assert all(g["step_s"] > 0 for g in gpu)
    manifest = json.loads((run / "manifest.json").read_text())
    traces = [run / t for t in manifest["ranks"][0]["traces"]]
    assert traces, manifest
    events = [e for t in traces for e in _events(t)]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    nccl = sorted({e["name"] for e in events if "nccl" in e.get("name", "").lower()})
    streams = sorted({e.get("args", {}).get("stream") for e in kernels})
    if summaries is None:  # torchlens run: the run folder holds them
        summaries = _lines(run / "rank0" / "summaries.jsonl")
    largest = _found(summaries, "largest_free")
    figures.update(steps=len(steps), traces=len(traces), nccl_events=nccl[:8],
                   nccl_kernels=[n for n in nccl if any(k["name"] == n for k in kernels)],
                   kernels=len(kernels), streams=streams, allocated=mems[-1].get("allocated"),
                   largest_free=largest[-3:])
    assert kernels and streams, "no kernels in the profiled steps' traces"
    assert nccl, "the NCCL collective is not in the profiled steps' traces"
    assert any(isinstance(v, int) and v > 0 for v in largest), largest


def test_ddp_check_profile_one_nccl_rank(tmp_path: Path, artifacts: Path, figures: dict) -> None:
    from torchlens.frontends.ddp.api import ddp_check

    run = tmp_path / "run"
    res = ddp_check(nccl_loop.train, world_size=1, backend="nccl", profile=True, steps=12,
                    profile_every=4, run_dir=str(run), live=False, timeout=120)
    shutil.copytree(run, artifacts / "cuda_ddp_run", dirs_exist_ok=True)
    assert res.records.outcome == "finished", res
    # %ddp_check keeps the profiled steps' summaries in the result, not the folder
    kept = [msgspec.to_builtins(s) for s in res.records.profiling.summaries[0]]
    _check_run_folder(run, figures, kept)
    html = artifacts / "cuda_ddp_profile.html"
    res.export(str(html))
    text = html.read_text(encoding="utf-8").lower()
    assert "nccl" in text


def test_torchlens_run_one_nccl_rank(tmp_path: Path, artifacts: Path, figures: dict) -> None:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torchlens", "run", "--out", str(run), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "1", str(Path(nccl_loop.__file__))]
    done = subprocess.run(cmd, cwd=REPO, env=child_env(TL_STEPS="24"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _check_run_folder(run, figures)
    html = artifacts / "cuda_run_report.html"
    rep = subprocess.run([sys.executable, "-m", "torchlens", "report", str(run), "-o", str(html)],
                         cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=180)
    assert rep.returncode == 0, rep.stderr[-3000:]
    figures["verdict"] = next((ln for ln in done.stdout.splitlines()
                               if ln.startswith("verdict:")), None)
