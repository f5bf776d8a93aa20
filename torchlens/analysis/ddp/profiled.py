"""The checklist lines of a profiled ``%ddp_check --profile`` run: the slow
rank and each rank's memory (with any creep), from its per-rank step records.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from torchlens.analysis.ranks.slow import SlowRank, slow_rank
from torchlens.analysis.ranks.steps import memory_creep, rank_table
from torchlens.model import DdpRun
from torchlens.model.findings import NA, PASSED, WARNING, Finding
from torchlens.model.payloads import RankProfiling
from torchlens.model.rank_report import report_from
from torchlens.model.units import format_bytes, format_percent


def profiled_slow_rank(prof: RankProfiling) -> SlowRank:
    """The slow rank of a profiled run's step records (``result.slow_rank()``)."""
    return slow_rank(prof.steps)


def check_slow_rank(rec: DdpRun) -> Finding | None:
    """The rank the others wait for: ``analysis.ranks.slow.slow_rank``'s verdict,
    sentence and advice, word for word what the live view, ``slow_rank()``
    and the run folder's report say; None when the run was not profiled.
    When a rank raised, the sentence says the steps were those before it."""
    prof = rec.profiling
    if prof is None:
        return None
    verdict = profiled_slow_rank(prof)
    said = verdict.finding
    sentence = said.sentence
    raised = [(res.error.t or float("inf"), r) for r, res in enumerate(map(report_from, rec.ranks))
              if res is not None and res.error is not None]
    if raised and verdict.steps:
        first = min(raised)[1]  # the others usually raise because it went away
        sentence += (f" (judged on the steps before rank {first} raised: see the crashed-worker "
                     "line)")
    if prof.windows:
        sentence += (f" (the function never called torchlens.step(), so the steps are "
                     f"{prof.window_s:g} s windows)")
    details = {k: v for k, v in asdict(verdict).items() if k != "finding"}
    return Finding(said.severity, sentence, said.figures, said.advice, "slow rank", details)


#: below this a pool's fragmentation share says little (a few KiB of a 2 MiB segment)
SMALL_POOL = 64 * 1024 * 1024


def _rank_memory_words(row: dict[str, Any]) -> str:
    if row["allocated"] is None:
        return f"rank {row['rank']}: RSS {format_bytes(row['rss'])} (peak {format_bytes(row['peak_rss'])})"
    text = (f"rank {row['rank']}{' (modelled)' if row['source'] == 'modelled' else ''}: "
            f"allocated {format_bytes(row['allocated'])} (peak {format_bytes(row['peak_allocated'])}), "
            f"reserved {format_bytes(row['reserved'])} (peak {format_bytes(row['peak_reserved'])})")
    if row["frag"] is not None and row["reserved"]:
        # a tiny model's pool is a few MiB: say the bytes; a share of it alarms for nothing
        inactive = row.get("inactive_split") or int(row["frag"] * row["reserved"])
        text += (f", {format_bytes(inactive)} of the {format_bytes(row['reserved'])} pool free "
                 "in split blocks (fragmentation"
                 + (f" {format_percent(100 * row['frag'])})" if row["reserved"] >= SMALL_POOL
                    else ")"))
    if row["largest_free"] is not None:
        text += f", largest free block {format_bytes(row['largest_free'])}"
    return text


def check_rank_memory(rec: DdpRun) -> Finding | None:
    """Each rank's latest and peak memory and fragmentation, and any creep;
    None when the run was not profiled."""
    prof = rec.profiling
    if prof is None:
        return None
    table = rank_table(prof.steps, prof.summaries)
    parts = [_rank_memory_words(row) for row in table if row["source"] is not None]
    if not parts:
        return Finding(NA, "no rank reported its memory", title="rank memory")
    creep = memory_creep(prof.steps, prof.summaries)
    details = {"ranks": table, "creep": [asdict(c) for c in creep]}
    if not creep:
        return Finding(PASSED, "; ".join(parts), title="rank memory", details=details)
    return Finding(WARNING, "; ".join(c.words for c in creep) + ". Latest: " + "; ".join(parts),
                   advice="memory that grows every step after warm-up is something kept across "
                          "steps: a loss or output appended to a list without .item() or "
                          ".detach(), a growing cache, retain_graph=True; %%gpumem on a few steps "
                          "names the allocation sites that stay alive", title="rank memory",
                   details=details)
