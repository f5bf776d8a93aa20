"""A ``RUN_DIR/live.json`` as ``torchlens run`` writes it, from a real ``RunView``.

The snapshot is hand-made like tests/ranks/test_run_view.py's (the collector's
``snapshot()`` shape: hello/heartbeat/bye per rank, step records with phase
times and memory); ``run_view`` turns it into the verdict and rank rows, and
``live_document`` lays them out in the documented live.json format
(docs/MULTINODE.md, "In the JupyterLab sidebar").
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from torchlens.analysis.ranks.verdict import RunView, live_status, run_view
from torchlens.model.records import StepRecord


def _rec(step: int, data: float, rss: int, allocated: int | None) -> StepRecord:
    t0 = step * 0.1
    mem: dict[str, Any] = {"rss": rss, "source": "rss"}
    if allocated is not None:
        mem = {"allocated": allocated, "reserved": 2 * allocated, "inactive_split": 0,
               "rss": rss, "source": "cuda"}
    return StepRecord.from_dict({"step": step, "t0": t0, "t1": t0 + 0.05,
                                 "phases": {"data": data, "forward": 0.002, "backward": 0.01,
                                            "optimizer": 0.001, "collective": 0.0},
                                 "mem": mem})


def _info(rank: int, node: int, host: str, **kw: Any) -> dict[str, Any]:
    return {"rank": rank, "node": node, "host": host, "silent_s": 0.5, "bye": None,
            "restart": 0, "heartbeat": {"steps_done": 12}, "steps_sent": 12,
            "shared_run_dir": True, **kw}


def four_rank_view(host1: str = "gpu-b", ended: bool = False,
                   cuda: tuple[int, ...] = (0,)) -> RunView:
    """Two nodes of two ranks: rank 0 on CUDA figures, rank 1 running, rank 2 lost
    (no heartbeat for 30 s), rank 3 failed. ``ended``: the view at the run's end,
    where ranks 0 and 1 said goodbye (finished). ``cuda``: the ranks with allocator
    figures (3 GiB allocated), the others have their RSS only."""
    steps = [[_rec(i, 0.0002 * (r + 1), (100 + r) << 20, (3 << 30) + (r << 20) if r in cuda else None)
              for i in range(12)] for r in range(4)]
    bye = {"reason": "exit"} if ended else None
    ranks = [_info(0, 0, "gpu-a", bye=bye), _info(1, 0, "gpu-a", bye=bye),
             _info(2, 1, host1, silent_s=30.0, heartbeat={"steps_done": 9}),
             _info(3, 1, host1, bye={"reason": "exception", "error": "RuntimeError: boom"})]
    snap = {"world_size": 4, "ranks": ranks, "steps": steps,
            "summaries": [[] for _ in ranks], "dropped": 0, "restarts": [],
            "lost_after_s": 10.0}
    return run_view(snap, ended=ended)


def live_document(view: RunView, run_id: str, ended: bool = False) -> dict[str, Any]:
    """The live.json content: exactly the documented keys."""
    return {"format": "torchlens-live", "version": 1, "run_id": run_id, "t": time.time(),
            **live_status(view).to_json(), "ended": ended}


def write_live(run_dir: Path, doc: dict[str, Any] | str) -> Path:
    """Replace ``run_dir/live.json`` atomically, as ``torchlens run`` does."""
    path = run_dir / "live.json"
    tmp = run_dir / ".live.json.tmp"
    tmp.write_text(doc if isinstance(doc, str) else json.dumps(doc, default=str))
    os.replace(tmp, path)
    return path



def slow_rank_view(ended: bool = False) -> RunView:
    """Four ranks on one node, all running, rank 1 the straggler
    (tests/ranks/rank_fixtures.py: 30 ms more data loading a step, which the
    others wait for in backward), so the verdict is the slow rank's finding
    naming rank 1. ``ended``: every rank said goodbye."""
    from .rank_fixtures import make_run

    steps, _ = make_run(world=4, steps=30, straggler=1)
    bye = {"reason": "exit"} if ended else None
    ranks = [_info(r, 0, "gpu-a", bye=bye, heartbeat={"steps_done": 30}, steps_sent=30)
             for r in range(4)]
    snap = {"world_size": 4, "ranks": ranks, "steps": steps,
            "summaries": [[] for _ in ranks], "dropped": 0, "restarts": [],
            "lost_after_s": 10.0}
    return run_view(snap, ended=ended)
