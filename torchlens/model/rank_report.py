"""What one ``%ddp_check`` rank reports when it ends: the worker's result, typed.

Each rank (``capture.ddp.worker``) puts one JSON result in the run's store as
it ends: where it ran, its environment before and after, each step's times and
parameter checksums, its error, its memory peak, the communication check, the
determinism and ``--strict`` figures and, under ``--profile``, how its steps
were profiled. The launcher decodes it once (``report_from``) and every check,
table and the run folder read these fields; a saved ``.tlprof`` holds them as
the same JSON. Unknown keys are ignored and missing ones take their defaults,
so files of other versions read.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from torchlens.model.checksums import ModuleChecksums
from torchlens.model.collectives import Fingerprint
from torchlens.model.messages import MemoryReading, OomOutcome
from torchlens.model.records import FsdpStep


class Bandwidth(msgspec.Struct):
    """One all_reduce size of the bandwidth check: its bytes, the fastest call's
    seconds, and the bus bandwidth that makes (GB/s, as nccl-tests count it)."""

    bytes: int
    seconds: float
    busbw_gbps: float


class CommCheck(msgspec.Struct):
    """The rank's first all_reduce (what it sent, got and should have got) and
    its bandwidth at a few sizes; ``error``: why the check could not run."""

    sent: int = 0
    got: float | None = None
    expected: float | None = None
    bandwidth: list[Bandwidth] = []
    error: str | None = None


class DivergentOp(msgspec.Struct, frozen=True):
    """The first op whose output differed between two seeded runs of a step:
    its name and index in the step, the user's line, the step, and its
    output's checksum in each run."""

    op: str
    op_index: int
    line: str
    step: int
    first: float | None
    second: float | None


class Determinism(msgspec.Struct):
    """The determinism check: the first op that differed (None: none did)."""

    first_op: DivergentOp | None = None


class BudgetFigures(msgspec.Struct):
    """How the profiling interval was chosen (``Stepper._agreed_every``): the
    median unprofiled step, a profiled step's extra wall time with its
    summary's CPU time, that CPU time, and the interval this rank proposed;
    each left out of the JSON until measured."""

    typical_step_s: float | UnsetType = UNSET
    profiled_extra_s: float | UnsetType = UNSET
    summary_cpu_s: float | UnsetType = UNSET
    proposed_every: int | UnsetType = UNSET


class ProfileTold(msgspec.Struct):
    """``--profile``: how the rank profiled (its interval, steps, whether steps
    were time windows, how the steps were found), its capture's errors, the
    seconds its profiler took, and how the interval was chosen."""

    every: int | None = None
    steps: int = 0
    windows: bool = False
    real_steps: int | bool = 0
    steps_by: str = ""
    errors: list[str] = []
    own_s: float = 0.0
    budget: BudgetFigures = msgspec.field(default_factory=BudgetFigures)


class RankError(msgspec.Struct):
    """The exception that ended the rank's job: its type, message and
    traceback, the phase it was in (``step 3``, ``comm_check``), when it was
    raised (unix s) and the diagnosis it carried, if any."""

    type: str = "error"
    message: str = ""
    traceback: str = ""
    phase: str = ""
    t: float | None = None
    diagnosis: Any = None

    def first_line(self) -> str:
        """The message's first line (what a table or a manifest shows)."""
        return (self.message.strip().splitlines() or [""])[0]


class WorkerStep(msgspec.Struct):
    """One call of the function on the rank (``--profile``: the whole run, one
    record): its number, start and end (unix s; None: it did not end), the
    checksums of the modules it built or returned and its return value's
    repr, the FSDP memory figures of the step, and the ``--steps`` limit
    that ended it."""

    step: int = 0
    start: float | None = None
    end: float | None = None
    modules: list[ModuleChecksums] = []
    returned: str | None = None
    fsdp_memory: FsdpStep | None = None
    step_limit: int | None = None

    @property
    def seconds(self) -> float | None:
        """Its wall time, None when it did not end."""
        return None if self.end is None or self.start is None else self.end - self.start


class RankReport(msgspec.Struct, kw_only=True):
    """One rank's result (the module docstring). ``node``, ``local_rank``,
    ``restart``: where torch's elastic agent started it (``--nnodes``), None
    otherwise; ``log``: the tail of its output, added by the launcher."""

    rank: int
    pid: int | None = None
    device: str | None = None
    device_uuid: str | None = None
    hostname: str | None = None
    versions: dict[str, str | None] = {}
    node: int | None = None
    local_rank: int | None = None
    restart: int | None = None
    env_start: dict[str, str | None] = {}
    env_end: dict[str, str | None] = {}
    steps: list[WorkerStep] = []
    error: RankError | None = None
    peak: MemoryReading = msgspec.field(default_factory=MemoryReading)
    timings: dict[str, float] = {}
    comm: CommCheck | None = None
    determinism: Determinism | None = None
    strict: dict[str, int] | None = None
    dropped: dict[str, int] = {}
    oom_snapshot: OomOutcome | None = None
    profile: ProfileTold | None = None
    log: str = ""

    def env(self) -> dict[str, str | None]:
        """Its environment at the end (at the start when it sent none then)."""
        return self.env_end or self.env_start


class RankResult(RankReport, kw_only=True):
    """What the worker puts in the store as it ends: its ``RankReport`` and,
    when its collectives were recorded, each one's fingerprint with the call's
    duration (``call_s``). The launcher moves the durations onto the
    fingerprints it reads and keeps the rest as the report."""

    collectives: list[Fingerprint] = []


def report_from(value: Any) -> RankReport | None:
    """A rank's result as decoded JSON -> ``RankReport``; None when it is none
    (a rank that sent nothing, a forged or damaged value)."""
    if isinstance(value, RankReport):
        return value
    if not isinstance(value, dict):
        return None
    value = dict(value)
    # a member of another shape (a newer or damaged worker) is left out, not the
    # whole report: the rest still says how the rank ended
    for _ in range(len(value) + 1):
        try:
            return msgspec.convert(value, RankReport)
        except msgspec.ValidationError as exc:
            m = _AT.search(str(exc))
            if m is None or m.group(1) not in value or m.group(1) == "rank":
                return None
            del value[m.group(1)]
    return None


#: the top-level member a ValidationError names (``... - at `$.steps[0].end```)
_AT = re.compile(r"at `\$\.([A-Za-z_]\w*)")
