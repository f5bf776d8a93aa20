"""``run.diff(other)`` and ``torchlens diff A B``: run B against run A as one result.

Each run is read as ``load_run`` reads it (a run folder, one trace file,
plain or gzip, or a list of files); the diff itself is
``analysis.runs.diff.diff_runs`` over the two runs' per-trace totals and,
for run folders, their step records (``recorded_steps``): every step's
time, where the traces hold only the few profiled steps.
The result is a ``diff`` Profile: displayed, its report; saved, a ``.tlprof``
like any result. ``to_json()`` is what ``torchlens diff A B --json`` prints
(schema: ``DIFF_JSON_SCHEMA``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from torchlens.analysis.runs import diff as diffs
from torchlens.analysis.runs.rows import missing_as_nan
from torchlens.formats.run_folder.manifest import ManifestError, read_manifest
from torchlens.formats.run_folder.records import iter_steps
from torchlens.formats.run_folder.sources import Problem
from torchlens.frontends.result import Result
from torchlens.model import InputError, Profile
from torchlens.model.payloads import DiffPayload, RunDiff

DIFF_SCHEMA_VERSION = 1
_ROW = ("kind, name, status (added|removed|slower|faster|small|same), a_us, b_us (mean µs per "
        "step and rank; per trace for traces without ProfilerStep#N spans), delta_us = "
        "b - a, delta_pct (null when a_us is 0), a_calls, b_calls (per step and rank); "
        "largest |delta_us| first")
#: The ``torchlens diff --json`` document, key by key.
DIFF_JSON_SCHEMA = {
    "schema": "torchlens-diff, integer version",
    "a": "run A: {root, ranks, problems [{kind, path, message}]}",
    "b": "run B: the same",
    "per": "step | trace: whether the figures are per step, or (some trace has no "
           "ProfilerStep#N spans) per trace",
    "units": "{a, b}: the steps (a trace without steps counts 1) each run's totals are "
             "divided by",
    "thresholds": "{same_pct, same_us}: a change within same_pct % of a_us is status "
                  "same; one beyond it but within same_us µs per step is small; "
                  "slower and faster exceed both",
    "step_time": "{source, a_median_us, b_median_us, a_steps, b_steps, delta_us, "
                 "regression_pct}: median step time over every step of every rank; "
                 "source: 'step records' (both runs are run folders with step records: "
                 "every recorded step, steps.jsonl) or 'profiled steps' (the traces' "
                 "ProfilerStep#N spans); a_steps, b_steps: the steps counted; "
                 "regression_pct = 100 * (b - a) / a, null when a run has no steps; "
                 "a_spread_us, b_spread_us: each run's step-to-step spread (1.4826 x the "
                 "median absolute deviation of a rank's step times, median over the "
                 "ranks); noise_us = a_spread_us + b_spread_us, the run-to-run noise "
                 "bound; within_noise: |delta_us| <= noise_us (the verdict then names no "
                 "change); all null with fewer than 8 steps a rank",
    "rank_steps": "per rank pair (rank_a, rank_b), from step_time's source: a_median_us, "
                  "b_median_us, delta_us, delta_pct, noise_us and within_noise (that "
                  "rank's own spreads, as step_time's)",
    "summary": "how many ops and kernels have each status (added, removed, slower, "
               "faster, small, same)",
    "ops": f"host ops and annotations (kind cpu_op, user_annotation): {_ROW}",
    "kernels": f"GPU work (kind kernel, gpu_memcpy, gpu_memset): {_ROW}",
    "notes": "plain sentences: ranks that differ, traces without steps or totals",
    "headline": "the rank and phase that changed (both runs with step records, else "
                "null): {rank (null: every rank), ranks, phase (data, forward, backward, "
                "optimizer, collective, other), before_us, after_us, delta_us (the "
                "phase's median a step in A and B; every rank: the median over the "
                "ranks), waiting_phase, waiting_delta_us (where the other ranks wait "
                "for it, null when none grew), sentence}",
    "verdict_code": "the verdict's kind (a finding's code): run_diff",
    "verdict": "one sentence: step time A -> B (median of how many recorded or profiled "
               "steps), the headline's sentence, and, when B is faster, the largest "
               "speedup, else the largest slowdown; a step time change within "
               "noise_us says \"within run-to-run noise (±X ms ...)\" and \"no change "
               "beyond noise\", naming only ops and kernels added or removed",
}


def recorded_steps(run: Any) -> diffs.RecordedSteps | None:
    """A run folder's step records (``torchlens run``, ``%ddp_check --profile``):
    per rank it analysed, the µs of each ``torchlens.step()`` (windows of code
    that never calls it are not steps); None for traces alone."""
    return recorded(run)[0]


def recorded(run: Any) -> tuple[diffs.RecordedSteps | None, diffs.RecordedPhases | None]:
    """``recorded_steps`` and, from the same records, each step's phases per
    rank (``analysis.runs.diff.add_phases``); (None, None) for traces alone."""
    root = run.sources.root
    if not root or not os.path.isdir(root):
        return None, None
    try:
        manifest = read_manifest(root)
    except ManifestError:  # a folder of traces alone
        return None, None
    out: diffs.RecordedSteps = {}
    phases: diffs.RecordedPhases = {}
    for entry in manifest.ranks:
        if entry.rank in run.figures:
            us = []
            for r in iter_steps(root, entry.rank):
                if not r.window:
                    us.append((r.t1 - r.t0) * 1e6)
                    diffs.add_phases(phases, entry.rank, r)
            if us:
                out[entry.rank] = us
    return out or None, phases or None


def _label(run: Any) -> str:
    """The run's folder, or its file when it is one trace."""
    paths = [p for r in run.sources.ranks for p in r.paths]
    return str(paths[0]) if len(paths) == 1 else str(run.sources.root)


