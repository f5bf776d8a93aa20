"""The Python API: the same captures as the magics, for scripts and torchrun jobs.

``with torchlens.torchprof(top=15) as result:`` profiles the block; afterwards
``result`` shows itself in Jupyter (same display bundle as ``%%torchprof``) and
offers the tables as pandas DataFrames.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchlens.analysis.trace.ops import sort_column
from torchlens.capture.trace.profiler import ProfilerCapture, ProfilerOptions
from torchlens.frontends.result import Result, finish
from torchlens.frontends.shared import preload
from torchlens.frontends.shared.cells import cell_names
from torchlens.model import InputError, OpDisplay


def torchprof_display(top: int = 20, sort: str = "total_cpu", shapes: bool = False,
                      stack: bool = False, flops: bool = False) -> OpDisplay:
    """What the op table shows, validated (InputError names the bad option)."""
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise InputError(f"top must be a whole number >= 1, got {top!r}")
    return OpDisplay(top=top, sort=sort_column(sort), shapes=shapes, stack=stack, flops=flops)


class torchprof:  # noqa: N801 - reads as a function in `with torchlens.torchprof():`
    """Profile a block: ``with torchlens.torchprof(shapes=True) as result: ...``.

    Options mirror ``%%torchprof``: ``top``, ``sort``, ``shapes``, ``stack``,
    ``memory``, ``flops``, ``schedule=(wait, warmup, active)``, ``export``.
    Mark the end of each step with ``torchlens.step()``.
    """

    def __init__(
        self, *, top: int = 20, sort: str = "total_cpu", shapes: bool = False,
        stack: bool = False, memory: bool = False, flops: bool = False,
        schedule: tuple[int, int, int] | None = None, export: str | None = None,
        title: str = "",
    ) -> None:
        from torchlens.frontends.export import check_export_path

        self._display = torchprof_display(top, sort, shapes, stack, flops)
        self._capture = ProfilerCapture(
            ProfilerOptions(record_shapes=shapes, with_stack=stack,
                            profile_memory=memory, with_flops=flops,
                            schedule=tuple(schedule) if schedule else None),
            title=title,
        )
        if export:
            check_export_path(export, "torchprof")
        self._export = export
        self.result = Result()

    def __enter__(self) -> Result:
        preload.wait()  # no import thread may run while the block is profiled
        self._capture.__enter__()
        return self.result

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._capture.__exit__(exc_type, exc, tb)
        profile = self._capture.profile
        profile.payload = dataclasses.replace(profile.payload, display=self._display,
                                              cells=cell_names())
        finish(self.result, profile, self._export)
        return False
