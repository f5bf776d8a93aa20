"""A finished run's records as a ``ddp_check`` Profile.

The launcher's records become the typed ``DdpRun`` payload; the heartbeats,
the one long series, become the ``heartbeats`` table. The fingerprints are
kept once, in the payload (``analysis.ddp.analyze`` builds the collective table).
"""

from __future__ import annotations

from torchlens.capture.ddp.launcher import CheckRecords
from torchlens.capture.environment import collect_environment
from torchlens.model import Profile, Table


def build_profile(rec: CheckRecords, source: str, skipped: list[str]) -> Profile:
    """Records (``DdpLauncher.run``) -> Profile of kind ``ddp_check``."""
    tables: dict[str, Table] = {}
    if rec.heartbeats:  # the table's rows: each heartbeat without the collective it is in
        tables["heartbeats"] = Table.from_records([hb.row() for hb in rec.heartbeats],
                                                  text=("phase",))
    run = rec.run
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
