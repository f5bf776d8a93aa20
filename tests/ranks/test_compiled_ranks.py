"""Compiled and mixed-precision training on every rank.

The rules on records (fast): a rank that recompiles while the others wait is
the slow rank, with the guard that failed; a graph break every rank's step
meets is said once for the job; a loss scaler that keeps skipping optimizer
steps is said with its counts and scale. Then real 2-rank ``torchlens run --
torchrun`` jobs of the zoo (``aot_eager`` backend, a few seconds to compile):
the terminal, ``torchlens analyze`` and the report agree, and torchlens' own
timers never reach what torch compiles (they once made DDP's forward
recompile every step until torch gave up compiling it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import torchlens as torchlens_pkg
from ranks.helpers import REPO, env, report
from torchlens.analysis.ranks.job_wide import job_wide
from torchlens.analysis.ranks.slow import slow_rank
from torchlens.model.compiled import CompiledFrame, CompileLog
from torchlens.model.records import ScalerStep, StepRecord

T0 = 1795804276.0
GUARD = "3/0: tensor 'x' size mismatch at index 0. expected 32, actual 24"
BREAK = ("Unsupported Tensor.item() call with capture_scalar_outputs=False\n  Explanation: ...\n"
         "  Hint: Set `torch._dynamo.config.capture_scalar_outputs = True`")

#: torchlens' own package folder (a clone's folder is named torchlens too)
PACKAGE = str(Path(torchlens_pkg.__file__).parent) + os.sep


def _first_compile(file: str = "/home/u/train.py") -> CompileLog:
    """Step 0's compiles: forward breaks at line 41, dynamo resumes after it."""
    return CompileLog(frames=[
        CompiledFrame(compile_id="0/0", frame="forward", file=file, line=38, compile_s=0.9,
                      restart_reasons=[BREAK]),
        CompiledFrame(compile_id="1/0", frame="torch_dynamo_resume_in_forward_at_41",
                      file=file, line=41, compile_s=0.2)],
        graph_breaks={BREAK: 1}, unique_graphs=2)


