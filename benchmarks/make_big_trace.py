"""Make a trace of any size from a real one: N copies of it, one after another.

    python benchmarks/make_big_trace.py OUT.json [--copies N | --size GB] [--trace SRC]

Copy k is the source trace with every timestamp moved later by k times the
source's span (its first start to its last end, plus a 1 ms gap), and every
id that ties events together made unique to the copy: the op's
``External id``, the runtime/kernel ``correlation``, ``Ev Idx``, the flow
events' ``id``, autograd's ``Sequence number`` (each shifted by k times one
past its largest value in the source), and the step names
(``ProfilerStep#101`` of copy k is step 101 + k times the source's step
count). Process and thread metadata (``ph: M``) is written once. So every
figure of the N-copy trace follows from the source's: N times its events,
ops, kernels and steps; its idle time per step the same.

Written one event at a time (the source is held once, never the output), so a
10 GB trace needs no more memory than a 13 MB one. The output is plain JSON
(``.json``) or gzip (``.json.gz``), by its name. Never commit one: make it
where a benchmark needs it (a temporary folder).

The source defaults to the shared v100 DDP trace
(``v100_ddp_sgd_annotations_rank0.json.gz``, 68,692 events, 13.2 MB as JSON)
from ``benchmarks/paths.py``'s test data.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import paths

DEFAULT_SOURCE = "v100_ddp_sgd_annotations_rank0.json.gz"
#: args that tie events together: made unique per copy
ID_ARGS = ("External id", "correlation", "Ev Idx", "Sequence number")
STEP = re.compile(r"^ProfilerStep#(\d+)$")
GAP_US = 1000.0


def load_source(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as fh:
        return json.load(fh)


class Replicator:
    """The copies of one source trace's events (module docstring)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.events = [e for e in doc.get("traceEvents") or [] if isinstance(e, dict)]
        timed = [e for e in self.events if e.get("ph") != "M" and _num(e.get("ts"))]
        start = min(float(e["ts"]) for e in timed)
        end = max(float(e["ts"]) + float(e.get("dur") or 0) for e in timed)
        self.span = end - start + GAP_US
        self.strides = {k: 1 + max((int(a[k]) for e in self.events
                                    if isinstance(a := e.get("args"), dict)
                                    and isinstance(a.get(k), int)), default=0)
                        for k in ID_ARGS}
        self.flow_stride = 1 + max((int(e["id"]) for e in self.events
                                    if isinstance(e.get("id"), int)), default=0)
        steps = [int(m.group(1)) for e in self.events
                 if (m := STEP.match(str(e.get("name", ""))))]
        self.step_stride = (max(steps) - min(steps) + 1) if steps else 0
        self.per_copy = sum(1 for e in self.events if e.get("ph") != "M")
        self.metadata = len(self.events) - self.per_copy

    def copy(self, k: int) -> Iterator[dict[str, Any]]:
        """Copy ``k``'s events (copy 0 with the metadata events, the others without)."""
        for e in self.events:
            if e.get("ph") == "M":
                if k == 0:
                    yield e
                continue
            if k == 0:
                yield e
                continue
            out = dict(e)
            if _num(out.get("ts")):
                out["ts"] = _shift(out["ts"], k * self.span)
            if isinstance(out.get("id"), int):
                out["id"] = out["id"] + k * self.flow_stride
            args = out.get("args")
            if isinstance(args, dict):
                args = dict(args)
                for key, stride in self.strides.items():
                    if isinstance(args.get(key), int) and args[key] >= 0:
                        args[key] = args[key] + k * stride
                out["args"] = args
            m = STEP.match(str(out.get("name", "")))
            if m and self.step_stride:
                out["name"] = f"ProfilerStep#{int(m.group(1)) + k * self.step_stride}"
            yield out


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _shift(ts: Any, by: float) -> Any:
    """``ts`` moved later by ``by`` µs, keeping an integer an integer when it can."""
    moved = ts + by
    return int(moved) if isinstance(ts, int) and float(by).is_integer() else moved


def write(doc: dict[str, Any], copies: int, out: BinaryIO) -> int:
    """Write ``copies`` copies of ``doc`` to ``out``; the number of events written."""
    rep = Replicator(doc)
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    out.write(json.dumps(head)[:-1].encode() + (b', ' if head else b'') + b'"traceEvents": [')
    n = 0
    for k in range(copies):
        buf = []
        for e in rep.copy(k):
            buf.append(json.dumps(e, separators=(",", ":")))
            n += 1
        out.write(((",\n" if k else "\n") + ",\n".join(buf)).encode())
    out.write(b"\n]}\n")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the trace to write: .json, or .json.gz for gzip")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--copies", type=int, help="how many copies of the source")
    size.add_argument("--size", type=float, help="about this many GB of JSON (copies rounded up)")
    ap.add_argument("--trace", help=f"the source trace (default: {DEFAULT_SOURCE} from the "
                                    "shared test data)")
    args = ap.parse_args(argv)
    source = Path(args.trace) if args.trace else paths.traces() / DEFAULT_SOURCE
    if not source.is_file():
        print(f"make_big_trace: {source}: no such trace file; give one with --trace",
              file=sys.stderr)
        return 2
    doc = load_source(source)
    if args.copies is not None:
        copies = args.copies
    else:
        one = len(json.dumps(doc, separators=(",", ":")))
        copies = max(1, -(-int((args.size or 1.0) * 1e9) // one))
    if copies < 1:
        print("make_big_trace: --copies must be at least 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    opener = gzip.open if out.name.endswith(".gz") else open
    with opener(out, "wb") as fh:
        n = write(doc, copies, fh)
    print(f"{out}: {copies} copies of {source.name}, {n:,} events, "
          f"{out.stat().st_size / 1e6:,.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
