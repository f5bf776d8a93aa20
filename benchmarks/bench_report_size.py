"""Report size of the largest shared trace (issue 2): bytes, glyphs vs events, time.

Run: python benchmarks/bench_report_size.py [TRACE]
The target is a report under 10 MB whose timeline draws a bounded number of
glyphs (see torchlens.render.trace.timeline for why merging sub-pixel events is safe).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import paths

from torchlens.formats.kineto import load_trace
from torchlens.frontends.kinds import report_html as render_report
from torchlens.model import Profile
from torchlens.render.trace import timeline

DEFAULT = paths.traces() / "v100_ddp_sgd_annotations_rank0.json.gz"


def main(path: Path = DEFAULT) -> None:
    t0 = time.perf_counter()
    trace = load_trace(path)
    t1 = time.perf_counter()
    _, stats = timeline.build_timeline(trace)
    t2 = time.perf_counter()
    html = render_report(Profile(kind="trace", traces={"main": trace}))
    t3 = time.perf_counter()
    size = len(html.encode())
    print(f"trace            {path.name}")
    print(f"trace events     {len(trace.events):,} (timed X events {stats.events:,})")
    print(f"lanes            {stats.lanes}")
    print(f"glyphs drawn     {stats.glyphs:,} = {stats.drawn:,} events + "
          f"{stats.merged_bars:,} busy bars ({stats.merged_events:,} events merged)")
    print(f"report size      {size / 1e6:.2f} MB ({size:,} bytes; target < 10 MB)")
    print(f"ingest           {t1 - t0:.2f} s")
    print(f"timeline build   {t2 - t1:.2f} s")
    print(f"render_report    {t3 - t2:.2f} s (analysis + tables + timeline + embed)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT,
                    help="default: the largest shared trace (benchmarks/paths.py)")
    main(ap.parse_args().trace)
