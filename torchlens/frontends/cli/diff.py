"""``torchlens diff A B``: two traces, two run folders, or two memory snapshots compared,
with the CI gates (``--fail-if-slower``, ``--fail-if-larger``). Split from ``cli``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from torchlens.frontends.cli.command import Command, must_exist
from torchlens.model import InputError
from torchlens.model.units import format_bytes, format_percent, format_us_as_ms


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
                                 "above A's")
        parser.add_argument("--fail-if-larger", type=float, metavar="PCT",
                            help="two snapshots: exit 1 when B's peak allocated memory is "
                                 "more than PCT %% above A's")
        parser.add_argument("--workers", type=int, default=None, metavar="N",
                            help="processes reading ranks in parallel (default: CPU count)")

    def run(self, args: argparse.Namespace) -> int:
        import json

        from torchlens.frontends.memory.diff import MemoryDiffResult, diff

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
        st = result.diff["step_time"]
        if verdict is None:
            raise InputError("--fail-if-slower: no step time to compare (a run has no "
                             "ProfilerStep#N spans)")
        if verdict:
            print(f"torchlens: step time regressed {format_percent(st['regression_pct'], signed=True)} "
                  f"({format_us_as_ms(st['a_median_us'])} -> {format_us_as_ms(st['b_median_us'])}), "
                  f"more than --fail-if-slower {args.fail_if_slower:g}%", file=sys.stderr)
            return 1
        return 0


def _memory_gate(result: Any, pct: float | None) -> int:
    """``--fail-if-larger``: 1 when B's peak is more than ``pct`` % above A's."""
    if pct is None:
        return 0
    peak = result.diff["figures"]["peak"]
    verdict = result.regressed(pct)
    if verdict is None:
        raise InputError("--fail-if-larger: A's peak is 0 bytes, nothing to compare with")
    if verdict:
        print(f"torchlens: peak allocated grew {format_percent(peak['pct'], signed=True)} "
              f"({format_bytes(peak['a'])} -> {format_bytes(peak['b'])}), more than "
              f"--fail-if-larger {pct:g}%", file=sys.stderr)
        return 1
    return 0
