"""Synthetic ``%ddp_check --profile`` records (docs/RANK_PROFILE.md) for view tests.

Every rank's step takes the same wall time (DDP's all_reduce synchronises
them), but the straggler spends ``slow_s`` more in ``data`` and the others
wait that long in ``backward``, where DDP's bucket all_reduces wait; the
straggler enters every collective ``slow_s`` late.
"""

from __future__ import annotations

from typing import Any

from torchlens.model.records import StepMemory, StepRecord

T_START = 1_790_857_000.0
MIB = 1 << 20


def make_run(world: int = 4, steps: int = 40, every: int = 5, straggler: int = 2,
             slow_s: float = 0.03, cuda: bool = False, op_name: str = "aten::addmm",
             ops_per_step: int = 30, collectives: int = 3,
             ) -> tuple[list[list[StepRecord]], list[list[dict[str, Any]]]]:
    """(step records per rank, profiled-step summaries per rank)."""
    records: list[list[StepRecord]] = [[] for _ in range(world)]
    summaries: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    t1 = T_START
    for i in range(steps):
        # the same wall time on every rank, a little different each step
        step_s = 0.08 + slow_s + 0.004 * ((i * 7) % 5)
        t0, t1 = t1, t1 + step_s
        profiled = i % every == every - 1
        for r in range(world):
            slow = r == straggler
            phases = {"data": 0.01 + (slow_s if slow else 0.0), "forward": 0.012,
                      "backward": 0.02 + (0.0 if slow else slow_s), "optimizer": 0.002,
                      "collective": 0.0}
            if cuda:
                mem = {"rss": None, "allocated": (100 + 10 * r) * MIB + i * 4096,
                       "reserved": (160 + 10 * r) * MIB, "inactive_split": (8 + r) * MIB,
                       "largest_free": None, "source": "cuda"}
            else:
                mem = {"rss": (400 + r) * MIB + i * 8192, "allocated": None, "reserved": None,
                       "inactive_split": None, "largest_free": None, "source": "rss"}
            records[r].append(StepRecord(step=i, t0=t0, t1=t1, phases=phases,
                                         profiled=profiled, window=False,
                                         mem=StepMemory(**mem)))
            if profiled:
                summaries[r].append(_summary(r, i, t0, t1, slow, slow_s, mem, op_name,
                                             ops_per_step, collectives))
    return records, summaries


def _summary(rank: int, step: int, t0: float, t1: float, slow: bool, slow_s: float,
             mem: dict[str, Any], op_name: str, n_ops: int, n_coll: int) -> dict[str, Any]:
    span = t1 - t0
    ops = []
    for k in range(n_ops):
        start = t0 + span * k / n_ops
        ops.append({"name": op_name if k % 2 else f"aten::op{k}", "t0": start,
                    "dur": span / n_ops * (0.9 if k % 3 else 0.4), "lane": k % 2,
                    "depth": k % 3, "kind": "op"})
    colls = [{"name": "allreduce", "t0": t0 + 0.05 + 0.005 * s + (slow_s if slow else 0.0),
              "dur": 0.004 + (0.0 if slow else slow_s), "lane": 1, "seq": s, "bytes": 4096}
             for s in range(n_coll)]
    if mem["source"] == "cuda":  # the allocator's counters at the step's end
        memory = {**mem, "largest_free": (6 - rank) * MIB, "peak_allocated": mem["allocated"]}
    else:
        memory = {"allocated": (50 + rank) * MIB, "reserved": (80 + rank) * MIB,
                  "inactive_split": (4 + rank) * MIB, "largest_free": (20 - rank) * MIB,
                  "peak_allocated": (70 + rank) * MIB, "source": "modelled"}
    return {"rank": rank, "step": step, "trace": f"rank{rank}/step{step:05d}.pt.trace.json",
            "t0": t0, "t1": t1, "step_ms": span * 1e3, "breakdown": {}, "events": 1000,
            "dropped": 0, "lanes": [f"cpu {1000 + rank}", f"cpu {2000 + rank} autograd"],
            "ops": ops, "collectives": colls, "top_ops": [], "memory": memory, "bytes": 9000}
