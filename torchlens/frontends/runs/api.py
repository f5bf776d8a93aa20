"""``torchlens.load(RUN_DIR)``: a folder (or list) of per-rank traces as one result.

Why worker processes: a rank's trace is parsed and summarised where it is
read (``analysis.runs.rank_figures``: a few KB per rank), so the
notebook never holds more than one rank's events per worker, and ranks are
read in parallel; each file is read once, its placement in the run and its
figures together (``run_workers``). ``_trace_figures`` is what a worker
computes per trace.

Each worker also lists its traces' collectives (``analysis.runs.
collectives.collective_table``: columns, about 40 bytes a collective), which
the run matches across ranks: ``collectives()``, ``stragglers()`` and
``findings()``.

A file that cannot be read is a named problem, never a traceback; the other
ranks are analysed. ``to_json()`` is what ``torchlens analyze RUN_DIR
--json`` prints (schema: ``JSON_SCHEMA`` below, versioned).
"""

from __future__ import annotations

import os
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import msgspec

from torchlens.analysis.ranks.job_exit import advice_where
from torchlens.analysis.ranks.recompiles import RunRecompiles
from torchlens.analysis.ranks.series import step_series
from torchlens.analysis.ranks.verdict import interrupted_states, peer_failed
from torchlens.analysis.runs.analyze import NS_NOTE
from torchlens.analysis.runs.fsdp import FsdpSteps
from torchlens.analysis.runs.memory_steps import MemorySteps
from torchlens.analysis.runs.rows import missing_as_nan, rows_json
from torchlens.analysis.runs.verdict import (
    folder_verdict,
    no_traces_note,
    with_run_recompiles,
)
from torchlens.formats.run_folder.files import LOG_FILE
from torchlens.formats.run_folder.manifest import (
    ManifestError,
    folder_of_manifest,
    read_manifest,
)
from torchlens.formats.run_folder.records import (
    collected_steps,
    iter_steps,
    ranks_with_steps,
    steps_without_manifest,
)
from torchlens.formats.run_folder.sources import Problem, RunSources, discover
from torchlens.frontends.result import Result
from torchlens.frontends.runs.damaged_files import (
    damaged_manifest,
    damaged_steps,
    said_lost,
)
from torchlens.frontends.runs.workers import RunReader
from torchlens.model import InputError, Profile
from torchlens.model.findings import FindingLine
from torchlens.model.payloads import RunPayload
from torchlens.model.records import StepRecord
from torchlens.model.run_figures import RankFigures, TraceFigures

#: 2: each finding is an object with its code (it was the sentence alone)
SCHEMA_VERSION = 2
#: The analysis tables ``to_json()`` holds whole, as ``RunAnalysis`` has them.
JSON_TABLES = ("temporal", "idle", "overlap", "kernels", "top_kernels", "steps", "step_skew",
               "stragglers", "clocks", "launches", "launch_outliers", "launch_kernels",
               "queues", "memory_bw", "collective_overlap", "fsdp")
