"""The ``torchlens`` console script.

Each subcommand is a small ``Command`` subclass registered in ``COMMANDS``: it
adds its arguments to its own parser and runs with the parsed namespace. New
ones are one class and one line in ``COMMANDS``.

Bad input is the user's to fix, not a crash: an ``InputError`` (or an OS error
such as a missing folder) prints one line ``torchlens: error: ...`` on stderr
and exits with status 2, the argparse convention for usage errors.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from torchlens.frontends.shared.options import unrecognized
from torchlens.model import InputError, Profile, TorchlensError
from torchlens.model.units import MISSING, format_bytes, format_percent, format_us_as_ms

EXIT_USAGE = 2
#: a reader that closed the pipe (``| head``): what a shell reports for SIGPIPE
EXIT_PIPE = 128 + signal.SIGPIPE


def load_input(path: str) -> Profile:
    """What ``torchlens.load`` reads, as a Profile (``frontends.loading``: one
    loader for both); one Kineto trace is the single-trace report here."""
    from torchlens.frontends.loading import as_profile, load

    loaded = load(path, one_trace="trace", fork=True)  # a command runs no threads
    for line in [*problem_lines(loaded), *ignored_lines(loaded)]:
        print(line, file=sys.stderr)
    return as_profile(loaded)


def problem_lines(loaded: Any) -> list[str]:
    """Each input problem of a run, one line: the file, what is wrong and what was
    done instead (so a damaged manifest.json is named here, not only inside the
    HTML). The report is still written and the status stays 0, as ``torchlens
    analyze`` gives a partly readable folder; nothing readable is an error (2)."""
    return [f"torchlens: {p.kind}: {p.path}: {p.message}"
            for p in getattr(loaded, "problems", None) or []]


def ignored_lines(loaded: Any) -> list[str]:
    """What a run folder held that was not read, for the command's output."""
    from torchlens.analysis.runs.verdict import ignored_findings

    sources = getattr(loaded, "sources", None)
    if sources is None:
        return []
    return [f"torchlens: {f}" for f in ignored_findings(sources.ignored, sources.root)]


def must_exist(path: str) -> None:
    """One line when an input path is missing (before anything is read)."""
    if not Path(path).exists():
        raise InputError(f"{path}: no such file or folder. Check the path.")


class Command:
    """One subcommand: ``name``, ``help``, its arguments and what it does."""

    name = ""
    help = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare this command's arguments on its own subparser."""

    def run(self, args: argparse.Namespace) -> int:
        """Do the work; return the exit status. Raise InputError for bad input."""
        raise NotImplementedError


class ReportCommand(Command):
    name = "report"
    help = ("turn a saved .tlprof, a Kineto trace (.json, .json.gz), a folder of per-rank "
            "traces or an allocator snapshot (.pickle) into an HTML report")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path", help="a .tlprof result, a Kineto trace .json/.json.gz or an "
                                         "allocator snapshot .pickle")
        parser.add_argument("-o", "--output", metavar="OUT.html",
                            help="where to write the report (default: PATH's file name "
                                 "with .html, in the current folder; - for standard output)")
        parser.add_argument("--json", action="store_true",
                            help="memory reports (a snapshot .pickle, a saved %%gpumem "
                                 ".tlprof): print the figures as one JSON document instead "
                                 "(peak, categories, stages, sites, fragmentation, leaks)")
        parser.add_argument("--category", action="append", default=[], metavar="NAME=REGEX",
                            help="memory reports: your own category, matched first against "
                                 "each frame's file:function; repeat for more")

    def run(self, args: argparse.Namespace) -> int:
        import json

        from torchlens.frontends.memory.api import category_options

        custom = category_options(args.category)  # a bad regex: before reading the file
        profile = load_input(args.path)
        from torchlens.frontends import kinds  # after the input is known good

        if (args.json or custom) and profile.kind != "gpumem":
            raise InputError(f"{args.path}: {'--json' if args.json else '--category'} is for "
                             "memory reports (an allocator snapshot .pickle or a saved "
                             f"%%gpumem .tlprof), this is a {profile.kind} result"
                             + ("; for traces use torchlens analyze --json" if args.json
                                else ""))
        if profile.kind == "gpumem":
            from torchlens.frontends.memory.api import MemoryResult

            result = MemoryResult(profile).set_categories(custom)
            if args.json:
                print(json.dumps(result.to_json(), indent=1, allow_nan=False, default=str))
                return 0
            analysis = result.analysis()
        else:
            analysis = kinds.analyze(profile)
        if args.output == "-":  # the page on standard output, nothing else there
            sys.stdout.write(kinds.report_html(profile, analysis))
            return 0
        out = Path(args.output) if args.output else _default_output(args.path)
        if out.parent and not out.parent.resolve().is_dir():
            raise InputError(f"cannot write {out}: folder {out.parent} does not exist")
        out.write_text(kinds.report_html(profile, analysis), encoding="utf-8")
        print(f"torchlens: wrote {out}")
        if profile.kind == "run":  # what a run folder holds beyond the traces' tables
            from torchlens.analysis.runs.fsdp import fsdp_lines

            for line in fsdp_lines(analysis.fsdp):
                print(line)
        return 0


