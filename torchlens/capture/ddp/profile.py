"""A finished run's records as a ``ddp_check`` Profile.

The launcher's records become the typed ``DdpRun`` payload; the heartbeats,
the one long series, become the ``heartbeats`` table. The fingerprints are
kept once, in the payload (``analysis.ddp.analyze`` builds the collective table).
"""

from __future__ import annotations

from typing import Any

from torchlens.capture.environment import collect_environment
from torchlens.model import DdpRun, Profile, Table
from torchlens.model.payloads import from_json


def build_profile(rec: dict[str, Any], source: str, skipped: list[str]) -> Profile:
    """Records (``DdpLauncher.run``) -> Profile of kind ``ddp_check``."""
    rec = dict(rec)
    heartbeats = [{k: v for k, v in h.items() if k != "last"} for h in rec.pop("heartbeats", [])]
    tables: dict[str, Table] = {}
    if heartbeats:
        tables["heartbeats"] = Table.from_records(heartbeats, text=("phase",))
    run: DdpRun = from_json("ddp_check", rec)
    profiled = run.profiling is not None
    if profiled and not run.strict:
        unmeasured = ["collectives one by one: --profile leaves the per-op recorder off "
                      "(about 11 µs per op); the profiled steps' timelines show them, "
                      "--strict compares every one"]
    else:
        unmeasured = ["collectives are seen by a TorchDispatchMode over c10d ops "
                      "(this torch has no ProcessGroup.register_pre_hook)"]
    if run.backend != "nccl":
        unmeasured.append(
            "CUDA memory: ranks run on CPU (gloo); RSS every step, and allocator figures "
            "modelled from the profiled steps' allocations" if profiled else
            "CUDA memory: ranks run on CPU (gloo); RSS and live tensor bytes are shown instead")
    if skipped:
        unmeasured.append("notebook names the cell uses but that cannot be sent to the "
                          "workers: " + ", ".join(skipped))
    return Profile(kind="ddp_check", title=f"torchlens ddp_check: {source}",
                   environment=collect_environment(), source=source, wall_time_s=run.wall_s,
                   payload=run, tables=tables, unmeasured=unmeasured)
