"""The peak of an allocator snapshot and what it was made of: torchlens vs Meta's Mosaic,
side by side in one process (issue 24's speed target: peak and categories of the
largest shared snapshot in under 1 s and at least 5x faster than Mosaic's peak).

torchlens: ``load_gpumem(path).analysis()`` (the whole report's analysis: timeline,
peak with categories and sites, fragmentation, leaks) then ``categories()`` and
``peak()``, what ``torchlens report X.pickle`` computes. Mosaic:
``mosaic.cmd.entry_point.get_memory_usage_peak`` as its ``mosaic_get_memory_usage_peak``
command runs it (printing the stack at the peak, to a buffer here). Imports are
outside both timers; each side runs ``--repeat`` times in turn and the median is
kept. Mosaic is never a torchlens dependency: pass its checkout with ``--mosaic``
(``git clone https://github.com/facebookresearch/mosaic``). Its plotting and config
imports (altair, omegaconf, tabulate), unused on the peak path, are stubbed when
missing.

The figures differ by definition, printed side by side:

- Mosaic's "dynamic peak" is counted from 0 at the trace's first entry, over the
  requested sizes of allocs and ``free_completed``; its "static" memory is the
  blocks allocated at the dump that the trace never touches; its overall peak is
  their sum.
- torchlens's peak is the timeline's: allocated falls at ``free_requested``,
  every block counts its allocator-rounded size (what ``memory_stats``' allocated
  bytes counts), and the starting level is worked back from the segments at the
  dump less the trace's net change (so blocks allocated before the window and
  freed in it count too).

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_memory_peak.py --mosaic /tmp/mosaic
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
import types
from pathlib import Path

SNAPSHOTS = Path(__file__).resolve().parents[2] / "shared" / "testdata" / "snapshots"
GIB = 1 << 30


def _stub(name: str, **attrs: object) -> None:
    try:
        __import__(name)
    except ImportError:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod


def mosaic_peak_fn(checkout: str):
    sys.path.insert(0, checkout)
    _stub("altair")
    _stub("tabulate", tabulate=lambda *a, **k: "")
    _stub("omegaconf", DictConfig=dict, OmegaConf=types.SimpleNamespace(create=dict))
    from mosaic.cmd.entry_point import get_memory_usage_peak

    def run(path: str) -> dict[str, float]:
        with contextlib.redirect_stdout(io.StringIO()):
            m = get_memory_usage_peak(snapshot=path, trace="", allocation="", action="alloc",
                                      paste=False, print_stack=True, upload_result=False)
        s = m.memory_snapshot
        return {"dynamic": s.dynamic_memory_peak, "static": s.static_memory,
                "overall": s.dynamic_memory_peak + s.static_memory}
    return run


def torchlens_peak(path: str) -> dict[str, object]:
    from torchlens.frontends.api import load_gpumem

    r = load_gpumem(path)
    a = r.analysis()
    cats, sites = r.categories(), r.peak()
    return {"peak": a.peak.peak, "top": cats.iloc[0]["category"] if len(cats) else "",
            "sites": len(sites)}


def _either(fn, snap: Path) -> dict:
    """One side's figures, or why it could not read the file (a side's failure is a
    figure here, not the end of the comparison)."""
    try:
        return fn(str(snap))
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return {"failed": f"failed: {type(exc).__name__}: {str(exc)[:60]}"}


def timed(fn, path: str, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(path)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", nargs="?", help="default: the largest shared snapshot")
    ap.add_argument("--mosaic", required=True, help="a checkout of facebookresearch/mosaic")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--all", action="store_true",
                    help="also the peak figures of every shared snapshot, side by side")
    args = ap.parse_args()
    path = args.snapshot or str(max(SNAPSHOTS.glob("*.pickle"), key=os.path.getsize))
    mosaic = mosaic_peak_fn(args.mosaic)
    import pandas  # noqa: F401  both sides use it: imported before either timer

    import torchlens.analysis.memory.analyze  # noqa: F401
    import torchlens.frontends.api  # noqa: F401

    timed(torchlens_peak, path, 1)  # warm both (first-call imports inside torch/pandas)
    timed(mosaic, path, 1)
    tl_s, tl = timed(torchlens_peak, path, args.repeat)
    mo_s, mo = timed(mosaic, path, args.repeat)
    print(f"snapshot: {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
    print(f"torchlens peak + categories + sites: {tl_s:.3f} s  (median of {args.repeat})")
    print(f"Mosaic peak command:                 {mo_s:.3f} s  (median of {args.repeat})")
    print(f"ratio (Mosaic / torchlens): {mo_s / tl_s:.1f}x")
    print(f"torchlens peak: {tl['peak'] / GIB:.3f} GiB (largest category {tl['top']})")
    print(f"Mosaic: dynamic peak {mo['dynamic'] / GIB:.3f} GiB + static "
          f"{mo['static'] / GIB:.3f} GiB = {mo['overall'] / GIB:.3f} GiB")
    print(f"torchlens / Mosaic overall: {tl['peak'] / mo['overall']:.4f}")
    if args.all:
        print("\nsnapshot | torchlens peak GiB | Mosaic dynamic + static = overall GiB | ratio")
        for snap in sorted(SNAPSHOTS.glob("*.pickle")):
            t, m = _either(torchlens_peak, snap), _either(mosaic, snap)
            tl_text = f"{t['peak'] / GIB:.3f}" if "peak" in t else t["failed"]
            mo_text = (f"{m['dynamic'] / GIB:.3f} + {m['static'] / GIB:.3f} = "
                       f"{m['overall'] / GIB:.3f}" if "overall" in m else m["failed"])
            ratio = (f"{t['peak'] / m['overall']:.4f}" if "peak" in t and m.get("overall")
                     else "-")
            print(f"{snap.name} | {tl_text} | {mo_text} | {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