class DemoCommand(Command):
    name = "demo"
    help = "profile a few training steps of a small model and write an HTML report"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-o", "--output", default="demo-report.html",
                            metavar="OUT.html", help="report path (default: %(default)s)")
        parser.add_argument("--steps", type=int, default=8, help="training steps")

    def run(self, args: argparse.Namespace) -> int:
        from torchlens.frontends.export import check_export_path

        check_export_path(args.output, "torchprof")
        if args.steps < 1:
            raise InputError(f"--steps {args.steps}: expected a whole number >= 1")
        from torchlens.frontends.cli.demo import run_demo

        result = run_demo(args.output, steps=args.steps)
        print(repr(result))
        print(f"torchlens: wrote {args.output}")
        return 0


class SimulateCommand(Command):
    name = "simulate"
    help = ("replay an allocator snapshot's trace through the CUDA caching-allocator model "
            "under other settings or a smaller card, and compare with what happened")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path", help="a snapshot .pickle (torch.cuda.memory._dump_snapshot)")
        parser.add_argument("--alloc-conf", default="", metavar="CONF",
                            help='PYTORCH_CUDA_ALLOC_CONF to try, e.g. '
                                 '"expandable_segments:True,max_split_size_mb:128"')
        parser.add_argument("--capacity", metavar="SIZE", help="device memory, e.g. 24GiB")
        parser.add_argument("-o", "--output", metavar="OUT.html",
                            help="also write the HTML report with the comparison")

    def run(self, args: argparse.Namespace) -> int:
        from torchlens.frontends.memory.api import load_gpumem
        from torchlens.render.memory.report import comparison_lines

        if args.output:
            from torchlens.frontends.export import check_export_path

            check_export_path(args.output, "gpumem")
        result = load_gpumem(args.path, simulate=True, capacity=args.capacity,
                             alloc_conf=args.alloc_conf or None)
        a = result.analysis()
        if not a.trace:
            raise InputError(f"{args.path}: the snapshot has no allocation trace to replay "
                             "(record with torch.cuda.memory._record_memory_history)")
        conf = args.alloc_conf or "the snapshot's own settings"
        cap = args.capacity or "unlimited"
        print(f"torchlens simulate: {Path(args.path).name}, {len(a.trace):,} events, "
              f"alloc conf: {conf}, capacity: {cap}")
        print("\n".join(comparison_lines(a)))
        for note in a.notes:
            print(f"note: {note}")
        if a.diagnosis is not None:
            print(f"simulated OOM ({a.diagnosis.cause}): {a.diagnosis.finding.sentence}")
        if args.output:
            print(f"torchlens: wrote {result.export(args.output)}")
        return 0


