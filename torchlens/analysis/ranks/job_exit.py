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
import signal
from collections.abc import Iterable
from typing import Any

from torchlens.analysis.ranks.slow import rank_list
from torchlens.analysis.ranks.verdict import no_step_words
from torchlens.model.findings import (
    COLLECTIVE_MISMATCH,
    EXIT_ABORT,
    FAILED,
    FAILED_RANK,
    LOST_NODE,
    NO_STEPS,
    WARNING,
    Figure,
    Finding,
)

_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\b")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\b")
#: torch's own log lines (``E1127 22:22:29.973000 13106 torch/distributed/...``)
_TORCH_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
#: where torchrun's own report of the failure starts: what comes before is the job's
_AGENT_REPORT = re.compile(r"^[IWEF]\d{4} .*torch/distributed/elastic/.*\bfailed \(exitcode")
#: what a transport or torch says when the ranks' collectives differ: gloo's
#: check of a received size, torch's TORCH_DISTRIBUTED_DEBUG=DETAIL check
_MISMATCH = re.compile(r"collective mismatch|received data size doesn't match"
                       r"|detected mismatch between collectives", re.I)
#: what C++ says when a process ends with a thread still running: at
#: interpreter exit, gloo's worker threads in a job that never called
#: ``torch.distributed.destroy_process_group()`` (pytorch/pytorch#190489)
_EXIT_ABORT = "terminate called without an active exception"
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
    if code >= 0:
        return f"code {code}"
    try:
        return f"signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"signal {-code}"


def mismatch_said(lines: Iterable[str]) -> str | None:
    """The job's line that says its ranks' collectives did not match (gloo's
    "Received data size doesn't match expected size. Is there a distributed
    collective mismatch in your code?"), from its ``what():`` on; None when
    no line says so."""
    for line in lines:
        if _MISMATCH.search(line):
            text = line.strip()
            at = text.find("what():")
            text = text[at + len("what():"):].strip() if at >= 0 else text
            start = text.find("Received data size")  # gloo's own check's words lead
            return text[start:] if start > 0 else text
    return None


def _mismatch(view: Any, codes: dict[int, int], said: str) -> Finding:
    """The verdict of a run whose output says its collectives did not match:
    the ranks that died of a signal (torchrun's report), else the verdict's."""
    # torchrun ends the other workers with SIGTERM once one fails: not a cause
    died = (sorted(r for r, c in codes.items() if c < 0 and c != -signal.SIGTERM)
            or list(view.verdict.ranks))
    steps = [r.steps for r in view.ranks if r.steps]
    at = f" at step {max(steps)}" if steps else ""
    how = "; ".join(f"{rank_list([r])} was killed by {_code_words(codes[r])}" for r in died
                    if r in codes)
    sentence = ("the ranks' collectives did not match" + at + (f": {how}" if how else "")
                + f"; the job said: {said}")
    return Finding(FAILED, sentence, tuple(Figure("rank", r) for r in died[:1]),
                   advice="issue the same collectives, in the same order and with the same "
                          "shapes, on every rank (TORCH_DISTRIBUTED_DEBUG=DETAIL names the "
                          "first that differs)",
                   details={"ranks": died, "output": [said]}, code=COLLECTIVE_MISMATCH)


def job_failed(code: int, lines: list[str]) -> Finding:
    """The verdict of a job that ended with a non-zero ``code`` (``lines``: its
    last lines of output, stdout and stderr as they came)."""
    by_code: dict[int, list[int]] = {}
    for rank, c in rank_exit_codes(lines).items():
        by_code.setdefault(c, []).append(rank)
    # the ranks torchrun ended with SIGTERM once another failed come last: a consequence
    causes = sorted((c for c in by_code if c != 0), key=lambda c: c == -signal.SIGTERM)
    exits = "; ".join(f"{rank_list(by_code[c])} exited with {_code_words(c)}" for c in causes)
    said = job_output(lines)
    sentence = (f"the job failed: exit code {code}" + (f"; {exits}" if exits else "")
                + (f"; the job's last line: {said[-1].strip()}" if said else ""))
    return Finding(FAILED, sentence, (Figure("exit_code", code),),
                   advice="the job's output above (or the run's command.log) says why",
                   details={"output": said, "rank_exit_codes": by_code}, code="job_failed")


