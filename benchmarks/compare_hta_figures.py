"""torchlens' per-rank figures next to HTA's on each shared trace.

HTA's figures were recorded once, with HTA 0.5.0 at its defaults, by
``bench_multirank_hta.py --figures`` into ``hta_reference_figures.json``
(HTA is not needed to run this). Printed per trace: idle, compute and
non-compute % of the GPU timeline and the communication/computation overlap,
torchlens then HTA, and the difference in percentage points.

Then (``--counters``, on by default) the figures of ``hta_counter_figures.py``
(``hta_counter_figures.json``: HTA run with and without its µs rounding):
idle split per stream, kernel counts per kind, launch statistics, queue length
per stream and memory bandwidth per kind, each torchlens then HTA with the
relative difference in %; ``mode`` says which HTA run (``ns``: times as in
the file, as torchlens reads them; ``rounded``: HTA's default).

    .venv/bin/python benchmarks/compare_hta_figures.py [--traces ../shared/testdata/traces]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import paths

from torchlens.analysis.runs import (
    comm_comp_overlap,
    idle_time,
    kernel_breakdown,
    launch_stats,
    memory_bandwidth,
    queue_length,
    temporal_breakdown,
)
from torchlens.analysis.runs.launches import HTA_LAUNCH_STATS_NAMES
from torchlens.formats.kineto import load_trace

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default=str(paths.traces()),
                    help="the shared traces (default: benchmarks/paths.py's)")
    args = ap.parse_args()
    ref = json.loads((HERE / "hta_reference_figures.json").read_text())["traces"]
    print(f"{'trace':40s} {'figure':12s} {'torchlens':>10s} {'HTA':>8s} {'diff':>7s}")
    for name, entry in ref.items():
        temporal = ((entry.get("figures") or {}).get("temporal")) or []
        path = Path(args.traces) / name
        if len(temporal) != 1 or not path.exists():
            continue  # a multi-rank folder entry, or a trace HTA could not read
        trace = load_trace(path)
        ours = temporal_breakdown(trace)
        over = comm_comp_overlap(trace)
        hta = temporal[0]
        hta_over = ((entry["figures"].get("overlap") or [{}])[0]).get("comp_comm_overlap_pctg")
        pairs = [("idle %", ours["idle_pct"], hta["idle_time_pctg"]),
                 ("compute %", ours["compute_pct"], hta["compute_time_pctg"]),
                 ("non-compute %", ours["non_compute_pct"], hta["non_compute_time_pctg"]),
                 ("overlap %", over["overlap_pct"], hta_over)]
        for label, mine, theirs in pairs:
            diff = "" if mine is None or theirs is None else f"{mine - theirs:+7.2f}"
            m = "None" if mine is None else f"{mine:10.2f}"
            t = "None" if theirs is None else f"{theirs:8.2f}"
            print(f"{name:40s} {label:12s} {m:>10s} {t:>8s} {diff:>7s}")
    counters = HERE / "hta_counter_figures.json"
    if counters.exists():
        compare_counters(json.loads(counters.read_text())["traces"], Path(args.traces))


def _row(trace: str, mode: str, figure: str, mine: float | None, theirs: float | None) -> None:
    if mine is None or theirs is None:
        diff = ""
    elif theirs == 0:
        diff = "0.00" if mine == 0 else "inf"
    else:
        diff = f"{100 * (mine - theirs) / abs(theirs):+.2f}"
    m = "None" if mine is None else f"{mine:.4g}"
    t = "None" if theirs is None else f"{theirs:.4g}"
    print(f"{trace[:30]:30s} {mode:7s} {figure:36s} {m:>12s} {t:>12s} {diff:>8s}")


HTA_KIND = {"COMPUTATION": "compute", "COMMUNICATION": "communication", "MEMORY": "memory",
            "OTHER": "other"}
STATS = (("count", "count"), ("mean", "mean"), ("std", "std"), ("min", "min"),
         ("p25", "25%"), ("p50", "50%"), ("p75", "75%"), ("max", "max"))


def compare_counters(ref: dict, traces: Path) -> None:
    """torchlens vs HTA: idle split, kernel counts, launch stats, queues, memory bw."""
    print(f"\n{'trace':30s} {'mode':7s} {'figure':36s} {'torchlens':>12s} {'HTA':>12s} "
          f"{'diff %':>8s}")
    for name, entry in ref.items():
        path = traces / name
        if not path.exists():
            continue
        for mode in ("ns", "rounded"):
            hta = entry.get(mode) or {}
            if "load_error" in hta or "error" in hta:
                print(f"{name[:30]:30s} {mode:7s} HTA cannot read it: "
                      f"{hta.get('load_error') or hta.get('error', '')[:80]}")
                continue
            trace = load_trace(path)
            for s in idle_time(trace):
                for cat in ("host_wait", "kernel_wait", "other"):
                    theirs = next((r["idle_time"] for r in hta.get("idle") or []
                                   if r["stream"] == s["stream"]
                                   and r["idle_category"] == cat), None)
                    _row(name, mode, f"idle s{s['stream']} {cat} us", s[f"{cat}_us"], theirs)
            kinds = kernel_breakdown(trace).get("kinds") or {}
            for counts in (hta.get("kernels_by_type") or {}).values():
                for hk, n in counts.items():
                    mine = (kinds.get(HTA_KIND.get(hk, "")) or {}).get("count")
                    _row(name, mode, f"kernels {hk.lower()} count", mine, n)
            for names, label in ((HTA_LAUNCH_STATS_NAMES, "HTA's APIs"), (None, "all APIs")):
                mine = (launch_stats(trace, names=names) if names
                        else launch_stats(trace))
                for h in (hta.get("launch") or {}).values():
                    _row(name, mode, f"launch ({label}) n", mine["launches"], h["n"])
                    for key in ("gpu_shorter_than_cpu", "short_kernels", "runtime_outliers",
                                "delay_outliers"):
                        _row(name, mode, f"launch ({label}) {key}", mine[key], h[key])
                    for fig, hfig in (("cpu_us", "cpu_duration"), ("gpu_us", "gpu_duration"),
                                      ("delay_us", "launch_delay")):
                        for k, hk in STATS[1:]:
                            _row(name, mode, f"launch ({label}) {fig} {k}",
                                 (mine[fig] or {}).get(k), h[hfig].get(hk))
            queues = {q["stream"]: q for q in queue_length(trace)}
            for h in hta.get("queue") or []:
                q = queues.get(h["stream"], {})
                for k, hk in STATS:
                    _row(name, mode, f"queue s{h['stream']} {k}", q.get(k), h.get(hk))
            for f in hta.get("queue_full") or []:
                q = queues.get(f["stream"], {})
                _row(name, mode, f"queue s{f['stream']} full us", q.get("full_us"),
                     f["duration_at_max_queue_length"])
            bws = {b["kind"]: b for b in memory_bandwidth(trace)}
            for h in hta.get("memory_bw") or []:
                b = bws.get(h["name"], {})
                for k, hk in STATS:
                    _row(name, mode, f"bw {h['name']} {k}", b.get(k),
                         h.get(f"memory_bw_gbps_{hk}"))


if __name__ == "__main__":
    main()
