"""What every capture and loaded file hands back: a ``Result`` holds the Profile,
makes its analysis once (``kinds.analyze``) and gives every view (repr, the
notebook bundle, tables, ``export``) that one analysis. Each domain's result
(``MemoryResult``, ``DdpResult``, ``RunResult`` ...) is a subclass.
"""

from __future__ import annotations

from typing import Any

from torchlens.frontends import kinds
from torchlens.model import InputError, Profile


class Result:
    """A finished (or still running) capture: the Profile, its analysis (made
    once, on first use) and convenient views of it."""

    def __init__(self, profile: Profile | None = None) -> None:
        self._profile = profile
        self._analysis: Any = None

    @property
    def profile(self) -> Profile:
        if self._profile is None:
            raise RuntimeError("the capture is still running; use the result after it")
        return self._profile

    def analysis(self) -> Any:
        """The kind's analysis of the profile (``frontends.kinds``), made once."""
        if self._analysis is None:
            self._analysis = kinds.analyze(self.profile)
        return self._analysis

    def ops(self) -> Any:
        """Per-op table (pandas DataFrame), grouped by input shapes with --shapes
        and by the line of your code that issued the op with --stack."""
        return self._trace_view().ops

    def kernels(self) -> Any:
        """Per-kernel table (empty without a GPU)."""
        return self._trace_view().kernels

    def steps(self) -> Any:
        """Per-ProfilerStep breakdown (TensorBoard profiler plugin definitions)."""
        return self._trace_view().steps

    def hints(self) -> list[Any]:
        """Known problems the trace shows, each with its supporting figure."""
        return self._trace_view().hints

    def compiled(self) -> Any:
        """What ``torch.compile`` did in the cell (``analysis.trace.compiled.CompiledCode``:
        ``.regions``, ``.breaks``, ``.recompiles``, ``.findings``, compile time),
        or None when the cell neither compiled nor ran compiled code."""
        return getattr(self.analysis(), "compiled", None)

    def scaler(self) -> Any:
        """``torch.amp.GradScaler``'s optimizer steps in the cell
        (``model.records.ScalerStep``: ``.total_steps``, ``.total_skipped``,
        ``.first_scale``, ``.scale``), or None when no scaler stepped."""
        return getattr(self.analysis(), "scaler", None)

    def save(self, path: str) -> str:
        return self.profile.save(path)

    def export(self, path: str) -> str:
        """Write the formats of ``kinds.export_suffixes``: .html report, .tlprof
        result, and the kind's own (.json/.json.gz trace, .pickle snapshot)."""
        from torchlens.frontends.export import export_profile

        return export_profile(self.profile, path, self.analysis())

    def _trace_view(self) -> Any:
        views = getattr(self.analysis(), "views", None)
        if not views:
            why = "; ".join(self.profile.unmeasured) or f"a {self.profile.kind} result holds none"
            raise InputError(f"this result has no trace: {why}")
        return views[0]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        return kinds.display_bundle(self.profile, self.analysis())

    def __repr__(self) -> str:
        if self._profile is None:
            return f"<torchlens {type(self).__name__}: capture running>"
        return kinds.summary(self._profile, self.analysis())


def finish(result: Result, profile: Profile | None, export: str | None) -> None:
    """Hand a finished capture to its result, then write ``--export``."""
    assert profile is not None
    result._profile = profile
    if export:
        result.export(export)
