"""What the renderers show of one trace, computed once and shared.

The HTML report, the text fallback and the notebook bundle all show the same
op table and summary; computing the analysis once (lazily, per piece) keeps a
display bundle from paying for it twice, and keeps the text and HTML views
from ever disagreeing.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..analysis import hints as hints_mod
from ..analysis import ops as ops_mod
from ..analysis import steps as steps_mod
from ..model import Profile, Trace

_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class TraceView:
    """Analysis of one of a profile's traces, each table computed on first use."""

    key: str
    trace: Trace
    options: dict[str, Any]

    @cached_property
    def has_gpu(self) -> bool:
        """Whether the trace has device activity (decides the GPU columns)."""
        ev = self.trace.events
        if len(ev) == 0:
            return False
        return bool(np.isin(ev.text("cat"), _GPU_CATS).any())

    @cached_property
    def ops(self) -> Any:
        shown = display_options(self.options)
        return ops_mod.op_table(self.trace, group_by_shapes=bool(shown["shapes"]),
                                group_by_source=bool(shown["stack"]))

    @cached_property
    def kernels(self) -> Any:
        return ops_mod.kernel_table(self.trace)

    @cached_property
    def steps(self) -> Any:
        return steps_mod.step_breakdown(self.trace)

    @cached_property
    def hints(self) -> list[Any]:
        return list(hints_mod.find_hints(self.trace, self.ops, self.steps))


def trace_views(profile: Profile) -> list[TraceView]:
    """One view per trace, in the profile's order (``main`` or ``rank0``...).

    The same views are returned while the profile's traces and options are
    unchanged, so the HTML report and the text fallback of one display share
    each analysis (computed on first use) instead of redoing it.
    """
    key = id(profile)
    state = (list(profile.traces.items()), dict(profile.options))
    hit = _VIEWS.get(key)
    if hit is not None and hit[0]() is profile and _same(hit[1], state):
        return hit[2]
    views = [TraceView(k, t, dict(state[1])) for k, t in state[0]]
    weakref.finalize(profile, _VIEWS.pop, key, None)
    _VIEWS[key] = (weakref.ref(profile), state, views)
    return views


def _same(a: tuple[list, dict], b: tuple[list, dict]) -> bool:
    return (len(a[0]) == len(b[0])
            and all(k == j and t is u for (k, t), (j, u) in zip(a[0], b[0], strict=True))
            and a[1] == b[1])


#: id(profile) -> (weak reference to it, its traces and options, the views)
_VIEWS: dict[int, tuple[weakref.ref, tuple[list, dict], list[TraceView]]] = {}


def display_options(options: dict[str, Any]) -> dict[str, Any]:
    """The render options, accepting the capture's profiler option names too.

    The magic stores ``--top/--sort/--shapes/--flops/--stack``; a capture made
    from Python stores torch's ``record_shapes/with_flops/with_stack``. A
    column the user asked to record is a column they want to see.
    """
    return {
        "top": options.get("top"),
        "sort": options.get("sort"),
        "shapes": bool(options.get("shapes", options.get("record_shapes"))),
        "flops": bool(options.get("flops", options.get("with_flops"))),
        "stack": bool(options.get("stack", options.get("with_stack"))),
    }