def _default_output(path: str) -> Path:
    name = Path(path).name
    for suffix in (".json.gz", ".json", ".tlprof", ".pickle", ".pkl"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return Path(name + ".html")


class AnalyzeCommand(Command):
    name = "analyze"
    help = ("analyse a run's per-rank Kineto traces together (a folder, or files): HTA's "
            "temporal breakdown, idle time, overlap, kernels, launches, queues and memory "
            "bandwidth per rank; collectives, slow ranks and their likely cause, step skew, "
            "clock offsets (docs/RUNS.md)")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--schema", action="store_true",
                            help="print what each key of the --json document holds, and exit")
        parser.add_argument("paths", nargs="*", metavar="RUN_DIR_OR_FILE",
                            help="a folder of per-rank traces (plain or .gz; a --profile "
                                 "run folder too) or the trace files")
        parser.add_argument("--json", action="store_true",
                            help="print every table as one JSON document (schema: see "
                                 "torchlens.frontends.runs.api.JSON_SCHEMA)")
        parser.add_argument("--workers", type=int, default=None, metavar="N",
                            help="processes reading ranks in parallel (default: CPU count)")
        parser.add_argument("--dask", metavar="SCHEDULER", default=None,
                            help="read the rank files on a Dask cluster instead "
                                 "(its scheduler's address, tcp://host:8786): for traces "
                                 "that outgrow one machine; its workers must see the "
                                 "files at the same paths and have torchlens installed; "
                                 "only each file's figures come back "
                                 "(pip install 'torchlens[dask]')")

    def run(self, args: argparse.Namespace) -> int:
        import json

        from torchlens.analysis.runs.analyze import (
            NS_NOTE,
            temporal_unmeasured,
            unsaid_problems,
        )
        from torchlens.frontends.runs.api import JSON_SCHEMA, SCHEMA_VERSION, load_run

        if args.schema:
            print(json.dumps({"schema_version": SCHEMA_VERSION, "keys": JSON_SCHEMA}, indent=1))
            return 0
        if not args.paths:
            raise InputError("torchlens analyze: name a run folder or trace files "
                             "(or --schema for the --json keys)")
        snap = next((p for p in args.paths if p.lower().endswith((".pickle", ".pkl"))), None)
        if snap is not None:  # else: "not JSON (it starts with ...)"
            raise InputError(f"{snap}: an allocator snapshot, not a trace; for its memory "
                             f"figures use torchlens report {snap} (--json for a JSON "
                             "document)")
        inputs = args.paths if len(args.paths) > 1 else args.paths[0]
        # tables only: the timeline and diff figures are never printed here
        if args.dask:
            from torchlens.frontends.runs.workers import dask_executor

            executor, client = dask_executor(args.dask)
            try:
                run = load_run(inputs, tables_only=True, executor=executor)
            finally:
                client.close()
        else:
            run = load_run(inputs, workers=args.workers, fork=True, tables_only=True)
        if args.json:  # the document, whatever it holds: a script reads its problems
            print(json_text(run.to_json()))
        if run.nothing_read:
            # unusable input: said once, on stderr, as every command says it
            # (the text view would only repeat it: "0 ranks analysed")
            for line in _nothing_read(run, inputs):
                print(line, file=sys.stderr)
            return EXIT_USAGE
        if not args.json:
            # the verdict leads (as the terminal of torchlens run says it), then
            # the other findings; the GPU time table only when it holds a figure
            print(repr(run))
            # a problem a finding says in full (a damaged manifest) is said there
            for p in unsaid_problems(run.problems):
                print(f"  {p.kind}: {p.path}: {p.message}")
            said = run.analysis().verdict
            for found in run.analysis().findings:
                if found is not said:  # the verdict is the repr's line
                    print(f"- {found}")
            unmeasured = temporal_unmeasured(run.analysis().temporal)
            if unmeasured:
                print(unmeasured)
            else:
                print(run.temporal().to_string(index=False, na_rep=MISSING))
                print(f"({NS_NOTE})")
        return 0


