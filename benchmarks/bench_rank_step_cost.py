"""What ``%ddp_check --profile`` costs per step on a rank, outside profiled steps.

Times, in one process, ``RankProfiler.step()`` alone (the step record, RSS,
phase totals) and a small forward/backward/optimizer step bare, with the
phase wrappers installed (``PhaseClock``), and with the optimizer step
ending each step too (a job that never calls ``torchlens.step()``: a step
record per ``optimizer.step()``), as medians of repeated timeit runs. No
process group: the figures are the rank side's own cost. Then what a step
of a compiled job costs torchlens on top: reading where ``torch.compile``'s
records stand at each step's end (``CompileSteps.take``, dynamo imported
and a model compiled, nothing compiling in the step), and a float16 step
through ``torch.amp.GradScaler`` bare and with its skips counted
(``ScalerSteps``).

    .venv/bin/python benchmarks/bench_rank_step_cost.py
"""

from __future__ import annotations

import statistics
import tempfile
import timeit

import torch

from torchlens.capture.ranks.stepper import RankProfiler, rss_bytes
from torchlens.capture.trace.compiled import CompileSteps
from torchlens.capture.trace.scaler import ScalerSteps


def _median_us(fn, number: int, repeat: int = 7) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    torch.set_num_threads(1)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 8)

    def train_step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    bare = _median_us(train_step, 2000)
    with tempfile.TemporaryDirectory() as tmp:
        rp = RankProfiler(rank=0, run_dir=tmp, device=torch.device("cpu"), every=10**9)
        rp.start()
        # a job without torchlens.step(): each optimizer step ends a step (its record)
        found = _median_us(train_step, 2000)
        rp.found.remove()  # the phase wrappers alone
        wrapped = _median_us(train_step, 2000)
        step = _median_us(rp.step, 2000)
        rp.finish()
    print(f"RSS read (/proc/self/statm): {_median_us(rss_bytes, 5000):.1f} µs")
    print(f"torchlens.step() (no profiling): {step:.1f} µs")
    print(f"forward+backward+SGD step: bare {bare:.1f} µs, with phase wrappers {wrapped:.1f} µs "
          f"(+{wrapped - bare:.1f} µs); with the optimizer step ending each step (no "
          f"torchlens.step() in the job) {found:.1f} µs (+{found - bare:.1f} µs)")
    compiled_and_scaled(model, x)


def compiled_and_scaled(model: torch.nn.Module, x: torch.Tensor) -> None:
    compiled = torch.compile(model, backend="eager")
    compiled(x)  # dynamo imported, one graph compiled: what a compiled job's steps look at
    steps = CompileSteps()
    steps.take()  # the first look takes what compiled before
    look = _median_us(steps.take, 20000)
    print(f"torch.compile records looked at, a step that compiled nothing: {look:.2f} µs")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")

    def amp_step() -> None:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    bare = _median_us(amp_step, 1000)
    counted = ScalerSteps()
    counted.install()
    try:
        watched = _median_us(amp_step, 1000)
        take = _median_us(counted.take, 20000)
    finally:
        counted.remove()
    print(f"float16 step with GradScaler: bare {bare:.1f} µs, skips counted {watched:.1f} µs "
          f"(+{watched - bare:.1f} µs); the step's scaler figures taken: {take:.2f} µs")


if __name__ == "__main__":
    main()
