"""The peak of an allocator snapshot and what it was made of: torchlens vs Meta's Mosaic,
side by side in one process (issue 24's speed target: peak and categories of the
largest shared snapshot in under 1 s and at least 5x faster than Mosaic's peak).

What each timer holds (issue 26: the same work on both sides):

- "torchlens peak": ``r = torchlens.load_gpumem(path)`` (read the file; the compiled
  reader ``formats/snapshot_columns/read.c`` walks the pickle's opcodes without running
  pickle, refusing every global, checks every entry and gives columns; without it, or
  for a file it declines, the Python loader unpickles and normalizes), then
  ``r.categories()`` and ``r.peak()``: the timeline, the peak, what was alive then by
  category and by site (the site table carries each site's stack as text), as
  DataFrames (``analysis.memory.peak_columns``; without columns ``analyze.peak_part``).
- "Mosaic peak": ``mosaic.cmd.entry_point.get_memory_usage_peak`` as its
  ``mosaic_get_memory_usage_peak`` command runs it: ``pickle.load`` of the file, the
  dynamic and static peak, and the stack at the peak printed (to a buffer here).
- "torchlens full report" (a second figure, more work than Mosaic's): the above plus
  ``r.analysis()``: fragmentation, leaks, top sites, the stacked timeline by
  category and the OOM diagnosis, what ``torchlens report X.pickle`` computes.
- "unpickle floor": ``pickle.load`` of the file alone, as Mosaic reads it (the part of
  Mosaic's time its reading costs; torchlens' compiled reader does not unpickle).

Imports are outside every timer. The timers alternate (torchlens peak, Mosaic, full
report, floor) ``--repeat`` times after a warm-up round, each after a ``gc.collect()``
outside it, and each median is kept, of wall time and of this process's CPU time (which
a loaded machine moves less); the load average before and after is printed (the
machine is shared). ``--stages``: where torchlens' peak time goes, in CPU seconds
(reading the file, the compiled reader's walk and columns, the peak from the columns,
the DataFrames; ``TORCHLENS_NO_NATIVE=1``: the Python loader's stages). Mosaic is never a
torchlens dependency: pass its checkout with ``--mosaic``
(``git clone https://github.com/facebookresearch/mosaic``, or ``scripts/bench-env``). Its plotting and config
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

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_memory_peak.py [--mosaic CHECKOUT]
(``scripts/bench-env`` fetches Mosaic where the default finds it)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import pickle
import statistics
import sys
import time
import types
from pathlib import Path

import paths

SNAPSHOTS = paths.snapshots()
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
    from torchlens.frontends.memory.api import load_gpumem

    r = load_gpumem(path)
    cats, sites = r.categories(), r.peak()
    return {"peak": int(cats["bytes"].sum()),  # the rows add up to the peak exactly
            "top": cats.iloc[0]["category"] if len(cats) else "", "sites": len(sites)}


def torchlens_report(path: str) -> dict[str, object]:
    from torchlens.frontends.memory.api import load_gpumem

    r = load_gpumem(path)
    a = r.analysis()
    cats, sites = r.categories(), r.peak()
    return {"peak": a.peak.peak, "top": cats.iloc[0]["category"] if len(cats) else "",
            "sites": len(sites)}


def unpickle(path: str) -> None:
    with open(path, "rb") as f:
        pickle.load(f)  # noqa: S301 - the benchmark's own shared test file


def stages(path: str) -> dict[str, float]:
    """CPU seconds of each stage of ``torchlens_peak`` (private names: a benchmark's)."""
    from torchlens.formats.gpumem_record import RECORD_KEY
    from torchlens.formats.snapshot_columns import native

    if not native.available():
        return python_stages(path)
    from torchlens.analysis.memory.peak_columns import peak_from_columns
    from torchlens.frontends.memory.api import load_gpumem

    out = {}
    gc.collect()
    c = time.process_time()
    data = Path(path).read_bytes()
    out["read the file"] = time.process_time() - c
    c = time.process_time()
    cols = native.read(data, RECORD_KEY)
    out["reader: walk, check, columns"] = time.process_time() - c
    c = time.process_time()
    peak_from_columns(cols)
    out["peak, categories, sites"] = time.process_time() - c
    r = load_gpumem(path)
    r._fast = peak_from_columns(cols)
    c = time.process_time()
    r.categories(), r.peak()
    out["the two DataFrames"] = time.process_time() - c
    return out


def python_stages(path: str) -> dict[str, float]:
    """``stages`` of the Python path (``TORCHLENS_NO_NATIVE=1``, or no reader built)."""
    from torchlens.analysis.memory import analyze
    from torchlens.frontends.memory.api import load_gpumem
    from torchlens.model import snapshot

    out, real = {}, analyze.analyze_peak
    gc.collect()
    c = time.process_time()
    with open(path, "rb") as f, snapshot._no_gc():
        obj = snapshot._NoGlobalsUnpickler(f).load()
    out["unpickle (collector paused)"] = time.process_time() - c
    c = time.process_time()
    snapshot.normalize_snapshot(obj)
    out["check + normalize"] = time.process_time() - c
    r, spent = load_gpumem(path), []

    def timed_peak(*a, **k):  # noqa: ANN002, ANN003
        c0 = time.process_time()
        res = real(*a, **k)
        spent.append(time.process_time() - c0)
        return res

    analyze.analyze_peak = timed_peak
    try:
        c = time.process_time()
        r._peak_part()
        whole = time.process_time() - c
    finally:
        analyze.analyze_peak = real
    out["timeline (+ start level)"] = whole - spent[0]
    out["peak by category and site"] = spent[0]
    c = time.process_time()
    r.categories(), r.peak()
    out["the two DataFrames"] = time.process_time() - c
    return out


def _either(fn, snap: Path) -> dict:
    """One side's figures, or why it could not read the file (a side's failure is a
    figure here, not the end of the comparison)."""
    try:
        return fn(str(snap))
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return {"failed": f"failed: {type(exc).__name__}: {str(exc)[:60]}"}


def alternating(sides: dict[str, object], path: str,
                repeat: int) -> dict[str, tuple[float, float]]:
    """Each side once per round, in turn, ``repeat`` rounds: per side the median wall
    and CPU seconds of this process (CPU time moves less with the machine's load)."""
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    for _ in range(repeat):
        for name, fn in sides.items():
            gc.collect()  # no side pays for the collections the one before it left due
            t0, c0 = time.perf_counter(), time.process_time()
            fn(path)  # type: ignore[operator]
            times[name].append((time.perf_counter() - t0, time.process_time() - c0))
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
            for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", nargs="?", help="default: the largest shared snapshot")
    ap.add_argument("--mosaic", help="a checkout of facebookresearch/mosaic (default: "
                    "$TORCHLENS_MOSAIC, else the copy scripts/bench-env fetched)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--all", action="store_true",
                    help="also the peak figures of every shared snapshot, side by side")
    ap.add_argument("--stages", action="store_true",
                    help="also torchlens' peak time by stage (CPU seconds)")
    args = ap.parse_args()
    path = args.snapshot or str(max(SNAPSHOTS.glob("*.pickle"), key=os.path.getsize))
    checkout = paths.mosaic_checkout(args.mosaic)
    if checkout is None:
        ap.error("no Mosaic checkout: pass --mosaic, set $TORCHLENS_MOSAIC or run scripts/bench-env")
    mosaic = mosaic_peak_fn(checkout)
    import pandas  # noqa: F401  both sides use it: imported before either timer

    import torchlens.analysis.memory.analyze  # noqa: F401
    import torchlens.frontends.memory.api  # noqa: F401

    sides = {"torchlens peak": torchlens_peak, "Mosaic peak": mosaic,
             "torchlens full report": torchlens_report, "unpickle floor": unpickle}
    alternating(sides, path, 1)  # warm all (first-call imports inside torch/pandas)
    load_before = os.getloadavg()[0]
    med = alternating(sides, path, args.repeat)
    load_after = os.getloadavg()[0]
    tl, mo = torchlens_report(path), mosaic(path)
    same = "same" if torchlens_peak(path)["peak"] == tl["peak"] else "DIFFERS"
    print(f"snapshot: {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
    print(f"load average {load_before:.1f} before, {load_after:.1f} after; medians of "
          f"{args.repeat}, alternating")
    print(f"{'':24s}{'wall':>8s}{'CPU':>8s}")
    for name, (wall, cpu) in med.items():
        print(f"{name + ':':24s}{wall:7.3f}s{cpu:7.3f}s")
    for i, what in enumerate(("wall", "CPU")):
        mo_s, floor = med["Mosaic peak"][i], med["unpickle floor"][i]
        print(f"ratio ({what}) Mosaic / torchlens peak: {mo_s / med['torchlens peak'][i]:.2f}x"
              f" (target 5x; Mosaic / unpickle floor {mo_s / floor:.1f}x); Mosaic / "
              f"torchlens full report: {mo_s / med['torchlens full report'][i]:.2f}x")
    print(f"torchlens peak: {tl['peak'] / GIB:.3f} GiB (largest category {tl['top']}; "
          f"the peak-only path's categories add up to it: {same})")
    print(f"Mosaic: dynamic peak {mo['dynamic'] / GIB:.3f} GiB + static "
          f"{mo['static'] / GIB:.3f} GiB = {mo['overall'] / GIB:.3f} GiB")
    print(f"torchlens / Mosaic overall: {tl['peak'] / mo['overall']:.4f}")
    if args.stages:
        print("\ntorchlens peak by stage, CPU s (median of --repeat):")
        rows = [stages(path) for _ in range(args.repeat)]
        for k in rows[0]:
            print(f"  {k + ':':30s}{statistics.median(r[k] for r in rows):.4f}")
    if args.all:
        print("\nsnapshot | torchlens peak GiB | Mosaic dynamic + static = overall GiB | ratio")
        for snap in sorted(SNAPSHOTS.glob("*.pickle")):
            t, m = _either(torchlens_report, snap), _either(mosaic, snap)
            tl_text = f"{t['peak'] / GIB:.3f}" if "peak" in t else t["failed"]
            mo_text = (f"{m['dynamic'] / GIB:.3f} + {m['static'] / GIB:.3f} = "
                       f"{m['overall'] / GIB:.3f}" if "overall" in m else m["failed"])
            ratio = (f"{t['peak'] / m['overall']:.4f}" if "peak" in t and m.get("overall")
                     else "-")
            print(f"{snap.name} | {tl_text} | {mo_text} | {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
