"""How the job ``torchlens run`` started ended, read from its exit code and
its last lines of output, for the verdict of an ended run.

A job can fail where no rank says so: a mistyped script path ends every
worker with code 2 before the script runs, yet each worker attached when
its interpreter started and said goodbye at exit ("finished"). The ranks'
own words are then no verdict: torchrun's exit code, the workers' exit codes
(torchrun's failure report: ``rank : R (local_rank: L)`` then ``exitcode : C``)
and the job's own last line are.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from torchlens.analysis.ranks.slow import rank_list
from torchlens.analysis.ranks.verdict import no_step_words
from torchlens.model.findings import FAILED, NO_STEPS, WARNING, Figure, Finding

_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\b")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\b")
#: torch's own log lines (``E1127 22:22:29.973000 13106 torch/distributed/...``)
_TORCH_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
#: where torchrun's own report of the failure starts: what comes before is the job's
_AGENT_REPORT = re.compile(r"^[IWEF]\d{4} .*torch/distributed/elastic/.*\bfailed \(exitcode")
#: how many of the job's last lines the finding keeps (``details["output"]``)
KEPT_LINES = 5


def rank_exit_codes(lines: Iterable[str]) -> dict[int, int]:
    """rank -> exit code, from torchrun's failure report (only the ranks it names)."""
    codes: dict[int, int] = {}
    rank: int | None = None
    for line in lines:
        if m := _RANK.match(line):
            rank = int(m.group(1))
        elif (m := _EXITCODE.match(line)) and rank is not None:
            codes[rank] = int(m.group(1))
            rank = None
    return dict(sorted(codes.items()))


def job_output(lines: list[str]) -> list[str]:
    """The job's own last lines: before torchrun's report of the failure, torch's
    log lines left out, a line every rank printed alike once."""
    end = next((i for i, line in enumerate(lines) if _AGENT_REPORT.match(line)), len(lines))
    own = [line for line in lines[:end] if line.strip() and not _TORCH_LOG.match(line)]
    return list(dict.fromkeys(own))[-KEPT_LINES:]


def _code_words(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"code {code}"


def job_failed(code: int, lines: list[str]) -> Finding:
    """The verdict of a job that ended with a non-zero ``code`` (``lines``: its
    last lines of output, stdout and stderr as they came)."""
    by_code: dict[int, list[int]] = {}
    for rank, c in rank_exit_codes(lines).items():
        by_code.setdefault(c, []).append(rank)
    exits = "; ".join(f"{rank_list(ranks)} exited with {_code_words(c)}"
                      for c, ranks in by_code.items() if c != 0)
    said = job_output(lines)
    sentence = (f"the job failed: exit code {code}" + (f"; {exits}" if exits else "")
                + (f"; its last line: {said[-1].strip()}" if said else ""))
    return Finding(FAILED, sentence, (Figure("exit_code", code),),
                   advice="the job's output above (or the run's command.log) says why",
                   details={"output": said, "rank_exit_codes": by_code}, code="job_failed")


def job_ended(view: Any, code: int | None, lines: list[str],
              unattached: str | None = None) -> Any:
    """``view`` (a ``RunView`` of the ended run) as the job's end makes it: a job
    that failed where no rank said why leads with that (``job_failed``), and a
    rank torchrun says exited non-zero is not shown as finished. ``unattached``:
    why the job's ranks could not attach (its launcher), said when none did."""
    if not view.attached and unattached and view.verdict.severity != FAILED and not code:
        return dataclasses.replace(view, verdict=Finding(
            WARNING, no_step_words(0, view.world_size, unattached),
            view.verdict.figures, code=NO_STEPS))
    if not code:
        return view
    codes = rank_exit_codes(lines)
    rows = [dataclasses.replace(row, state=("killed by " if codes[row.rank] < 0 else "exit ")
                                + _code_words(codes[row.rank]))
            if row.state == "finished" and codes.get(row.rank) else row
            for row in view.ranks]
    verdict = view.verdict if view.verdict.severity == FAILED else job_failed(code, lines)
    return dataclasses.replace(view, ranks=rows, verdict=verdict)
