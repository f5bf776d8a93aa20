"""``%ddp_check --profile`` and ``torchlens run`` with one NCCL rank on a GPU:
CUDA memory per step, the largest free block, kernel lanes, NCCL kernels."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import cloudpickle

from . import nccl_loop
from .conftest import REPO, child_env

cloudpickle.register_pickle_by_value(nccl_loop)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _nccl_kernels(trace: Path) -> list[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return [e["name"] for e in events
            if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()]


def _check_run_folder(run: Path, figures: dict) -> None:
    steps = _lines(run / "rank0" / "steps.jsonl")
    mems = [s.get("mem") or {} for s in steps]
    assert all(m.get("source") == "cuda" for m in mems), mems[:3]
    assert all((m.get("allocated") or 0) > 0 for m in mems), mems[:3]
    manifest = json.loads((run / "manifest.json").read_text())
    traces = [run / t for t in manifest["ranks"][0]["traces"]]
    assert traces, manifest
    nccl = [k for t in traces for k in _nccl_kernels(t)]
    figures.update(steps=len(steps), traces=len(traces), nccl_kernels=sorted(set(nccl))[:5],
                   allocated=mems[-1].get("allocated"), largest_free=mems[-1].get("largest_free"))
    assert nccl, "no NCCL kernel in the profiled steps' traces"
    summaries = run / "rank0" / "summaries.jsonl"
    if summaries.exists():
        figures["summary_keys"] = sorted(_lines(summaries)[-1])


def test_ddp_check_profile_one_nccl_rank(tmp_path: Path, artifacts: Path, figures: dict) -> None:
    from torchlens.frontends.ddp.api import ddp_check

    run = tmp_path / "run"
    res = ddp_check(nccl_loop.train, world_size=1, backend="nccl", profile=True, steps=12,
                    profile_every=4, run_dir=str(run), live=False, timeout=120)
    assert res.records.outcome == "finished", res
    _check_run_folder(run, figures)
    html = artifacts / "cuda_ddp_profile.html"
    res.export(str(html))
    text = html.read_text(encoding="utf-8").lower()
    assert "nccl" in text
    shutil.copytree(run, artifacts / "cuda_ddp_run", dirs_exist_ok=True)


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