class DiffSide(msgspec.Struct):
    """One run of a diff as ``--json`` names it: its root, and where the run was
    loaded here (not read back from a saved diff), its ranks and problems."""

    root: str
    ranks: list[int] | UnsetType = UNSET
    problems: list[Problem] | UnsetType = UNSET


def _side(run: Any) -> DiffSide:
    return DiffSide(_label(run), run.ranks, list(run.problems))


class DiffResult(Result):
    """Run B against run A: ``ops()``, ``kernels()``, ``steps()`` as DataFrames,
    ``verdict``, ``regressed(pct)``, ``to_json()``; displayed, the diff report."""

    def __init__(self, profile: Profile, a: DiffSide | None = None,
                 b: DiffSide | None = None) -> None:
        super().__init__(profile)
        self.a = a or DiffSide(profile.payload.a)  # type: ignore[union-attr]
        self.b = b or DiffSide(profile.payload.b)  # type: ignore[union-attr]

    @classmethod
    def of(cls, a: Any, b: Any, **thresholds: float) -> DiffResult:
        """The diff of two ``RunResult``s (``thresholds``: ``same_pct``, ``same_us``)."""
        for label, run in (("A", a), ("B", b)):
            if not run.ranks:
                why = "; ".join(f"{p.kind}: {p.path}: {p.message}" for p in run.problems[:3])
                raise InputError(f"{label} ({run.sources.root or 'no input'}): no usable "
                                 f"trace ({why or 'nothing found'})")
        (steps_a, phases_a), (steps_b, phases_b) = recorded(a), recorded(b)
        unread = tuple([p.message for p in run.problems if p.kind == "unreadable"]
                       for run in (a, b))
        d = diffs.diff_runs(a.figures, b.figures, recorded=(steps_a, steps_b),
                            phases=(phases_a, phases_b), unread=unread,  # type: ignore[arg-type]
                            **thresholds)
        la, lb = _label(a), _label(b)
        payload = DiffPayload(a=la, b=lb, diff=d)
        profile = Profile(kind="diff", title=f"torchlens diff: {Path(la).name} -> "
                          f"{Path(lb).name}", source=lb, payload=payload)
        return cls(profile, _side(a), _side(b))

    @property
    def diff(self) -> RunDiff:
        """The diff (``model.payloads.RunDiff``): its rows, step times, notes and verdict."""
        return self.analysis()  # type: ignore[no-any-return]

    @property
    def verdict(self) -> str:
        """One sentence: step time A -> B and its largest change (a speedup when
        B is faster, else a slowdown); ``diff.verdict`` is the ``Finding``."""
        return str(self.diff.verdict)

    def regressed(self, pct: float) -> bool | None:
        """Whether B's median step time is more than ``pct`` % above A's and
        beyond the run-to-run noise (``None`` when a run has no step time: no
        step records shared by both runs and no ProfilerStep#N spans)."""
        return diffs.regressed(self.diff, pct)

    def _frame(self, rows: list[Any]) -> Any:
        return missing_as_nan(msgspec.to_builtins(rows))

    def ops(self) -> Any:  # type: ignore[override]
        """Per host op and annotation: µs and calls per step in A and B, delta, status."""
        return self._frame(self.diff.ops)

    def kernels(self) -> Any:  # type: ignore[override]
        """Per kernel, memcpy and memset name: µs and calls per step in A and B, status."""
        return self._frame(self.diff.kernels)

    def steps(self) -> Any:  # type: ignore[override]
        """Per rank pair: the median step time in A and B (from the step records
        when both runs have them, else the profiled steps) and the change."""
        return self._frame(self.diff.rank_steps)

    def to_json(self) -> dict[str, Any]:
        """The ``torchlens diff --json`` document (``DIFF_JSON_SCHEMA``)."""
        return {"schema": DIFF_SCHEMA_VERSION, "a": msgspec.to_builtins(self.a),
                "b": msgspec.to_builtins(self.b), **msgspec.to_builtins(self.diff),
                "verdict": self.verdict, "verdict_code": self.diff.verdict.code}