def json_text(doc: Any) -> str:
    """``json.dumps(doc, indent=1, allow_nan=False, default=str)``, the same text:
    with an indent ``json`` takes its pure-Python encoder (~50 ms for 8 ranks'
    document, a tenth of ``analyze``'s wall); the C encoder's compact text
    re-indented by msgspec is byte for byte that (tests/runs/test_run_api.py)."""
    import json

    import msgspec

    compact = json.dumps(doc, allow_nan=False, default=str)
    return msgspec.json.format(compact.encode(), indent=1).decode()


def _nothing_read(run: Any, inputs: Any) -> list[str]:
    """Why a run gave no rank: its first problem as the error, then the others
    and what was not read (one line for one missing path)."""
    first, *rest = run.problems or [None]
    why = f"{first.path}: {first.message}" if first else f"{inputs}: no per-rank trace"
    return [f"torchlens: error: {why}",
            *(f"torchlens: also {p.kind}: {p.path}: {p.message}" for p in rest),
            *ignored_lines(run)]


class DiffCommand(Command):
    name = "diff"
    help = ("compare run B with run A (each a folder of per-rank traces, a trace file or "
            "files): ops and kernels added, removed, slower and faster per step, and the "
            "step time; or two allocator snapshots / %%gpumem results: the peak and what was "
            "alive at it by category and site; --fail-if-slower / --fail-if-larger gate CI")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("a", metavar="A", help="the baseline: a run folder or a trace "
                                                   "file (.json, .json.gz)")
        parser.add_argument("b", metavar="B", help="the run to compare with A")
        parser.add_argument("--json", action="store_true",
                            help="print the diff as one JSON document (schema: "
                                 "torchlens.frontends.runs.diff.DIFF_JSON_SCHEMA)")
        parser.add_argument("-o", "--output", metavar="OUT.html",
                            help="also write the diff as an HTML report")
        parser.add_argument("--fail-if-slower", type=float, metavar="PCT",
                            help="exit 1 when B's median step time is more than PCT %% "
                                 "above A's and beyond run-to-run noise (each run's "
                                 "step-to-step spread, added)")
        parser.add_argument("--fail-if-larger", type=float, metavar="PCT",
                            help="two snapshots: exit 1 when B's peak allocated memory is "
                                 "more than PCT %% above A's")
        parser.add_argument("--workers", type=int, default=None, metavar="N",
                            help="processes reading ranks in parallel (default: CPU count)")

    def run(self, args: argparse.Namespace) -> int:
        import json

        from torchlens.frontends.loading import diff
        from torchlens.frontends.memory.diff import MemoryDiffResult

        for flag, pct in (("--fail-if-slower", args.fail_if_slower),
                          ("--fail-if-larger", args.fail_if_larger)):
            if pct is not None and not pct >= 0:
                raise InputError(f"{flag} {pct}: expected a percentage >= 0")
        out = Path(args.output) if args.output else None
        if out is not None and not out.parent.resolve().is_dir():
            raise InputError(f"cannot write {out}: folder {out.parent} does not exist")
        for path in (args.a, args.b):  # named itself, not the folder it would be in
            must_exist(path)
        result = diff(args.a, args.b, workers=args.workers)
        memory = isinstance(result, MemoryDiffResult)
        wrong = "--fail-if-slower" if memory and args.fail_if_slower is not None else \
            "--fail-if-larger" if not memory and args.fail_if_larger is not None else None
        if wrong:
            raise InputError(f"{wrong} does not apply to a diff of "
                             + ("two memory results: use --fail-if-larger" if memory else
                                "runs or traces: use --fail-if-slower"))
        if args.json:
            print(json.dumps(result.to_json(), indent=1, allow_nan=False, default=str))
        else:
            from torchlens.frontends import kinds

            print(kinds.text(result.profile, result.analysis()))
        if out is not None:
            from torchlens.frontends import kinds

            out.write_text(kinds.report_html(result.profile, result.analysis()),
                           encoding="utf-8")
            print(f"torchlens: wrote {out}", file=sys.stderr if args.json else sys.stdout)
        if memory:
            return _memory_gate(result, args.fail_if_larger)
        if args.fail_if_slower is None:
            return 0
        verdict = result.regressed(args.fail_if_slower)
        st = result.diff.step_time
        if verdict is None:
            raise InputError("--fail-if-slower: no step time to compare (a run has no "
                             "ProfilerStep#N spans)")
        change = (f"{format_percent(st.regression_pct, signed=True)} "
                  f"({format_us_as_ms(st.a_median_us)} -> {format_us_as_ms(st.b_median_us)})")
        if verdict:
            print(f"torchlens: step time regressed {change}, more than --fail-if-slower "
                  f"{args.fail_if_slower:g}%", file=sys.stderr)
            return 1
        if st.within_noise and (st.regression_pct or 0.0) > args.fail_if_slower:
            print(f"torchlens: step time {change}: more than --fail-if-slower "
                  f"{args.fail_if_slower:g}% but within run-to-run noise "
                  f"(±{format_us_as_ms(st.noise_us)}): not a regression", file=sys.stderr)
        return 0