def _exit_abort(aborted: list[int], code: int, said: str) -> Finding:
    """The verdict of a job whose ranks all ran to their end and said goodbye,
    and of which ``aborted`` then died of SIGABRT as their process exited."""
    who = rank_list(aborted)
    sentence = (f"the job failed as it exited, after its last step: {who} aborted "
                f"(signal 6, SIGABRT) after {'its' if len(aborted) == 1 else 'their'} "
                f"goodbye; exit code {code}; the job's last line: {said}")
    return Finding(FAILED, sentence, tuple(Figure("rank", r) for r in aborted[:1]),
                   advice="the training ran to its end and every step was recorded; a gloo "
                          "job that exits without torch.distributed.destroy_process_group() "
                          "can abort like this as its threads are torn down "
                          "(pytorch/pytorch#190489): call it once the training ends",
                   details={"ranks": aborted, "output": [said]}, code=EXIT_ABORT)


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
    # a rank that said goodbye, or went silent, and that torchrun says exited
    # non-zero: its exit code is what is known of how it ended
    rows = [dataclasses.replace(row, state=("killed by " if codes[row.rank] < 0 else "exit ")
                                + _code_words(codes[row.rank]))
            if row.state in ("finished", "lost") and codes.get(row.rank) else row
            for row in view.ranks]
    verdict = view.verdict if view.verdict.severity == FAILED else job_failed(code, lines)
    # ranks whose goodbye came before torchrun saw them die: their records are whole
    said_bye = {row.rank for row in view.ranks if row.state == "finished"}
    aborted = sorted(r for r, c in codes.items() if c == -signal.SIGABRT)
    last = next((line.strip() for line in reversed(job_output(lines)) if _EXIT_ABORT in line),
                None)
    # torchrun SIGTERMs the others once one dies: one that had as many steps ended too
    done = max((row.steps or 0 for row in view.ranks if row.rank in said_bye), default=0)
    if verdict.code == "job_failed" and aborted and last and said_bye >= set(aborted) \
            and all(row.rank in said_bye or (codes.get(row.rank) == -signal.SIGTERM
                                             and (row.steps or 0) >= done)
                    for row in view.ranks):
        verdict = _exit_abort(aborted, code, last)
    lost = [_died(node, codes) for node in view.lost]
    if verdict.code == LOST_NODE and lost and lost[0] is not view.lost[0]:
        who = rank_list(lost[0].ranks)
        verdict = Finding(FAILED, f"{who} was lost: {lost[0].why}",
                          (Figure("rank", lost[0].ranks[0]),),
                          advice=f"the other ranks' data is kept; look at {who}'s output "
                                 "for its last words (SIGABRT: a fatal error in native code, "
                                 "SIGKILL: kill -9 or the OOM killer)",
                          details={"ranks": lost[0].ranks}, code=LOST_NODE)
    # a rank killed by a signal sent no goodbye: its newest records, not yet
    # sent, died with it, so its count is of what arrived
    cut = [row for row in rows if codes.get(row.rank, 0) < 0 and codes[row.rank] != -signal.SIGTERM
           and row.state.startswith("killed by") and row.rank not in said_bye]
    notes = [*view.notes, *(f"rank {row.rank} was {row.state}: the steps it had not sent yet "
                            f"died with it, so its {row.steps or 0} steps are those that "
                            "arrived" for row in cut)]
    view = dataclasses.replace(view, ranks=rows, lost=lost, notes=notes)
    said = mismatch_said(lines)
    if said and verdict.code in (LOST_NODE, FAILED_RANK, "job_failed"):
        verdict = _mismatch(view, codes, said)
    return dataclasses.replace(view, verdict=verdict)


def output_where(view: Any, log: str | None) -> Any:
    """``view`` with its verdict's advice naming where the command's output is:
    ``log`` (the run folder's ``command.log``, where the command ran on a
    terminal) by its path, else the output above (relayed as it came)."""
    said = advice_where(view.verdict, log or "the command's output above")
    return view if said is view.verdict else dataclasses.replace(view, verdict=said)


def advice_where(finding: Finding, where: str) -> Finding:
    """``finding`` with its advice naming where the command's output is
    (``where``: a path, or words): a failed rank's sends the user to its
    ``[rankN]:`` lines there; a job that failed with no rank saying why, to
    its output. Any other finding is returned as it is."""
    rank = finding.ranks[0] if finding.ranks else None  # a saved one keeps it in details
    if finding.code == FAILED_RANK and isinstance(rank, int) \
            and finding.advice.startswith(f"look at rank {rank}'s traceback"):
        advice = f"look at rank {rank}'s traceback: its [rank{rank}]: lines in {where}"
    elif finding.code == "job_failed" and "command.log" in where:
        advice = f"the job's output says why: {where}"
    else:
        return finding
    return dataclasses.replace(finding, advice=advice)


def _died(node: Any, codes: dict[int, int]) -> Any:
    """A lost node's ranks (``verdict.LostNode``) that torchrun says died of a
    signal: said so, instead of guessing "killed or hung"."""
    if node.whole_node or not node.ranks or not all(codes.get(r, 0) < 0 for r in node.ranks):
        return node
    how = sorted({_code_words(codes[r]) for r in node.ranks})
    who = rank_list(node.ranks)
    why = (f"{'it was' if len(node.ranks) == 1 else 'they were'} killed by "
           f"{', '.join(how)} (torchrun's report), with no goodbye")
    return dataclasses.replace(node, why=why, words=f"{who}: {why}")


def interrupted_words(view: Any) -> str:
    """The last words of a run the user stopped (Ctrl-C or SIGTERM to ``torchlens
    run``), as its rank table says each rank ended: a rank that said goodbye
    after its last step reads ``finished`` there, so a stop that came as the
    job was ending says every rank finished before it, and one that came
    while some ranks still ran names the ranks that had finished; never
    ``interrupted`` over a table of finished ranks. ``view``: the ended run's
    ``RunView`` (its ``ranks`` rows, each with ``rank``, ``state``, ``steps``)."""
    rows = list(view.ranks)
    steps = [r.steps or 0 for r in rows]
    if all(r.state == "waiting" for r in rows):  # none attached (or none known)
        return "interrupted before any step: no rank attached, no step recorded"
    if not any(steps):
        return "interrupted before any step: no step recorded"
    done = [r.rank for r in rows if r.state == "finished"]
    if rows and len(done) == len(rows):
        counts = sorted(set(steps))
        after = f"{counts[0]} steps" + ("" if len(counts) == 1 else " or more")
        return f"every rank finished before the stop: each said goodbye after {after}"
    words = f"interrupted after {max(steps)} steps"
    if done:
        verb = "had" if len(done) == 1 else "had all"
        words += f" ({rank_list(done)} {verb} finished before the stop)"
    return words
