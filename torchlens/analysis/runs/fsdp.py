"""FSDP memory per rank in a ``torchlens run`` report, from the step records'
``fsdp`` figures (``model.records.FsdpStep``, measured in each rank by
``capture.ranks.fsdp_memory``), worded as ``%ddp_check``'s memory line
(``analysis.ddp.fsdp.rank_text``).

Per rank: the most gathered parameters alive at once over every step, with
the step and the FSDP modules that made it (the run's peak is its highest
step's); the shard bytes and the optimizer state of its last step that says
them (the state grows only while parameters gain state). The allocator's
peak is not read under ``torchlens run`` (resetting it each step would
change what the job's own ``torch.cuda.max_memory_allocated`` returns), and
the view says so rather than leaving it out.
"""

from __future__ import annotations

import msgspec

from torchlens.analysis.ddp.fsdp import (
    ALIVE,
    FsdpRank,
    by_text,
    module_names,
    rank_row,
    rank_text,
)
from torchlens.analysis.runs.rows import FsdpRow
from torchlens.model.records import FsdpStep, StepRecord
from torchlens.model.run_figures import FsdpFigures

#: why there is no allocator peak, after "allocator peak not measured"
ON_CPU = "on CPU"
ON_GPU = "(torchlens run leaves the job's CUDA peak statistics alone)"
#: the figures a later step's record replaces
_LAST = ("sharded_bytes", "unsharded_bytes", "optimizer_state_bytes", "optimizers",
         "gathered_error", "optimizer_state_error")


class FsdpSteps:
    """The FSDP figures of a run folder's step records, fed one record at a time
    (``add``: a long run has millions); ``figures()`` per rank, JSON-able."""

    def __init__(self) -> None:
        self._ranks: dict[int, FsdpFigures] = {}

    def add(self, rank: int, rec: StepRecord) -> None:
        got = rec.fsdp
        if not isinstance(got, FsdpStep):
            return
        f = self._ranks.setdefault(rank, FsdpFigures())
        if (got.gathered_peak_bytes or 0) > (f.gathered_peak_bytes or 0):
            f.gathered_peak_bytes = got.gathered_peak_bytes
            f.gathered_peak_modules = list(got.gathered_peak_modules)
            f.gathered_peak_step = rec.step
        for key in _LAST:
            value = getattr(got, key)
            if value not in (None, []):
                setattr(f, key, value)
        if rec.mem is not None and rec.mem.source == "cuda":
            f.cuda = True

    def figures(self) -> dict[str, FsdpFigures]:
        return {str(r): f for r, f in sorted(self._ranks.items())}


def fsdp_rows(figures: dict[str, FsdpFigures]) -> list[FsdpRow]:
    """One row per FSDP rank: the ``%ddp_check`` ranks table's FSDP cells
    (``rank_row``), the gathered bytes of all its parameters, the modules and
    step of its gathered peak, and the figures in words (``text``)."""
    rows = []
    for r, got in sorted(figures.items(), key=lambda kv: int(kv[0])):
        # the %ddp_check memory line's words read the figures as its JSON does
        f = msgspec.convert(msgspec.to_builtins(got), FsdpRank)
        if f.gathered_peak_bytes:
            f.gathered_how = ALIVE
        f.allocator_unmeasured = ON_GPU if got.cuda else ON_CPU
        mods = module_names(f.gathered_peak_modules)
        rows.append(FsdpRow(rank=int(r), **rank_row(f), fsdp_unsharded=f.unsharded_bytes,
                            gathered_modules=" + ".join(mods) or None,
                            gathered_step=got.gathered_peak_step, text=rank_text(f)))
    return rows


def fsdp_lines(rows: list[FsdpRow]) -> list[str]:
    """``rank R: FSDP: ...`` per FSDP rank, one line for ranks that read alike
    (``ranks 0-7: FSDP: ...``): the text view, ``torchlens report``."""
    return [f"{ranks}: FSDP: {text}"
            for ranks, text in by_text({row.rank: row.text for row in rows})]