def _memory_gate(result: Any, pct: float | None) -> int:
    """``--fail-if-larger``: 1 when B's peak is more than ``pct`` % above A's."""
    if pct is None:
        return 0
    peak = result.diff.figures.peak
    verdict = result.regressed(pct)
    if verdict is None:
        raise InputError("--fail-if-larger: A's peak is 0 bytes, nothing to compare with")
    if verdict:
        print(f"torchlens: peak allocated grew {format_percent(peak.pct, signed=True)} "
              f"({format_bytes(peak.a)} -> {format_bytes(peak.b)}), more than "
              f"--fail-if-larger {pct:g}%", file=sys.stderr)
        return 1
    return 0


class RunCommand(Command):
    name = "run"
    help = ("run a torchrun job (one node or several) under a live collector: a terminal "
            "summary that names the slow rank, lost nodes and memory creep, and a run "
            "folder for `torchlens report` (no code change: the script need not import "
            "torchlens)")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.usage = ("torchlens run [--out RUN_DIR] [--host IFACE] [--port P] [--no-profile] "
                        "[--metrics [HOST:]PORT [--metrics-token-file PATH]] -- "
                        "torchrun --nnodes ... train.py ARGS")
        parser.epilog = ("Each torchrun rank attaches when it starts (no code change); a step "
                         "ends at each torchlens.step() where the script calls it, else at "
                         "each optimizer step (or a framework's step callbacks). Everything "
                         "a rank sends is signed with a per-run secret (never in argv). Other "
                         "nodes: run the command printed at the start. docs/MULTINODE.md")
        parser.add_argument("--out", metavar="RUN_DIR",
                            help="run folder (default: torchlens-run-DATE-TIME)")
        parser.add_argument("--host", default="127.0.0.1", metavar="IFACE",
                            help="address or interface name the collector listens on "
                                 "(default: %(default)s, this machine only; name one for "
                                 "several nodes)")
        parser.add_argument("--port", type=int, default=0, metavar="P",
                            help="collector port (default: a free one)")
        parser.add_argument("--metrics", metavar="[HOST:]PORT",
                            help="serve the job's Prometheus metrics at /metrics (127.0.0.1 "
                                 "unless a host is named; a bearer token in "
                                 "RUN_DIR/metrics.token; docs/METRICS.md)")
        parser.add_argument("--metrics-token-file", metavar="PATH",
                            help="the bearer token for --metrics from this file of yours "
                                 "(mode 0600, read, never deleted): one Prometheus config "
                                 "for every run")
        parser.add_argument("--no-profile", action="store_true",
                            help="step records only: no rank runs torch.profiler (the "
                                 "report's timelines and op tables come from its profiled "
                                 "steps); for a job that torch.profiler upsets")
        parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                            help="the command to run, usually torchrun ... train.py ARGS")

    def run(self, args: argparse.Namespace) -> int:
        from torchlens.frontends.ranks.command import run

        return run(args.command, out=args.out, host=args.host, port=args.port,
                   metrics=args.metrics, metrics_token_file=args.metrics_token_file,
                   profile=not args.no_profile)


