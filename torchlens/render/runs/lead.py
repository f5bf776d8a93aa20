"""The lines that lead every text view of a run (``repr`` of ``torchlens.load(RUN)``
and ``torchlens analyze RUN``): what was analysed, then the verdict and the ranks,
as ``torchlens run``'s terminal says them (``verdict: ...``, ``ranks: ...``).
Draws the analysis' findings; decides nothing."""

from __future__ import annotations

from dataclasses import replace

from torchlens.analysis.runs.analyze import RunAnalysis
from torchlens.model.findings import NO_TRACES
from torchlens.model.units import plural
from torchlens.render.findings import finding_text


def counted_line(a: RunAnalysis) -> str:
    """``run: 2 ranks of 2 analysed`` (and the input problems, when there are)."""
    of = f" of {a.world_size}" if a.world_size else ""
    bad = f", {plural(len(a.problems), 'input problem')}" if a.problems else ""
    if not a.ranks and any(f.code == NO_TRACES for f in a.findings):
        return f"run: step records of {plural(a.world_size or 0, 'rank')}, no traces{bad}"
    return f"run: {plural(len(a.ranks), 'rank')}{of} analysed{bad}"


def lead_lines(a: RunAnalysis, slow_rank: int | None = None, judged: bool = False,
               states: dict[int, str] | None = None) -> list[str]:
    """The header, then the verdict (the analysis' first finding, whole) and
    the ranks line: how many ranks, the slow rank when the step records were
    judged (``judged``; ``slow_rank`` None then: none), and from a run
    folder's ``states`` (rank -> its state, as ``analysis.ranks.verdict``
    decides it) the ranks that did not finish, or that all did."""
    out = [counted_line(a)]
    if a.verdict is not None:
        # as the terminal says it: the sentence and the advice, no title
        out.append(f"verdict: {finding_text(replace(a.verdict, title=''))}")
    of = f" of {a.world_size}" if a.world_size else ""
    traced = f"{len(a.ranks)}{of} analysed"
    if not a.ranks and any(f.code == NO_TRACES for f in a.findings):
        traced = f"{a.world_size or 0} with step records, none traced"
    ranks = f"ranks: {traced}"
    if judged:
        ranks += f"; slow rank: {'none' if slow_rank is None else slow_rank}"
    if states:
        ended = [f"rank {r} {st}" for r, st in sorted(states.items()) if st != "finished"]
        ranks += "; " + ("; ".join(ended) if ended else "every rank finished")
    out.append(ranks)
    return out
