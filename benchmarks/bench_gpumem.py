"""%%gpumem CPU-path overhead: the same cell of training steps under the magic vs plain.

Timed inside the cell (the magic's start/stop and the report are outside the
measured body, as for %%torchprof), in a real IPython shell. Rounds alternate
so machine noise hits both; round 0 is a warm-up (the first profiled run of a
process is much slower). Also reports the stacks-off variant (``--stacks 0``:
profiler [memory] events only) to show what the per-op stack capture costs,
and the time from the cell's end to the display bundle.

Run: .venv/bin/python benchmarks/bench_gpumem.py
     .venv/bin/python benchmarks/bench_gpumem.py --micro   (per-call costs quoted in
     torchlens/capture/memory/cpu.py: one thread, process time, a 16-wide MLP so
     that Python dominates)
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
import timeit

import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10))
OPT = torch.optim.SGD(MODEL.parameters(), lr=0.01, momentum=0.9)
X, Y = torch.randn(64, 512), torch.randint(0, 10, (64,))


def body(steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        OPT.zero_grad()
        nn.functional.cross_entropy(MODEL(X), Y).backward()
        OPT.step()
    return time.perf_counter() - t0


def overhead(rounds: int = 15, steps: int = 100) -> dict[str, float]:
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext torchlens")
    shell.user_ns.update(body=body, steps=steps)
    cells = {"plain": "_t = body(steps)",
             "gpumem": "%%gpumem --quiet -o _r\n_t = body(steps)",
             "gpumem --stacks 0": "%%gpumem --quiet --stacks 0 -o _r\n_t = body(steps)"}
    times: dict[str, list[float]] = {k: [] for k in cells}
    report: list[float] = []
    for i in range(rounds + 1):
        for name, cell in cells.items():
            assert shell.run_cell(cell).success
            if i:
                times[name].append(shell.user_ns["_t"])
        if i:
            t0 = time.perf_counter()
            shell.user_ns["_r"]._repr_mimebundle_()
            report.append(time.perf_counter() - t0)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["report_s"] = statistics.median(report)
    out["allocs"] = len(shell.user_ns["_r"].analysis().timeline.allocations)
    return out


def micro(rounds: int = 12, steps: int = 50) -> None:
    """Per-call costs of the function mode, the recorder's parts and the profiler."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._traceback import CapturedTraceback

    from torchlens.capture.memory.cpu import (
        MemoryEvents,
        SiteRecorder,
        gather_traceback,
    )

    class Empty(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **kwargs) if kwargs else func(*args)

    torch.set_num_threads(1)
    p = nn.Parameter(torch.randn(4))
    p.grad = torch.zeros(4)
    x = torch.randn(4)
    ns = {"p": p, "x": x, "F": nn.functional, "torch": torch, "time": time,
          "CapturedTraceback": CapturedTraceback, "gather_traceback": gather_traceback}

    def us(stmt: str, n: int = 20000) -> float:
        return min(timeit.repeat(stmt, number=n, repeat=5, globals=ns)) / n * 1e6

    print("\nPer call, us (min of 5):            no mode   empty mode")
    for stmt in ("p.grad", "x.add_(0)", "F.relu(x)"):
        base = us(stmt)
        with Empty():
            print(f"  {stmt:<34} {base:7.2f}   {us(stmt):7.2f}")
    for stmt in ("CapturedTraceback.extract(script=False, cpp=False)",
                 "gather_traceback(True, False, False)", "time.time_ns()",
                 "time.perf_counter_ns()"):
        print(f"  {stmt:<52} {us(stmt):6.2f}")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xs, ys = torch.randn(4, 16), torch.randint(0, 10, (4,))

    def step_time() -> float:
        t0 = time.process_time()
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xs), ys).backward()
            opt.step()
        return time.process_time() - t0

    class Counter(TorchFunctionMode):
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Counter.n += 1
            return func(*args, **kwargs) if kwargs else func(*args)

    class FirstBuilt(TorchFunctionMode):
        """SiteRecorder as first built: extract() and an interval on every call."""

        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[int, int, object]] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            t0 = time.time_ns()
            tb = CapturedTraceback.extract(script=False, cpp=False)
            out = func(*args, **(kwargs or {}))
            self.rows.append((t0, time.time_ns(), tb))
            return out

    with Counter():
        step_time()
    calls = Counter.n / steps
    with SiteRecorder() as rec:
        step_time()
    recorded = len(rec.starts) / steps
    import torch.profiler as tp

    variants = {
        "plain": contextlib.nullcontext,
        "empty mode": Empty,
        "SiteRecorder as first built": FirstBuilt,
        "SiteRecorder": SiteRecorder,
        "torch.profiler.profile(profile_memory)":
            lambda: tp.profile(activities=[tp.ProfilerActivity.CPU], profile_memory=True),
        "MemoryEvents (USER_SCOPE)": MemoryEvents,
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    step_time()
    for i in range(rounds + 1):
        for name, make in variants.items():
            with make():
                t = step_time()
            if i:
                times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n16-wide MLP step: {calls:.0f} torch calls from Python, {recorded:.0f} recorded "
          f"(the rest in NO_ALLOC); process time, median of {rounds}")
    for name, t in med.items():
        extra = (t - med["plain"]) / steps
        per_call = f"   {extra / calls * 1e6:+6.2f} us/call" if "mode" in name or "Site" in name else ""
        print(f"  {name:<40} {t / steps * 1e6:8.1f} us/step  {extra * 1e6:+7.1f}{per_call}")


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if "--micro" in sys.argv[1:]:
        micro()
        return
    r = overhead()
    print("\nOverhead: cell of 100 train steps (MLP 512-512-512-10, batch 64), median of 15 rounds")
    print(f"  plain                 {r['plain'] * 1e3:8.1f} ms")
    for name in ("gpumem", "gpumem --stacks 0"):
        print(f"  %%{name:<19} {r[name] * 1e3:8.1f} ms   ratio {r[name] / r['plain']:.3f}x"
              "   (target <= 1.3x)")
    print(f"\nDisplay bundle (HTML + text) after the cell: {r['report_s']:.2f} s "
          f"({r['allocs']:,} allocations)")


if __name__ == "__main__":
    main()
