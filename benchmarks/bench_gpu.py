"""GPU overheads side by side in one process: torchlens vs what it wraps.

- ``%%torchprof`` cell: 8 Linear(1024) layers, 10 forward/backward/SGD steps on
  CUDA, timed from the block's start to its report being ready (the display
  bundle), against a bare ``torch.profiler.profile`` (CPU + CUDA activities)
  with ``key_averages().table()``, and against no profiler at all.
- ``%%gpumem`` cell: the same steps with allocator history on, to the report,
  against torch's own ``_record_memory_history`` + ``_snapshot`` (what a user
  would do by hand), and against no recording.

Rounds alternate so clock and thermal noise hit every variant; round 0 is a
warm-up and is dropped. Medians in ms, ratios from the same run.

Run: python benchmarks/bench_gpu.py [--rounds 6] [--json OUT.json]
On a machine without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def workload(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = 10) -> None:
    import torchlens

    for _ in range(steps):
        x = torch.randn(256, 1024, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torchlens.step()
    torch.cuda.synchronize()


def bare(model, opt) -> None:
    workload(model, opt)


def bare_profiler(model, opt) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        workload(model, opt)
    prof.key_averages().table(sort_by="cuda_time_total", row_limit=20)


def torchlens_torchprof(model, opt) -> None:
    import torchlens
    from torchlens.frontends.kinds import display_bundle

    with torchlens.torchprof() as r:
        workload(model, opt)
    display_bundle(r.profile, r.analysis())


def bare_history(model, opt) -> None:
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        workload(model, opt)
        torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def torchlens_gpumem(model, opt) -> None:
    import torchlens
    from torchlens.frontends.kinds import display_bundle

    with torchlens.gpumem() as r:
        workload(model, opt)
    display_bundle(r.profile, r.analysis())


GROUPS = {
    "torchprof": (bare, bare_profiler, torchlens_torchprof),
    "gpumem": (bare, bare_history, torchlens_gpumem),
}


def run(rounds: int) -> dict:
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out: dict[str, dict[str, float]] = {}
    for group, variants in GROUPS.items():
        times: dict[str, list[float]] = {v.__name__: [] for v in variants}
        for i in range(rounds + 1):
            for v in variants:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                v(model, opt)
                dt = time.perf_counter() - t0
                if i:
                    times[v.__name__].append(dt * 1000)
        out[group] = {k: statistics.median(t) for k, t in times.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing measured")
        return
    got = run(args.rounds)
    got["device"] = torch.cuda.get_device_name(0)
    got["torch"] = torch.__version__
    for group in GROUPS:
        g = got[group]
        names = list(g)
        print(f"{group}: " + ", ".join(f"{n} {g[n]:.1f} ms" for n in names))
        base, peer, ours = (g[n] for n in names)
        print(f"  torchlens / {names[1]} = {ours / peer:.2f}x; "
              f"{names[1]} / bare = {peer / base:.2f}x; torchlens / bare = {ours / base:.2f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(got, fh, indent=1)


if __name__ == "__main__":
    main()
