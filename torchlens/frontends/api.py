"""The Python API: the same captures as the magics, for scripts and torchrun jobs.

``with torchlens.torchprof(top=15) as result:`` profiles the block; afterwards
``result`` shows itself in Jupyter (same display bundle as ``%%torchprof``) and
offers the tables as pandas DataFrames.
"""

from __future__ import annotations

from typing import Any

from ..capture.profiler import ProfilerCapture, ProfilerOptions
from ..model import InputError, Profile

#: User-facing sort keys -> op table columns.
SORT_KEYS = {
    "total_cpu": "total_cpu_us",
    "self_cpu": "self_cpu_us",
    "device": "device_us",
    "calls": "calls",
    "kernels": "kernels",
    "flops": "flops",
    "name": "name",
}


def display_options(
    top: int = 20, sort: str = "total_cpu", shapes: bool = False,
    stack: bool = False, flops: bool = False, memory: bool = False,
) -> dict[str, Any]:
    """Validated options that decide what the render shows (stored in the Profile)."""
    if not isinstance(top, int) or top < 1:
        raise InputError(f"top must be a whole number >= 1, got {top!r}")
    if sort not in SORT_KEYS:
        raise InputError(f"unknown sort key {sort!r}; use one of {', '.join(SORT_KEYS)}")
    return {"top": top, "sort": SORT_KEYS[sort], "shapes": shapes, "stack": stack,
            "flops": flops, "memory": memory}


class Result:
    """A finished (or still running) capture: the Profile plus convenient views."""

    def __init__(self, profile: Profile | None = None) -> None:
        self._profile = profile

    @property
    def profile(self) -> Profile:
        if self._profile is None:
            raise RuntimeError("the capture is still running; use the result after it")
        return self._profile

    def ops(self) -> Any:
        """Per-op table (pandas DataFrame), grouped by input shapes with --shapes."""
        from ..analysis.ops import op_table

        trace = self._require_trace()
        return op_table(trace, group_by_shapes=bool(self.profile.options.get("shapes")))

    def kernels(self) -> Any:
        """Per-kernel table (empty without a GPU)."""
        from ..analysis.ops import kernel_table

        return kernel_table(self._require_trace())

    def steps(self) -> Any:
        """Per-ProfilerStep breakdown (TensorBoard profiler plugin definitions)."""
        from ..analysis.steps import step_breakdown

        return step_breakdown(self._require_trace())

    def hints(self) -> list[Any]:
        """Known problems the trace shows, each with its supporting figure."""
        from ..analysis.hints import find_hints

        trace = self._require_trace()
        return find_hints(trace, self.ops(), self.steps())

    def save(self, path: str) -> str:
        return self.profile.save(path)

    def export(self, path: str) -> str:
        """Write a .json/.json.gz trace, .html report or .tlprof result."""
        from .export import export_profile

        return export_profile(self.profile, path)

    def _require_trace(self) -> Any:
        trace = self.profile.trace
        if trace is None:
            raise InputError(
                "this result has no trace: " + "; ".join(self.profile.unmeasured)
            )
        return trace

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        from ..render.bundle import display_bundle

        return display_bundle(self.profile)

    def __repr__(self) -> str:
        if self._profile is None:
            return "<torchlens Result: capture running>"
        from ..render.text import summary_line

        return summary_line(self._profile)


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
        from .export import check_export_path

        self._display = display_options(top, sort, shapes, stack, flops, memory)
        self._capture = ProfilerCapture(
            ProfilerOptions(record_shapes=shapes, with_stack=stack,
                            profile_memory=memory, with_flops=flops,
                            schedule=tuple(schedule) if schedule else None),
            title=title,
        )
        if export:
            check_export_path(export)
        self._export = export
        self.result = Result()

    def __enter__(self) -> Result:
        self._capture.__enter__()
        return self.result

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._capture.__exit__(exc_type, exc, tb)
        profile = self._capture.profile
        assert profile is not None
        profile.options.update(self._display)
        self.result._profile = profile
        if self._export:
            self.result.export(self._export)
        return False