class MetricsCommand(Command):
    name = "metrics"
    help = ("print the Prometheus alerting rules or the Grafana dashboard for "
            "`torchlens run --metrics` (docs/METRICS.md)")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("what", choices=("rules", "dashboard"),
                            help="rules: alerting rules (YAML); dashboard: Grafana dashboard (JSON)")

    def run(self, args: argparse.Namespace) -> int:
        from torchlens.frontends.metrics_files import shipped

        sys.stdout.write(shipped(args.what))
        return 0


#: Subcommands in the order ``torchlens --help`` lists them.
COMMANDS: list[Command] = [ReportCommand(), DemoCommand(), SimulateCommand(), AnalyzeCommand(),
                           DiffCommand(), RunCommand(), MetricsCommand()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchlens", description="torchlens: profile and debug PyTorch training."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_command=cmd, _parser=p)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parse_args``, but arguments left over after the subcommand's name are
    the subcommand's mistake: its usage, not the top level's (argparse's own
    ``parse_args`` reports them on the top parser). Exits 2 on a usage error."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and not argv[0].startswith("-") and (wrong := unknown_command(argv[0])):
        parser.error(wrong)
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = args._parser
        name = args._command.name
        before = name in argv and any(w in argv[:argv.index(name)] for w in extras)
        said = unrecognized(extras, parser if before else sub)
        if not before and (hint := _diff_hint(name, args, extras)):
            said = f"{said}; {hint}"
        (parser if before else sub).error(said)
    return args


def unknown_command(word: str) -> str | None:
    """argparse's words for a subcommand name that is none of ``COMMANDS``, with
    the one it was likely meant to be (``dif``: ``diff``); None for a known one."""
    names = [c.name for c in COMMANDS]
    if word in names:
        return None
    said = (f"argument COMMAND: invalid choice: {word!r} "
            f"(choose from {', '.join(repr(n) for n in names)})")
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return f"{said}; did you mean {close[0]}?" if close else said


def _diff_hint(name: str, args: argparse.Namespace, extras: list[str]) -> str | None:
    """Where a comparison asked of ``report`` or ``analyze`` (``--diff B``) is
    made: ``torchlens diff A B``."""
    flag = next((w for w in extras if w.split("=", 1)[0] == "--diff"), None)
    if flag is None or name not in ("report", "analyze"):
        return None
    after = extras[extras.index(flag) + 1:]
    other = flag.split("=", 1)[1] if "=" in flag else next(
        (w for w in after if not w.startswith("-")), "B")
    first = getattr(args, "path", None) or next(iter(getattr(args, "paths", None) or []), "A")
    return f"to compare two runs: torchlens diff {shlex.quote(first)} {shlex.quote(other)}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``torchlens`` console script; returns the exit status."""
    parser = build_parser()
    args = _parse(parser, argv)  # usage errors: argparse prints and exits 2
    try:
        status = args._command.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return status
    except BrokenPipeError:
        return _reader_went_away()
    except (TorchlensError, OSError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"torchlens: error: {message}", file=sys.stderr)
        return EXIT_USAGE


def _reader_went_away() -> int:
    """The reader of our output closed it (``torchlens analyze --json | head``):
    end quietly, as Unix tools do. What is still buffered cannot be written, and
    Python would complain when it tries again at exit: stdout becomes /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (a test's capture): nothing to silence
        pass
    return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
