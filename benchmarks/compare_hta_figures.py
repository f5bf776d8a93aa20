"""torchlens' per-rank figures next to HTA's on each shared trace.

HTA's figures were recorded once, with HTA 0.5.0 at its defaults, by
``bench_multirank_hta.py --figures`` into ``hta_reference_figures.json``
(HTA is not needed to run this). Printed per trace: idle, compute and
non-compute % of the GPU timeline and the communication/computation overlap,
torchlens then HTA, and the difference in percentage points.

    .venv/bin/python benchmarks/compare_hta_figures.py [--traces ../shared/testdata/traces]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from torchlens.analysis.multirank import comm_comp_overlap, temporal_breakdown
from torchlens.formats.kineto import load_trace

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default=str(HERE.parent.parent / "shared/testdata/traces"))
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


if __name__ == "__main__":
    main()