def _records(recompile_at: tuple[int, ...] = (), compile_s: float = 0.25, steps: int = 100,
             breaks: bool = False, skip_every: int = 0) -> list[list[StepRecord]]:
    out = []
    for r in range(2):
        t, recs = T0, []
        for s in range(steps):
            hit = r == 1 and s in recompile_at
            extra = 1e3 * compile_s if s in recompile_at else 0.0
            forward = 2.0 + ((s * 7 + r * 3) % 11) * 0.05 + (extra if r == 1 else 0.0)
            backward = 3.0 + (extra if r == 0 else 0.0)
            ms = 0.2 + forward + backward + 0.5 + 0.2
            extra_fields: dict = {}
            if s == 0 and breaks:
                extra_fields["compiled"] = _first_compile()
            if s and s % 50 == 0 and breaks:
                extra_fields["compiled_so_far"] = _first_compile()
            if hit:
                extra_fields["compiled"] = CompileLog(frames=[CompiledFrame(
                    compile_id=f"3/{recompile_at.index(s) + 1}", frame="forward",
                    file="/home/u/train.py", line=38, compile_s=compile_s,
                    recompile_reason=GUARD)])
            if skip_every:
                n = s + 1
                extra_fields["scaler"] = ScalerStep(
                    steps=1, skipped=int(n % skip_every == 0), scale=65536.0 / 2 ** (n // skip_every),
                    total_steps=n, total_skipped=n // skip_every, first_scale=65536.0)
            recs.append(StepRecord(step=s, t0=t, t1=t + ms / 1e3, **extra_fields,
                                   phases={"data": 0.2e-3, "forward": forward / 1e3,
                                           "backward": backward / 1e3, "optimizer": 0.5e-3,
                                           "collective": 0.0, "save": 0.0, "eval": 0.0}))
            t += ms / 1e3
        out.append(recs)
    return out


def test_a_rank_that_recompiles_while_the_others_wait_is_the_slow_rank() -> None:
    v = slow_rank(_records(recompile_at=(62, 87)))
    assert (v.rank, v.cause) == (1, "recompile"), v.finding
    s = v.finding.sentence
    assert "recompiled at steps 62 and 87" in s, s
    assert "forward (train.py:38): tensor 'x' size mismatch at index 0. expected 32, actual 24" in s
    assert "3/0:" not in s  # torch's compile id of the guard is not the user's words
    assert v.finding.value("recompiles") == 2 and v.finding.value("recompile_ms") == 250.0
    assert "mark_dynamic" in v.finding.advice


def test_every_rank_recompiling_alike_is_no_slow_rank() -> None:
    recs = _records(recompile_at=(62,))
    rank0 = recs[0][62]
    recs[0][62] = rank0.replace(compiled=recs[1][62].compiled, phases={
        **rank0.phases, "forward": recs[1][62].phases["forward"], "backward": 3e-3})
    v = slow_rank(recs)
    assert v.rank is None, v.finding


def test_a_short_recompile_is_no_stall() -> None:
    v = slow_rank(_records(recompile_at=(62, 87), compile_s=0.004))  # 4 ms: under the floor
    assert v.cause != "recompile", v.finding


def test_a_graph_break_in_every_ranks_step_is_said_once_for_the_job() -> None:
    recs = _records(breaks=True)
    window = [r[-60:] for r in recs]  # step 0's compiles are outside: compiled_so_far says them
    f = job_wide(window)
    assert f is not None and f.code == "graph_break", f
    assert f.sentence.startswith("every rank's compiled step breaks its graph in forward at "
                                 "train.py:41: Unsupported Tensor.item() call"), f.sentence
    assert f.ranks == (0, 1) and "capture_scalar_outputs" in f.advice


def test_a_graph_break_inside_torch_is_not_the_users() -> None:
    recs = _records()
    lib = "/x/.venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py"
    for r in range(2):
        recs[r][0] = recs[r][0].replace(compiled=_first_compile(lib))
    assert job_wide(recs) is None


def test_a_scaler_that_keeps_skipping_steps_is_said_with_its_counts_and_scale() -> None:
    f = job_wide([r[-60:] for r in _records(skip_every=10)])
    assert f is not None and f.code == "skipped_steps", f
    assert ("skipped 6 of the last 60 optimizer steps on every rank for inf/nan gradients; "
            "10 of 100 since the start, scale 65,536 -> 64") in f.sentence, f.sentence
    assert f.ranks == (0, 1)
    # a scaler that found its scale once and then trained is no finding
    assert job_wide([r[-60:] for r in _records(skip_every=1000)]) is None


def _zoo(job: str, out: Path, timeout: float = 300) -> str:
    cmd = [sys.executable, "-m", "torchlens", "run", "--out", str(out), "--", sys.executable,
           "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(REPO / "benchmarks" / "zoo" / f"{job}.py")]
    done = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _verdict(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("verdict: "))


@pytest.mark.slow
def test_a_recompiling_rank_is_named_alike_in_the_terminal_analyze_and_report(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    printed = _verdict(_zoo("recompile_one", out))
    assert printed.startswith("verdict: rank 1 is the slow rank: it recompiled at steps 62 "
                              "and 87 (guard failed: forward (_zoo.py:"), printed
    assert "size mismatch at index 0. expected 32, actual 24" in printed
    analyzed = subprocess.run([sys.executable, "-m", "torchlens", "analyze", str(out)], cwd=REPO,
                              env=env(), capture_output=True, text=True, timeout=120).stdout
    assert _verdict(analyzed) == printed
    _, html = report(out, tmp_path)
    assert "it recompiled at steps 62 and 87" in html
    # torchlens' timers are not in what torch compiled: no frame of ours, and
    # DDP's wrapper is compiled once, not once a step
    for r in range(2):
        for line in (out / f"rank{r}" / "steps.jsonl").read_text().splitlines():
            log = json.loads(line).get("compiled") or {}
            files = [f["file"] for f in log.get("frames", [])]
            assert not [f for f in files if f.startswith(PACKAGE)], files
        compiles = [json.loads(line) for line in
                    (out / f"rank{r}" / "steps.jsonl").read_text().splitlines()]
        steps_compiling = [d["step"] for d in compiles if d.get("compiled")]
        assert steps_compiling == ([0, 62, 87] if r == 1 else [0]), steps_compiling


def test_a_scale_under_one_and_a_scaler_that_skips_every_step() -> None:
    recs = _records(skip_every=1)  # every step overflows: the scale halves each time
    f = job_wide([r[-60:] for r in recs])
    assert f is not None and f.severity == "failed", f
    assert "skipped 60 of the last 60" in f.sentence and "training has stopped" in f.sentence
    assert "scale 65,536 -> 5.17e-26" in f.sentence, f.sentence  # not "-> 0"


def test_a_recompile_on_a_value_is_not_given_shape_advice() -> None:
    from torchlens.analysis.trace.compiled import compiled_code

    guard = ("0/0: ___stack2 == 0.22899550199508667  # print('h mean', float(h.mean()))"
             "\nUser stack trace:\n  File \"train.py\", line 12, in forward")
    log = CompileLog(frames=[CompiledFrame(compile_id="0/1", frame="forward", file="/u/t.py",
                                           line=10, compile_s=0.1, recompile_reason=guard)])
    (f,) = [f for f in compiled_code(log, None, 1.0).findings if f.code == "recompile"]
    assert "___stack2 == 0.22899550199508667" in f.sentence and "User stack" not in f.sentence
    assert "mark_dynamic" not in f.advice and "read a value that changed" in f.advice


DDP_COMPILES = """
import os, sys, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1")
if sys.argv[1] == "clock":
    from torchlens.capture.ranks.phases import PhaseClock
    PhaseClock().install()
dist.init_process_group("gloo")
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
model = torch.compile(torch.nn.parallel.DistributedDataParallel(net), backend="eager")
for batch in (8, 8, 6):
    model(torch.randn(batch, 8)).sum().backward()
from torch._dynamo.utils import get_compilation_metrics
print([(m.compile_id, m.co_name, os.path.basename(m.co_filename), bool(m.recompile_reason))
       for m in get_compilation_metrics()])
dist.destroy_process_group()
"""


def test_torchlens_timers_leave_what_torch_compiles_as_it_was(tmp_path: Path) -> None:
    # torch.compile(DDP(model)) picks how to compile by whether DDP's forward is
    # torch's own: a torchlens wrapper there once made it compile another frame
    # (a model of torch's modules then no longer recompiled where it did)
    from ranks.helpers import free_port

    script = tmp_path / "ddp_compiles.py"
    script.write_text(DDP_COMPILES)
    seen = {}
    for side in ("bare", "clock"):
        done = subprocess.run([sys.executable, str(script), side, str(free_port())], cwd=REPO,
                              env=env(), capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        seen[side] = done.stdout.strip().splitlines()[-1]
    assert seen["clock"] == seen["bare"], seen
    assert "'inner'" in seen["bare"] and "True)" in seen["bare"]  # it recompiled in both


def test_a_scale_that_fell_below_one_is_said_after_the_skips_left_the_window() -> None:
    # 4 skips in the first 40 steps (the scale already below 1), none in the last 60
    def quiet(rec: StepRecord) -> StepRecord:
        s = rec.scaler
        return rec.replace(scaler=ScalerStep(
            steps=1, skipped=s.skipped if rec.step < 40 else 0, scale=0.0625,
            total_steps=s.total_steps, total_skipped=min(s.total_skipped, 4),
            first_scale=65536.0, next_scale=0.0625))

    recs = [[quiet(rec) for rec in r] for r in _records(skip_every=10)]
    f = job_wide([r[-60:] for r in recs])
    assert f is not None and f.code == "skipped_steps", f
    assert "skipped 4 of the run's 100 optimizer steps on every rank" in f.sentence, f.sentence
    assert "scale 65,536 -> 0.0625" in f.sentence and "fell below 1" in f.sentence
    # the same run with the scale settled at 1,024: a scaler that found its scale
    settled = [[rec.replace(scaler=ScalerStep(**{**msgspec.structs.asdict(rec.scaler),
                                                  "scale": 1024.0, "next_scale": 1024.0}))
                for rec in r] for r in recs]
    assert job_wide([r[-60:] for r in settled]) is None


def test_a_rank_a_step_behind_is_still_skipping_with_the_others() -> None:
    recs = _records(skip_every=10)
    lagging = [recs[0][-60:], recs[1][-61:-1]]  # rank 1 one step behind: one skip fewer
    lagging[1] = [rec.replace(scaler=ScalerStep(
        steps=1, skipped=0, scale=rec.scaler.scale, total_steps=rec.scaler.total_steps,
        total_skipped=rec.scaler.total_skipped, first_scale=65536.0))
        if rec.step == 89 else rec for rec in lagging[1]]
    f = job_wide(lagging)
    assert f is not None and "on every rank" in f.sentence and f.ranks == (0, 1), f


def test_a_recompile_before_the_last_steps_is_still_in_the_report(tmp_path: Path) -> None:
    from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest, RankEntry
    from torchlens.formats.run_folder.records import write_steps

    recs = _records(recompile_at=(12,))  # rank 1 recompiles early; 100 steps in all
    for r in range(2):
        write_steps(str(tmp_path), r, [msgspec.to_builtins(rec) for rec in recs[r]])
    manifest = Manifest(world_size=2, source=SOURCE_RUN, started=recs[0][0].t0,
                        ranks=[RankEntry(rank=0, steps=100), RankEntry(rank=1, steps=100)])
    (tmp_path / "manifest.json").write_bytes(msgspec.json.encode(manifest))
    import torchlens

    run = torchlens.load(str(tmp_path))
    codes = [f.code for f in run.findings()]
    assert codes[0] == "slow_rank" and "recompile" in codes, codes
    f = next(f for f in run.findings() if f.code == "recompile")
    assert f.severity == "warning" and f.finding.ranks == (1,)
    assert "rank 1 at step 12 (guard failed: forward (train.py:38): tensor 'x' size mismatch" \
        in f, f