#: The most ``collectives`` rows ``to_json()`` holds (the first ones, in
#: ``(trace, seq)`` order); ``collectives_left_out`` counts the rest.
MAX_JSON_COLLECTIVES = 256
#: The ``--json`` document, key by key (printed by ``torchlens analyze --schema``)
JSON_SCHEMA = {
    "schema": "torchlens-run, integer version",
    "root": "the folder or first file analysed",
    "world_size": "from the traces' distributedInfo (null when none says)",
    "ranks": "rank numbers analysed",
    "problems": "[{kind, path, message}]: every input that could not be used, and why",
    "ignored": "paths of the files in the folder that were not read: not traces by name "
               "(*.json, *.json.gz) nor a torchlens run folder's own files",
    "temporal": "per rank: span_us, busy_us, idle_us, compute_us, non_compute_us and "
                f"idle/compute/non_compute_pct (HTA's temporal breakdown; {NS_NOTE})",
    "idle": "per rank and stream: idle_us split into host_wait, kernel_wait, other (us, pct)",
    "overlap": "per rank: communication_us, overlapped_us, overlap_pct",
    "collective_overlap": "per rank with communication kernels and collective (all "
                          "collectives, all_gather, reduce_scatter, all_reduce, other): "
                          "communication_us, overlapped_us, exposed_us (not overlapped), "
                          "overlap_pct, exposed_pct (of the rank's GPU timeline)",
    "fsdp": "per FSDP rank of a torchlens run folder (empty otherwise): fsdp_sharded, "
            "fsdp_unsharded (its parameters' shards and the same gathered, bytes), "
            "fsdp_gathered (most gathered parameters alive at once in a step, measured), "
            "fsdp_gathered_how, gathered_modules, gathered_step, optimizer_state (bytes), "
            "allocator_peak (null: not read under torchlens run), text (in words)",
    "kernels": "per rank and kind (compute, communication, memory, other): us, count, pct",
    "top_kernels": "per rank, kind and name: count, total_us",
    "steps": "per rank and ProfilerStep: dur_us and us per role (kernel, memcpy, memset, "
             "runtime, dataloader, cpu_exec, other, comm): the %%torchprof breakdown",
    "step_skew": "per step number present on every rank: median_us, max_us, longest_rank "
                 "(the rank whose wall time, waits included, was longest: evidence, not the "
                 "slow-rank verdict), skew_pct = (max - median) / median",
    "collectives": "per collective matched across ranks by (trace, seq), at most "
                   f"{MAX_JSON_COLLECTIVES}: trace, seq, name, mismatch (null, or what the "
                   "ranks disagree on: then nothing is paired), ranks, missing, bytes, n, "
                   "arrivals {rank: unix s}, arrived_by (kernel: each rank's arrival is its "
                   "first NCCL kernel's start on the GPU, when every rank's trace has one | "
                   "host: when its host issued the call), issued {rank: unix s} (when each "
                   "rank's host issued it; never clock-aligned), last_rank, "
                   "waits_us {rank: us}, max_wait_us, "
                   "total_wait_us, dur_us, timed_by (kernel|host), span_us, algbw_GBps, "
                   "busbw_GBps (nccl-tests' conventions; definitions: "
                   "torchlens.analysis.runs.collectives)",
    "collectives_left_out": "how many collective rows did not fit in collectives",
    "stragglers": "per rank, most wait caused first: collectives, last (times it arrived "
                  "last), last_pct, caused_us (every other rank's wait, summed), "
                  "caused_each_us and caused_mean_us (one other rank's wait: in all, per "
                  "collective it was last at; for the rank the run folder's verdict "
                  "names, the verdict's: caused_each_us null, caused_mean_us the others' "
                  "wait per stall when it stalls, else null), waited_us, wait_per_step_us "
                  "(one other rank's wait per step: the slow-rank verdict's own figure, over "
                  "its steps, where the run folder's step records judged it); "
                  "for a rank that arrived last: cause (the step-breakdown role that stands "
                  "out: dataloader, cpu_exec, kernel, memcpy, memset, runtime, or null), "
                  "cause_us and cause_others_us (its and the other ranks' median us per step), "
                  "cause_words (the slow rank's rule: torchlens.analysis.ranks.slow)",
    "clocks": "per rank: host (the trace's host_name, null when not recorded), "
              "reference (the lowest rank), offset_us (median of its collective "
              "ends minus the reference's), collectives (shared with the reference), "
              "residual_median_us, residual_max_us (|end difference - offset|), applied "
              "(offset used to align arrivals and waits: never when every trace names one "
              "host; else when |offset| > 5 us and > 3x residual_median_us; then collectives' arrivals/last_rank/waits_us/max_wait_us "
              "are aligned and arrivals_raw, last_rank_raw, waits_raw_us, max_wait_raw_us "
              "keep the raw ones; definitions: torchlens.analysis.runs.clock)",
    "launches": "per rank: CUDA kernel launch statistics (HTA's get_cuda_kernel_launch_stats): "
                "launches (GPU work paired with its launch call), delay/cpu/gpu_{mean,std,min,"
                "p25,p50,p75,max}_us (launch delay = GPU start - launch call end, clipped at 0; "
                "cpu = launch call; gpu = GPU event), gpu_shorter_than_cpu (+_pct), "
                "short_kernels (gpu < cpu and cpu <= runtime_cutoff_us), runtime_outliers "
                "(cpu > runtime_cutoff_us), delay_outliers (delay > launch_delay_cutoff_us), "
                "the cutoffs (HTA's 50 and 100 us), apis {name: launches}; null figures "
                "without GPU work (definitions: torchlens.analysis.runs.launches)",
    "launch_outliers": "per rank, the launches with the longest launch delay: trace, name, "
                       "api, ts_us, cpu_us, gpu_us, delay_us",
    "launch_kernels": "per rank and GPU name (the top names by total launch delay): count, "
                      "delay_total_us, delay_mean_us, delay_max_us, cpu_mean_us, gpu_mean_us, "
                      "gpu_shorter_than_cpu",
    "queues": "per rank and GPU stream: launches and the queue length (operations launched, "
              "not yet started) over its change points: count, mean, std, min, p25, p50, p75, "
              "max (HTA's get_queue_length_summary); full_us, full_pct: time with 1024 or more "
              "queued (definitions: torchlens.analysis.runs.counters)",
    "memory_bw": "per rank and memory kind (Memcpy HtoD/DtoH/DtoD..., Memset): events, bytes, "
                 "count and mean/std/min/p25/p50/p75/max_GBps of the bandwidth series "
                 "(HTA's get_memory_bw_summary)",
    "findings": "one object per finding: code (its kind, stable: slow_rank, memory_creep, "
                "lost_node, failed_rank, straggler, step_skew, ...), severity, sentence, "
                "figures [{name, value, unit}], advice, title, details, and text (the "
                "sentence with what to do, as the report says it), most telling first: "
                "the slow ranks (arrived last far more often than chance with at least "
                "1 ms of others' wait) and their likely cause, and collective sequences "
                "that disagree",
}


