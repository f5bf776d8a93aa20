"""A finding: what an analysis concluded, in the one shape every kind uses.

A trace's hints, a ``%ddp_check`` checklist line, the slow rank, ``torchlens
run``'s verdict, the multi-rank run's findings, a diff's verdict and an OOM's
conclusion are each a ``Finding``: how serious it is, one sentence that says it
with its figures, the figures themselves (named, with their unit, so a view or a
script can read them without parsing the sentence) and what to do about it.
``render.findings`` draws one as text and as HTML, the same way everywhere.

Every finding has a ``code``: one short word per kind of finding (``slow_rank``,
``memory_creep``, ``lost_node``, ...), stable across releases, so a script, the
sidebar or another analysis picks a finding by what it is, never by its words.
A checklist line's code is its name with underscores (``crashed_worker``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FAILED, WARNING, INFO, PASSED, NA = "failed", "warning", "info", "passed", "not applicable"
#: most severe first
SEVERITIES = (FAILED, WARNING, INFO, PASSED, NA)

# The codes more than one module picks a finding by.
#: the run's slow rank (``analysis.ranks.slow``), or that there is none
SLOW_RANK = "slow_rank"
#: a rank whose memory grows step after step
MEMORY_CREEP = "memory_creep"
#: every rank waits for its input most of its step (``analysis.ranks.input_bound``)
INPUT_BOUND = "input_bound"
#: every optimizer step all-reduces its gradients more than once (accumulation
#: without ``no_sync()``: ``analysis.ranks.ddp_config``)
ACCUMULATION_SYNC = "accumulation_sync"
#: DDP's gradient buckets far smaller than its default (``analysis.ranks.ddp_config``)
SMALL_BUCKETS = "small_buckets"
#: DDP ranks whose parameters differ (``analysis.ranks.ddp_config``)
PARAMETER_SYNC = "parameter_sync"
#: torch.compile splits the compiled code and runs a line eagerly between the
#: pieces (``analysis.trace.compiled``; job-wide: ``analysis.ranks.job_wide``)
GRAPH_BREAK = "graph_break"
#: mixed precision's loss scaler skipped optimizer steps for inf/nan gradients
SKIPPED_STEPS = "skipped_steps"
#: the job-wide findings that lead "no slow rank" (every rank alike)
JOB_WIDE = (INPUT_BOUND, ACCUMULATION_SYNC, SMALL_BUCKETS, SKIPPED_STEPS, GRAPH_BREAK)
#: a node (or a rank's process) that stopped reporting
LOST_NODE = "lost_node"
#: a rank that raised or died
FAILED_RANK = "failed_rank"
#: a rank finished its loop while its peers were still training: they failed
#: in their next collective (ranks ran different numbers of batches)
UNEVEN_INPUTS = "uneven_inputs"
#: ranks issued collectives that do not match (sizes, order): a rank died in one
COLLECTIVE_MISMATCH = "collective_mismatch"
#: every rank ran to its end, then a rank's process aborted as it exited
EXIT_ABORT = "exit_abort"
#: the run ended, or goes on, without a step recorded
NO_STEPS = "no_steps"
#: ranks still attaching: the run has not recorded a step yet
WAITING = "waiting"
#: a sentence the collector of ``torchlens run`` saved (a manifest's note)
COLLECTOR_NOTE = "collector_note"
#: files in a run folder that are not traces
IGNORED_FILES = "ignored_files"
#: a run folder with every rank's step records and no trace (``--no-profile``)
NO_TRACES = "no_traces"
#: a run diff's verdict: the step time and its largest change
RUN_DIFF = "run_diff"
#: a sentence from an older saved file, whose kind is not known
NOTE = "note"


def code_of(title: str) -> str:
    """A checklist name as its code: ``"crashed worker"`` -> ``"crashed_worker"``."""
    return "_".join(title.replace("-", " ").split()).lower()


@dataclass(frozen=True)
class Figure:
    """One named number of a finding. ``unit``: ``"ms"``, ``"µs"``, ``"B"``,
    ``"share"`` (a fraction of 1, shown as a percentage), ``"%"``, ``"x"`` (a
    ratio), a counted noun (``"steps"``), or ``""`` (a count, or a name)."""

    name: str
    value: Any
    unit: str = ""


@dataclass
class Finding:
    """What was found (``sentence``, with its ``figures``), how serious it is
    (``severity``: one of ``SEVERITIES``) and what to do (``advice``, "" when
    nothing). ``title``: what it is about (a hint's headline, the check a
    checklist line is for), "" when the sentence says it; ``details``: what a
    view needs beyond the figures (a traceback, per-rank rows); ``code``: the
    kind of finding (the module docstring), from the title when not given."""

    severity: str
    sentence: str
    figures: tuple[Figure, ...] = ()
    advice: str = ""
    title: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    code: str = ""

    def __post_init__(self) -> None:
        if not self.code:
            self.code = code_of(self.title) if self.title else NOTE

    def value(self, name: str, default: Any = None) -> Any:
        """The figure called ``name``'s value."""
        return next((f.value for f in self.figures if f.name == name), default)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks the finding names: ``details["ranks"]`` (a finding about
        several), else its ``rank`` figure; () when it names none."""
        many = self.details.get("ranks")
        if isinstance(many, (list, tuple)) and all(isinstance(r, int) for r in many):
            return tuple(many)
        one = self.value("rank")
        return (one,) if isinstance(one, int) and not isinstance(one, bool) else ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what a manifest or a saved diff holds reads back equal."""
        d = asdict(self)
        d["figures"] = list(d["figures"])
        return d

    def __str__(self) -> str:
        """The sentence and the advice, as one line (what ``--json`` and the
        public string APIs give)."""
        return f"{self.sentence}; {self.advice}" if self.advice else self.sentence

    # The checklist's own words for title, severity and sentence, which users
    # of ``DdpCheckResult.item(name)`` read.
    @property
    def name(self) -> str:
        return self.title

    @property
    def status(self) -> str:
        return self.severity

    @property
    def evidence(self) -> str:
        return self.sentence

    @property
    def detail(self) -> str:
        """A trace hint's older name for its sentence and advice (``Hint.detail``)."""
        return str(self)


