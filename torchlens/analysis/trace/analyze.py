"""Everything a ``torchprof`` or ``trace`` report shows, per trace, computed on first use.

The HTML report, the text fallback, the notebook bundle and ``result.ops()``
read the same ``TraceAnalysis``, so they can never disagree, and a display
that shows both HTML and text pays for each table once. Each table is built
on first use (``cached_property``): ``result.kernels()`` does not pay for the
hints.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from torchlens.analysis.scaler import scaler_words, skipped_finding
from torchlens.analysis.trace import headline as summary_mod
from torchlens.analysis.trace import hints as hints_mod
from torchlens.analysis.trace import ops as ops_mod
from torchlens.analysis.trace import steps as steps_mod
from torchlens.analysis.trace.compiled import CompiledCode, compiled_code
from torchlens.model import OpDisplay, Profile, Trace
from torchlens.model.findings import Finding
from torchlens.model.records import ScalerStep

_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class TraceView:
    """Analysis of one of a profile's traces, each table computed on first use."""

    key: str
    trace: Trace
    display: OpDisplay

    @cached_property
    def has_gpu(self) -> bool:
        """Whether the trace has device activity (decides the GPU columns)."""
        ev = self.trace.events
        if len(ev) == 0:
            return False
        return bool(np.isin(ev.text("cat"), _GPU_CATS).any())

    @cached_property
    def ops(self) -> Any:
        return ops_mod.op_table(self.trace, group_by_shapes=self.display.shapes,
                                group_by_source=self.display.stack)

    @cached_property
    def top_ops(self) -> Any:
        """The ``top`` rows of the op table in ``sort`` order (descending; names ascending)."""
        return ops_mod.top_ops(self.ops, self.display.sort, self.display.top)

    @cached_property
    def kernels(self) -> Any:
        return ops_mod.kernel_table(self.trace)

    @cached_property
    def steps(self) -> Any:
        return steps_mod.step_breakdown(self.trace)

    @cached_property
    def not_understood(self) -> list[str]:
        """What the trace holds that no table counts, in plain words: events of
        categories torchlens does not know (another accelerator's device
        activity, say) and events the reader had to drop, by reason."""
        meta = self.trace.meta
        unknown = meta.get("raw_categories") or {}
        out = []
        if unknown:
            listed = ", ".join(f"{cat!r} ({n:,})" for cat, n in
                               sorted(unknown.items(), key=lambda kv: -kv[1]))
            out.append(f"{sum(unknown.values()):,} events of categories torchlens does not "
                       f"know: {listed}. They are drawn on the timeline but counted in no "
                       "table: not as device time (only CUDA/ROCm kernels, memcpy and memset "
                       "are), so the CPU share shown is too high if they are device work.")
        dropped = meta.get("dropped") or {}
        if dropped:
            out.append(f"{sum(dropped.values()):,} events could not be read and were left "
                       "out: " + ", ".join(f"{why} ({n:,})" for why, n in dropped.items()) + ".")
        return out

    @cached_property
    def hints(self) -> list[Any]:
        return list(hints_mod.find_hints(self.trace, self.ops, self.steps))


@dataclass
class TraceAnalysis:
    """A profile's headline figures and one ``TraceView`` per trace, in its order."""

    summary: summary_mod.Summary
    views: list[TraceView]
    display: OpDisplay
    #: compiled regions, graph breaks and recompiles (None: no compiled code)
    compiled: CompiledCode | None = None
    #: ``torch.amp.GradScaler``'s optimizer steps in the cell (None: no scaler stepped)
    scaler: ScalerStep | None = None

    @property
    def scaler_findings(self) -> list[Finding]:
        """The cell's skipped optimizer steps (``analysis.scaler``), if any."""
        s = self.scaler
        found = s and skipped_finding(s.total_skipped, s.total_steps, s,
                                      steps_words=f"the cell's {s.total_steps:,}")
        return [found] if found else []

    @property
    def scaler_words(self) -> str:
        """What the scaler did in the cell, in one line ("" when none stepped)."""
        return scaler_words(self.scaler) if self.scaler is not None else ""


def analyze(profile: Profile) -> TraceAnalysis:
    """The analysis of a ``torchprof`` or ``trace`` profile (tables built lazily)."""
    display = profile.payload.display  # type: ignore[union-attr]
    views = [TraceView(k, t, display) for k, t in profile.traces.items()]
    log = getattr(profile.payload, "compiled", None)
    compiled = compiled_code(log, views[0].trace if views else None, profile.wall_time_s,
                             getattr(profile.payload, "cells", None))
    return TraceAnalysis(summary_mod.summarize(profile), views, display, compiled,
                         getattr(profile.payload, "scaler", None))