def _table_figures(trace: Any, top: int) -> TraceFigures:
    """In a worker: what the run's tables and findings need of one trace, all
    that travels back (a few KB)."""
    from torchlens.analysis.runs import rank_figures
    from torchlens.analysis.runs.collectives import collective_table
    from torchlens.analysis.trace.steps import step_records

    one = rank_figures(trace, top=top)
    # the %%torchprof step breakdown (TensorBoard plugin's definitions)
    one.steps = step_records(trace)
    one.collectives = collective_table(trace)
    one.host = trace.meta.get("host_name")  # one host: one clock (clock.py)
    return one


def _trace_figures(trace: Any, top: int) -> TraceFigures:
    """In a worker: the tables' figures, the report's, ``run.ops()``'s and
    ``run.diff()``'s too."""
    from torchlens.analysis.runs.lanes import lane_summary
    from torchlens.analysis.runs.op_totals import op_totals
    from torchlens.analysis.trace.ops import bounded, op_sums

    one = _table_figures(trace, top)
    one.lanes = lane_summary(trace)  # the joint timeline's bounded events
    one.op_totals = op_totals(trace)  # per-name totals for run.diff()
    one.ops = msgspec.to_builtins(bounded(op_sums(trace)))  # the op table's sums
    return one


def _import_before_fork(tables_only: bool) -> None:
    """What every forked worker would import again (the figures' modules;
    numpy.ma, which numpy's percentile and unique import on first use, here too
    in the run's own analysis): imported once, before the workers fork."""
    import numpy.ma  # noqa: F401

    if not tables_only:
        from torchlens.analysis.runs import lanes, op_totals  # noqa: F401