class FindingLine(str):
    """A finding as the line a user reads (``str(Finding)``: a plain ``str``
    everywhere a string is expected) that keeps its ``finding``, so a script
    picks findings by ``code`` and ``severity``, never by their words."""

    finding: Finding

    def __new__(cls, finding: Finding) -> FindingLine:
        line = super().__new__(cls, str(finding))
        line.finding = finding
        return line

    @property
    def code(self) -> str:
        return self.finding.code

    @property
    def severity(self) -> str:
        return self.finding.severity

    def to_dict(self) -> dict[str, Any]:
        """What ``--json`` gives: the finding's ``to_dict`` and the line as ``text``."""
        return {**self.finding.to_dict(), "text": str(self)}


def as_finding(value: Finding | str | dict[str, Any] | None,
               severity: str = INFO, code: str = "") -> Finding | None:
    """A ``Finding`` from what a saved file or an older one holds: a plain
    sentence (an older diff's verdict, a manifest's), or ``to_dict``'s dict.
    ``code``: the kind of a plain sentence (and of a dict saved without one)."""
    if value is None or isinstance(value, Finding):
        return value
    if isinstance(value, str):
        return Finding(severity, value, code=code)
    figures = tuple(Figure(**f) if isinstance(f, dict) else Figure(*f)
                    for f in value.get("figures") or ())
    return Finding(str(value.get("severity") or severity), str(value.get("sentence") or ""),
                   figures, str(value.get("advice") or ""), str(value.get("title") or ""),
                   dict(value.get("details") or {}), str(value.get("code") or code))
