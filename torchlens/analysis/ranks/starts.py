"""Step numbers counted across the job's starts, for the panels drawn by step.

An elastic restart starts its workers' step count at 0 again. The live step
and memory panels (``render.ranks.view``) are drawn by step, so
``torchlens.watch`` places start k after every step of the starts before it:
one offset per start, shared by every rank so that their steps still line
up, and one mark per restart at its first step. Without this, a restarted
rank's line would run back to step 0 over its first start's points.

Step records say their start (``restart``: the collector's live feed and the
run folder's ``steps.jsonl`` add it; absent means the first). A summary from
the live feed says it too; one from a finished folder's ``summaries.jsonl``
does not, and takes the latest start of its rank that had begun by its
``t0``.
"""

from __future__ import annotations

from torchlens.model.records import StepRecord, StepSummary


class StepStarts:
    """The offsets of the starts seen so far; feed it batches in arrival order."""

    def __init__(self) -> None:
        #: start -> the step number its step 0 is drawn at
        self.offsets: dict[int, int] = {0: 0}
        self._end = 0  # one past the largest step placed
        #: rank -> [(t0 of its first step in a start, that start)], in order
        self._begun: dict[int, list[tuple[float, int]]] = {}
        self._marks: list[tuple[int, int]] = []

    def _offset(self, k: int) -> int:
        if k not in self.offsets:
            self.offsets[k] = self._end
            self._marks.append((k, self._end))
        return self.offsets[k]

    def marks(self) -> list[tuple[int, int]]:
        """Every restart placed so far: (restart number, the step its first
        step is drawn at)."""
        return sorted((k, step) for k, step in self.offsets.items() if k)

    def take_marks(self) -> list[tuple[int, int]]:
        """The restarts placed since the last call: (restart number, the step
        its first step is drawn at)."""
        marks, self._marks = self._marks, []
        return marks

    def place_steps(self, batches: dict[int, list[StepRecord]]
                    ) -> dict[int, list[StepRecord]]:
        """``batches``: rank -> its new step records; returns them with ``step``
        counted across starts (``take_marks``: the restarts that began).

        A batch is taken one start at a time over all ranks, lowest first, so
        a rank that did one step more before a restart is never drawn over by
        another rank's first steps after it."""
        out: dict[int, list[StepRecord]] = {r: [] for r in batches}
        for k in sorted({rec.start for recs in batches.values() for rec in recs}):
            offset = self._offset(k)
            for r, recs in batches.items():
                begun = self._begun.setdefault(r, [])
                for rec in recs:
                    if rec.start != k:
                        continue
                    step = offset + rec.step
                    self._end = max(self._end, step + 1)
                    if not begun or begun[-1][1] < k:
                        begun.append((rec.t0, k))
                    out[r].append(rec.replace(step=step) if offset else rec)
        return out

    def place_summary(self, rank: int, summary: StepSummary) -> StepSummary:
        """``summary`` with its ``step`` counted across starts (module docstring)."""
        k = summary.start
        if not isinstance(summary.restart, int):
            for begun_t0, start in self._begun.get(rank, []):
                if begun_t0 <= summary.t0:
                    k = start
        # the live feed's summary can come before its start's first step batch
        offset = self._offset(k)
        return summary.replace(step=offset + summary.step) if offset else summary