class RunResult(Result):
    """The ranks of one run: tables as DataFrames, ``to_json()``, ``problems``;
    displayed, the report (a ``run`` Profile, saved as ``.tlprof`` like any)."""

    def __init__(self, sources: RunSources, figures: RankFigures,
                 problems: list[Problem]) -> None:
        try:
            manifest = read_manifest(sources.root) if sources.root else None
        except ManifestError:  # a folder of traces alone; discover named a broken manifest
            manifest = None
        fsdp, memory, recompiled = FsdpSteps(), MemorySteps(), RunRecompiles()

        def seen(rank: int, rec: StepRecord) -> None:
            fsdp.add(rank, rec)
            memory.add(rank, rec)
            recompiled.add(rank, rec)

        collected = collected_steps(sources.root, manifest, seen) if manifest else None
        if manifest is not None and collected is None:  # %ddp_check --profile's records
            for entry in manifest.ranks:
                for rec in iter_steps(sources.root, entry.rank):
                    seen(entry.rank, rec)
        # a damaged manifest: the step records are each rank's own file, whole without it
        broken = damaged_manifest(sources.root) if manifest is None else None
        if broken is not None:
            collected = steps_without_manifest(sources.root, seen)
        step_ranks = ([e.rank for e in manifest.ranks] if manifest is not None
                      else ranks_with_steps(sources.root) if broken is not None else [])
        verdict = folder_verdict(sources.root, manifest, step_ranks, sources.ignored,
                                 last_steps=memory.last_steps())
        with_run_recompiles(verdict, recompiled)
        log = os.path.join(sources.root, LOG_FILE) if sources.root else ""
        if log and os.path.isfile(log):  # a failure's advice names the folder's log by path
            verdict.findings = [advice_where(f, log) for f in verdict.findings]
        problems = problems + damaged_steps(sources.root, step_ranks, manifest)
        note = no_traces_note(bool(figures), bool(collected))
        if note:  # step records without a trace: a note, said once, not a problem
            problems = [q for q in problems if q.kind not in ("no traces", "missing rank")]
            verdict.findings = [*verdict.findings, *note]
        if broken is not None:
            problems = said_lost(problems, sources.root, broken, chart=collected is not None,
                                 verdict=verdict.slow is not None)
        payload = RunPayload(root=sources.root, world_size=sources.world_size,
                             problems=list(problems),
                             figures={str(r): f for r, f in sorted(figures.items())},
                             notes=verdict.findings,
                             collected_steps=step_series(collected) if collected else None,
                             fsdp=fsdp.figures(),
                             memory=memory.figures(manifest.memory_creep if manifest else ()))
        super().__init__(Profile(kind="run", title=f"torchlens run: {sources.root}",
                                 source=sources.root, payload=payload))
        self.sources = sources
        self.figures = figures
        self.problems = problems
        self.ignored = sources.ignored
        self._slow = verdict.slow
        #: each rank's state from the manifest of ``torchlens run`` (a rank that
        #: raised only because its peer failed read as such, ``peer_failed``)
        self._states: dict[int, str] = {}
        if manifest is not None and manifest.ranks and all(
                isinstance(e.state, str) for e in manifest.ranks):
            said = interrupted_states(peer_failed([str(e.state) for e in manifest.ranks],
                                                  [e.error for e in manifest.ranks],
                                                  [e.rank for e in manifest.ranks]),
                                      bool(manifest.interrupted))
            self._states = {e.rank: st for e, st in zip(manifest.ranks, said, strict=True)}
        #: loaded by ``load_run(tables_only=True)``: no timeline, no op totals
        self.tables_only = False

    def __repr__(self) -> str:
        """What was analysed, then the verdict and the ranks, as the terminal of
        ``torchlens run`` leads with them (``render.runs.lead``)."""
        from torchlens.render.runs.lead import lead_lines

        slow = self._slow
        return "\n".join(lead_lines(self.analysis(), getattr(slow, "rank", None),
                                     judged=slow is not None, states=self._states))

    def slow_rank(self) -> Any:
        """A run folder with step records (``torchlens run``, ``%ddp_check
        --profile``): the rank the others waited for and why
        (``analysis.ranks.slow.SlowRank``), the verdict that leads its report,
        as ``%ddp_check``'s ``result.slow_rank()`` gives it. None for traces
        alone: ``stragglers()`` judges those from their collectives."""
        return self._slow

    @property
    def ranks(self) -> list[int]:
        return sorted(self.figures)

    @property
    def nothing_read(self) -> bool:
        """Neither a rank's trace nor a step record: nothing to analyse."""
        return not self.figures and self.profile.payload.collected_steps is None

    def _table(self, name: str) -> Any:
        """One table of the run's analysis (computed once, for the report too), as
        a DataFrame: a figure that could not be measured is NaN (docs/RUNS.md,
        "Missing figures")."""
        return missing_as_nan(rows_json(getattr(self.analysis(), name)))

    def temporal(self) -> Any:
        """Per rank: compute, non-compute and idle time and shares (HTA's definitions)."""
        return self._table("temporal")

    def idle(self) -> Any:
        """Per rank and stream: idle time as host wait, kernel wait and other."""
        return self._table("idle")

    def overlap(self) -> Any:
        """Per rank: communication time overlapped by computation."""
        return self._table("overlap")

    def collective_overlap(self) -> Any:
        """Per rank and collective: communication time overlapped by compute and
        exposed (FSDP's all_gather apart from its reduce_scatter and DDP's all_reduce)."""
        return self._table("collective_overlap")

    def kernels(self) -> Any:
        """Per rank and kernel kind: time, count and share."""
        return self._table("kernels")

    def top_kernels(self) -> Any:
        """Per rank: the kernels that took the most time, by kind."""
        return self._table("top_kernels")

    def steps(self) -> Any:
        """Per rank and step: the ``%%torchprof`` step breakdown (µs per role)."""
        return self._table("steps")

    def step_skew(self) -> Any:
        """Per step index: median and slowest rank's step time, skew in %."""
        return self._table("step_skew")

    def launches(self) -> Any:
        """Per rank: CUDA kernel launch statistics (launch delay, launch call vs GPU
        time, short kernels, outliers; HTA's definitions, ``analysis.runs.launches``)."""
        return self._table("launches")

    def launch_outliers(self) -> Any:
        """Per rank: the launches with the longest launch delay."""
        return self._table("launch_outliers")

    def launch_kernels(self) -> Any:
        """Per rank and GPU name: launch delay and launch call vs GPU time."""
        return self._table("launch_kernels")

    def queues(self) -> Any:
        """Per rank and GPU stream: queue length summary and time at the full queue."""
        return self._table("queues")

    def memory_bw(self) -> Any:
        """Per rank and memory kind: memcpy/memset bandwidth summary in GB/s."""
        return self._table("memory_bw")

    def collectives(self) -> Any:
        """Per collective matched across ranks by (trace, seq): arrivals, the last rank,
        each rank's wait, duration and bandwidths, or what the ranks disagree on."""
        return self._table("collectives")

    def stragglers(self) -> Any:
        """Per rank, each a possible slow rank: how often it arrived last, how long
        the others waited for it and, where it arrived last, what makes it slow
        (the method keeps its older name)."""
        return self._table("stragglers")

    def clocks(self) -> Any:
        """Per rank: its clock's offset to the lowest rank's, from the ends of the
        collectives they share, the residual skew, and whether it was applied."""
        return self._table("clocks")

    def to_json(self) -> dict[str, Any]:
        a = self.analysis()
        rows = a.collectives
        return {"schema": SCHEMA_VERSION, "root": self.sources.root,
                "world_size": self.sources.world_size, "ranks": self.ranks,
                "problems": [vars(p) for p in self.problems], "ignored": self.ignored,
                **{key: rows_json(getattr(a, key)) for key in JSON_TABLES},
                "collectives": rows_json(rows[:MAX_JSON_COLLECTIVES]),
                "collectives_left_out": max(0, len(rows) - MAX_JSON_COLLECTIVES),
                "findings": [f.to_dict() for f in self.findings()]}

    def diff(self, other: RunResult | str | Path | list[str | Path]) -> Any:
        """This run (A) against ``other`` (B: a RunResult, or what ``load_run``
        reads): ops and kernels added, removed, slower and faster per step, and
        the step time (``frontends.runs.diff.DiffResult``)."""
        from torchlens.frontends.runs.diff import DiffResult

        other = other if isinstance(other, RunResult) else load_run(other)
        if self.tables_only or other.tables_only:
            raise InputError("run.diff(): a run loaded with tables_only=True has no op "
                             "totals to compare; load it again without tables_only.")
        return DiffResult.of(self, other)

    def findings(self) -> list[FindingLine]:
        """The report's findings, each as one line: its sentence with its
        figures, and what to do where there is something (``str(Finding)``),
        a string that keeps its ``code``, ``severity`` and ``finding``."""
        return [FindingLine(f) for f in self.analysis().findings]

    def hints(self) -> list[FindingLine]:
        """A run's known problems: its ``findings()`` (the word a run's report uses)."""
        return self.findings()

    def ops(self) -> Any:
        """The op table of ``%%torchprof``'s ``result.ops()`` (same columns and
        figures) per rank: a ``rank`` column first when the run has more than
        one, and ``steps`` last (``analysis.runs.op_totals.run_op_table``)."""
        from torchlens.analysis.runs.op_totals import run_op_table
        from torchlens.analysis.trace.ops import OpSums

        if self.tables_only:
            raise InputError("run.ops(): a run loaded with tables_only=True has no op "
                             "totals; load it again without tables_only.")
        return run_op_table({r: [msgspec.convert(f.ops, OpSums) for f in figs
                                 if not isinstance(f.ops, msgspec.UnsetType)]
                             for r, figs in self.figures.items()})


