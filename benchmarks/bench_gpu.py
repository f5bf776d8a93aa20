"""GPU overheads side by side in one process: torchlens vs what it wraps.

- ``%%torchprof`` cell: 8 Linear(1024) layers, 10 forward/backward/SGD steps on
  CUDA, under ``torchlens.torchprof()`` against a bare ``torch.profiler.profile``
  (CPU + CUDA activities) and against no profiler at all.
- ``%%gpumem`` cell: the same steps under ``torchlens.gpumem()`` against torch's
  own ``_record_memory_history`` + ``_snapshot`` (what a user would do by
  hand), and against no recording.

Two figures each, so both sides time the same work: "capture" (the block
until its result exists: for the bare tools, the profile or the snapshot) and
"report" (what the user then reads: ``key_averages().table()`` for the bare
profiler, the HTML + text display bundle for torchlens; the bare snapshot has
no report). The ratio printed is of capture times.

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


def _timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bare(model, opt) -> tuple[float, float]:
    return _timed(lambda: workload(model, opt)), 0.0


def bare_profiler(model, opt) -> tuple[float, float]:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])

    def capture():
        with prof:
            workload(model, opt)

    return _timed(capture), _timed(
        lambda: prof.key_averages().table(sort_by="cuda_time_total", row_limit=20))


def _torchlens(capture_block, model, opt) -> tuple[float, float]:
    """A torchlens capture of the workload, then its report (the display bundle)."""
    from torchlens.frontends.kinds import display_bundle

    box = {}

    def capture():
        with capture_block() as r:
            workload(model, opt)
        box["r"] = r

    cap = _timed(capture)
    r = box["r"]
    return cap, _timed(lambda: display_bundle(r.profile, r.analysis()))


def torchlens_torchprof(model, opt) -> tuple[float, float]:
    import torchlens

    return _torchlens(torchlens.torchprof, model, opt)


def bare_history(model, opt) -> tuple[float, float]:
    box = {}

    def capture():
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        try:
            workload(model, opt)
            box["snap"] = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)

    return _timed(capture), 0.0  # the snapshot is the result: no report to build


def torchlens_gpumem(model, opt) -> tuple[float, float]:
    import torchlens

    return _torchlens(torchlens.gpumem, model, opt)


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
    out: dict[str, dict[str, dict[str, float]]] = {}
    for group, variants in GROUPS.items():
        times: dict[str, list[tuple[float, float]]] = {v.__name__: [] for v in variants}
        for i in range(rounds + 1):
            for v in variants:
                got = v(model, opt)
                if i:
                    times[v.__name__].append(got)
        out[group] = {k: {"capture_ms": statistics.median(c for c, _ in t) * 1000,
                          "report_ms": statistics.median(r for _, r in t) * 1000}
                      for k, t in times.items()}
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
    print(f"bench_gpu on {got['device']}, torch {got['torch']}: medians of {args.rounds} rounds")
    for group in GROUPS:
        g = got[group]
        names = list(g)
        for n in names:
            print(f"  {group:9} {n:20} capture {g[n]['capture_ms']:8.1f} ms   "
                  f"report {g[n]['report_ms']:8.1f} ms")
        base, peer, ours = (g[n]["capture_ms"] for n in names)
        print(f"  {group}: capture torchlens / {names[1]} = {ours / peer:.2f}x "
              f"({names[1]} / bare = {peer / base:.2f}x)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(got, fh, indent=1)


if __name__ == "__main__":
    main()
