"""A profiled step's stop and trace export run in the training thread and take
seconds when the step has many events: the rank says it is busy there (its
heartbeat's phase under ``%ddp_check``), so the hang clock does not run."""

from __future__ import annotations

from pathlib import Path

import torch

from torchlens.capture.ranks.stepper import RankProfiler


def _watch(rp: RankProfiler, seen: list[tuple[str, bool]]) -> None:
    """Wrap the running profiler's stop and export: note whether the rank said busy."""
    prof = rp.prof
    stop, export = prof.stop, prof.export_chrome_trace
    prof.stop = lambda: (seen.append(("stop", rp.exporting)), stop())[1]
    prof.export_chrome_trace = lambda p: (seen.append(("export", rp.exporting)), export(p))[1]
    prof._wrapped = True


def test_a_rank_is_marked_busy_while_the_profiler_stops_and_exports(tmp_path: Path) -> None:
    rp = RankProfiler(rank=0, run_dir=str(tmp_path), device=None, every=1)
    seen: list[tuple[str, bool]] = []
    rp.start()
    try:
        x = torch.ones(4)
        for _ in range(6):
            if rp.prof is not None and not hasattr(rp.prof, "_wrapped"):
                _watch(rp, seen)
            x = x + 1
            rp.step()
    finally:
        rp.finish(wait_s=1.0)
    assert ("stop", True) in seen and ("export", True) in seen, seen
    assert all(busy for _, busy in seen), seen
    assert rp.exporting is False  # and not after

