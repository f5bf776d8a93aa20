"""What the live per-rank view costs as the job grows (issue 14: a watch of hundreds of ranks).

``ProfiledLiveView`` (what ``%ddp_check --profile`` and ``torchlens.watch``
show) for N ranks, set up as the watch sets it up for a ``torchlens run``
feed; each rank sends ``--steps`` step records (a summary every 10th, shaped
as the collector keeps them) and a heartbeat per step. Timed apart:

- build: the empty view (the Bokeh figures and their renderers);
- first flush: everything at once, as a watch that opens a running job;
- next flush: one more step of every rank (what the kernel pays a frame);
- send: ``bokeh.embed.json_item`` of the layout, the document the browser
  receives and builds (its size in MB), and the renderers in it;
- draw (``--browser``): the layout as a standalone page (BokehJS inline) in
  Debian's Chromium, headless, from navigation until BokehJS says the
  document is idle (every view built and painted once).

Run it on two commits to compare (``PYTHONPATH`` picks the checkout):

    PYTHONPATH=.:benchmarks .venv/bin/python benchmarks/bench_live_view_size.py [--ranks 8,64,256,1024] [--steps 60] [--browser]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench_collector_load import _record
from bench_live_feed import _summary

T0 = 1_790_000_000.0


def measure(n: int, steps: int) -> dict[str, Any]:
    from bokeh.embed import json_item
    from bokeh.models import GlyphRenderer

    from torchlens.frontends.shared.live_view import ProfiledLiveView
    from torchlens.model.records import StepRecord

    t = time.perf_counter()
    view = ProfiledLiveView(n, 10, False)
    view.for_run_feed()
    build = time.perf_counter() - t

    def push(lo: int, hi: int) -> None:
        for r in range(n):
            slow = 0.03 if r == n - 3 else 0.0
            recs = []
            for s in range(lo, hi):
                rec = _record(s, T0 + 0.1 * s, T0 + 0.1 * (s + 1) + slow)
                rec["mem"]["rss"] += r * (1 << 20)
                recs.append(StepRecord.from_dict(rec))
            view.push_steps(r, recs)
            for rec in recs:
                if rec.step % 10 == 9:
                    view.push_summary(r, _summary(r, rec.step, rec.t0))
                view.push({"rank": r, "t_rel": rec.t1 - T0, "t": rec.t1, "phase": "step",
                           "rss": rec.mem.rss})

    def flush() -> float:
        t = time.perf_counter()
        view.profile.flush(force=True)
        view.beats.flush(force=True)
        return time.perf_counter() - t

    push(0, steps)
    first = flush()
    push(steps, steps + 1)
    nxt = flush()
    t = time.perf_counter()
    doc = json.dumps(json_item(view.layout))
    send = time.perf_counter() - t
    rends = sum(1 for m in view.layout.references() if isinstance(m, GlyphRenderer))
    return {"ranks": n, "build_s": build, "first_s": first, "next_s": nxt, "send_s": send,
            "mb": len(doc) / 1e6, "renderers": rends, "layout": view.layout}


def draw_s(layout: Any, timeout_s: float = 600.0) -> float | None:
    """Seconds until Chromium's BokehJS has the page's document idle; None past ``timeout_s``."""
    import tempfile

    from bokeh.embed import file_html
    from bokeh.resources import INLINE
    from playwright.sync_api import sync_playwright

    chromium, flags = "/usr/bin/chromium", ["--headless", "--no-sandbox", "--disable-gpu"]
    with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False) as fh:
        fh.write(file_html(layout, INLINE, "torchlens live view"))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=flags)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t = time.perf_counter()
            page.goto(f"file://{fh.name}", timeout=int(timeout_s * 1000))
            page.wait_for_function(
                "() => window.Bokeh && Bokeh.documents.length && Bokeh.documents[0].is_idle",
                timeout=int(timeout_s * 1000), polling=50)
            return time.perf_counter() - t
        except Exception:  # noqa: BLE001 - a timeout is the figure: reported as such
            return None
        finally:
            browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="8,64,256,1024")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--browser", action="store_true", help="also time drawing it in Chromium")
    args = ap.parse_args()
    print("| ranks | build s | first flush s | next flush s | json_item s | document MB "
          "| renderers |" + (" Chromium draw s |" if args.browser else ""))
    print("| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if args.browser else ""))
    for n in (int(x) for x in args.ranks.split(",")):
        m = measure(n, args.steps)
        drawn = ""
        if args.browser:
            s = draw_s(m["layout"])
            drawn = f" {'over 600' if s is None else f'{s:.1f}'} |"
        print(f"| {n:,} | {m['build_s']:.2f} | {m['first_s']:.2f} | {m['next_s']:.3f} "
              f"| {m['send_s']:.2f} | {m['mb']:.1f} | {m['renderers']:,} |{drawn}", flush=True)


if __name__ == "__main__":
    main()