def rebuilt_if_its_command_died(folder: str) -> None:
    """A ``torchlens run`` folder its command never wrote (no manifest, a spool):
    rebuilt from the spool when that command is gone (``formats.run_folder.spool``);
    one clear error while it still runs, or when another host ran it."""
    from torchlens.formats.run_folder import spool

    if not spool.needs_rebuild(folder):
        return
    command = spool.read_command(spool.spool_dir(folder))
    alive = spool.command_alive(command)
    if alive:
        raise InputError(f"{folder}: its torchlens run is still running (pid {command.pid}); "
                         f"watch it with torchlens.watch({folder!r}): the folder is written "
                         "when it ends")
    if alive is None and command is not None:
        raise InputError(f"{folder}: written by torchlens run on host {command.host}, which "
                         "cannot be checked from here; run torchlens report there (its "
                         "folder is rebuilt from its spool when that command has died)")
    try:
        spool.rebuild(folder)
    except OSError as exc:  # a full disk: the spool is left as it was, read again later
        raise InputError(f"{folder}: its torchlens run ended before it wrote this folder, "
                         f"and rebuilding it from its spool failed ({exc.strerror or exc}); "
                         "free space on its disk, or copy the folder where there is some, "
                         "and run this again") from None


def load_run(inputs: str | Path | list[str | Path], *, workers: int | None = None,
             top: int = 10, fork: bool = False, tables_only: bool = False,
             executor: Executor | None = None) -> RunResult:
    """Discover a run's per-rank traces and summarise each file in a worker process
    (``run_workers``: each file read once, its peek and figures together).
    ``fork``: the caller runs no threads (the command line), workers may fork.
    ``tables_only``: only what the tables, findings and ``to_json()`` hold (what
    ``torchlens analyze`` prints), not the report's joint timeline nor
    ``diff()``'s op totals: ~15% less work per trace. ``executor``: read the
    files there instead (a Dask cluster's, ``workers.dask_executor``: beyond
    one machine; the same figures come back)."""
    if isinstance(inputs, (str, Path)):
        inputs = folder_of_manifest(inputs) or inputs
    for folder in [inputs] if isinstance(inputs, (str, Path)) else inputs:
        if os.path.isdir(folder):
            rebuilt_if_its_command_died(str(folder))
    if fork:
        _import_before_fork(tables_only)
    figures_of = _table_figures if tables_only else _trace_figures
    with RunReader(figures_of, top, workers, fork=fork, executor=executor) as reader:
        sources = discover(inputs, reader.peek_all)
    problems = list(sources.problems)
    figures: RankFigures = {}
    for r in sources.ranks:
        found, trouble = reader.rank(list(r.paths))
        problems += trouble
        if found:
            figures[r.rank] = found
    result = RunResult(sources, figures, problems)
    result.tables_only = tables_only
    return result


def diff_runs(a: Any, b: Any, *, workers: int | None = None, **thresholds: float) -> Any:
    """Run ``b`` against run ``a``; each a ``RunResult`` or what ``load_run`` reads."""
    from torchlens.frontends.runs.diff import DiffResult

    ra = a if isinstance(a, RunResult) else load_run(a, workers=workers)
    rb = b if isinstance(b, RunResult) else load_run(b, workers=workers)
    return DiffResult.of(ra, rb, **thresholds)
