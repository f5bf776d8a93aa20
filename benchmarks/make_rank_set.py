"""Build a folder of N per-rank Kineto traces from one (or a few) shared traces
(issue 13: multi-rank analysis at 8, 32, 128 and 1024 ranks).

Run (any Python 3.9+, standard library only)::

    python benchmarks/make_rank_set.py OUT_DIR --ranks 32 [--source a100]
        [--plain] [--offset-us 10] [--jobs 2] [--compresslevel 6]

Rank ``r`` is the source trace ``sources[r % len(sources)]`` rewritten so that

- its ``distributedInfo`` says ``"rank": r`` and ``"world_size": N`` (and the
  default process group's ``pg_size`` / ``ranks`` cover ``0..N-1``); a source
  without ``distributedInfo`` gets one, placed before ``traceEvents``;
- every ``"ts"`` value is shifted by ``r * offset_us`` microseconds (the digits
  after the decimal point are kept as written), so that no two ranks are
  byte-identical and their clocks disagree a little, as real ranks' do;
- a ``host_name`` before ``traceEvents`` (torch 2.4+ writes one there) becomes
  ``<host>-rank<r>``: clocks that disagree belong to different machines, and
  torchlens never aligns the clocks of ranks whose traces name one host.

Nothing else changes (durations, names, ids, ``baseTimeNanoseconds``). The
files are ``OUT_DIR/rank<r>.pt.trace.json.gz`` (``.json`` with ``--plain``),
``r`` zero-padded, a flat folder: HolisticTraceAnalysis' ``TraceAnalysis
(trace_dir=OUT_DIR)`` reads it as is (it lists ``*.gz`` / ``*.json`` in the
folder and takes each file's rank from the first ``"rank":\\s+(\\d+)`` match,
which is why the rewritten ``distributedInfo`` is written with ``": "``
separators; every file is checked for that after it is written).

``--source`` takes a path or a preset: ``a100`` (default:
``a100_ddp_resnet_rank0_nccl.json.gz``, 2-rank DDP ResNet with NCCL, 9.8 MB of
JSON, ~18k events after HTA's filtering), ``sampled`` (``sampled_rank-0`` and
``sampled_rank-1``, alternating), or several ``--source`` flags. The shared
traces are ``benchmarks/paths.py``'s (``$TORCHLENS_TESTDATA`` or
``../shared/testdata`` beside the checkout; ``$TORCHLENS_TRACES`` overrides). The output folder must not be inside the repository.

The rewrite streams: the source is read in 4 MiB pieces, each cut after its
last comma (a ``"ts": <number>`` token never holds one), rewritten with one
regular expression and written straight to the (gzip) output, so memory stays
at tens of MiB whatever the trace size (64 MiB peak for the a100 source); ``--jobs`` ranks are written at once.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import sys
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any, BinaryIO

import paths

REPO = paths.REPO
TRACES = paths.traces()
PRESETS = {
    "a100": ["a100_ddp_resnet_rank0_nccl.json.gz"],
    "sampled": ["sampled_rank-0.json.gz", "sampled_rank-1.json.gz"],
}
CHUNK = 4 << 20
TS_RE = re.compile(rb'(?<!\\)("ts"\s*:\s*)(-?\d+)(\.\d+)?([eE][+-]?\d+)?')
DIST_KEY = b'"distributedInfo"'
EVENTS_KEY = b'"traceEvents"'
HTA_RANK_RE = re.compile(rb'"rank":\s+(\d+)')


def resolve_sources(names: list[str]) -> list[Path]:
    out: list[Path] = []
    for name in names or ["a100"]:
        if name in PRESETS:
            out.extend(TRACES / f for f in PRESETS[name])
        else:
            out.append(Path(name))
    for p in out:
        if not p.is_file():
            raise SystemExit(f"no such source trace: {p}")
    return out


def open_in(path: Path) -> BinaryIO:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def open_out(path: Path, compresslevel: int) -> BinaryIO:
    if compresslevel > 0:
        return gzip.open(path, "wb", compresslevel=compresslevel)
    return open(path, "wb")


def shift_ts(offset_us: int):
    def sub(m: re.Match[bytes]) -> bytes:
        whole, frac, exp = m.group(2), m.group(3), m.group(4)
        if exp:  # never seen in Kineto output; fall back to float arithmetic
            num = float(whole + (frac or b"") + exp) + offset_us
            return m.group(1) + repr(num).encode()
        return m.group(1) + str(int(whole) + offset_us).encode() + (frac or b"")

    return sub


def dist_info(old: dict[str, Any] | None, rank: int, world: int) -> dict[str, Any]:
    info: dict[str, Any] = dict(old or {"backend": "nccl"})
    info["rank"] = rank
    info["world_size"] = world
    pgs = info.get("pg_config")
    if isinstance(pgs, list):
        for pg in pgs:
            if isinstance(pg, dict) and (
                pg.get("pg_desc") == "default_pg" or pg.get("pg_name") == "0"
            ):
                pg["pg_size"] = world
                pg["ranks"] = list(range(world))
    if "rank" in info:  # keep "rank" the first key HTA's scan can meet
        info = {"rank": info.pop("rank"), **info}
    return info


HOST_RE = re.compile(rb'("host_name"\s*:\s*")((?:[^"\\]|\\.)*)(")')


def rewrite_host(buf: bytes, rank: int) -> bytes:
    """``host_name`` (when it comes before ``traceEvents``) made one per rank."""
    e = buf.find(EVENTS_KEY)
    m = HOST_RE.search(buf, 0, e if e >= 0 else len(buf))
    if not m:
        return buf
    return buf[:m.end(2)] + f"-rank{rank}".encode() + buf[m.end(2):]


def rewrite_header(buf: bytes, rank: int, world: int, fin: BinaryIO) -> bytes:
    """Return ``buf`` (read further from ``fin`` where needed) with its
    ``distributedInfo`` replaced, or one inserted before ``traceEvents``."""
    return rewrite_host(_rewrite_dist(buf, rank, world, fin), rank)


def _rewrite_dist(buf: bytes, rank: int, world: int, fin: BinaryIO) -> bytes:
    dec = json.JSONDecoder()
    while True:
        d = buf.find(DIST_KEY)
        e = buf.find(EVENTS_KEY)
        if d >= 0 and (e < 0 or d < e):
            colon = buf.index(b":", d + len(DIST_KEY))
            start = colon + 1
            text = buf[start:].decode("utf-8", errors="surrogateescape")
            lead = len(text) - len(text.lstrip())
            try:
                old, end = dec.raw_decode(text, lead)
            except json.JSONDecodeError:
                more = fin.read(CHUNK)
                if not more:
                    raise
                buf += more
                continue
            end_b = start + len(text[:end].encode("utf-8", errors="surrogateescape"))
            new = json.dumps(dist_info(old, rank, world)).encode()
            return buf[:start] + b" " + new + buf[end_b:]
        if e >= 0:
            new = json.dumps(dist_info(None, rank, world)).encode()
            return buf[:e] + DIST_KEY + b": " + new + b", " + buf[e:]
        more = fin.read(CHUNK)
        if not more:
            raise ValueError("neither distributedInfo nor traceEvents found")
        buf += more


def write_rank(job: tuple[Path, Path, int, int, int, int]) -> tuple[int, int, float]:
    src, dst, rank, world, offset_us, level = job
    t0 = time.perf_counter()
    sub = shift_ts(rank * offset_us)
    tmp = dst.with_name(dst.name + ".part")
    n = 0
    level = level if dst.name.endswith(".gz") else 0
    with open_in(src) as fin, open_out(tmp, level) as fout:
        buf = rewrite_header(fin.read(CHUNK), rank, world, fin)
        while True:
            more = fin.read(CHUNK)
            buf += more
            if more:
                cut = buf.rfind(b",") + 1
                if cut <= 0:
                    continue
            else:
                cut = len(buf)
            out = TS_RE.sub(sub, buf[:cut])
            n += len(out)
            fout.write(out)
            buf = buf[cut:]
            if not more:
                break
    with open_in(tmp) as fh:
        m = HTA_RANK_RE.search(fh.read(1 << 20))
    if not m or int(m.group(1)) != rank:
        raise RuntimeError(f"{dst}: HTA would not read rank {rank} from it")
    os.replace(tmp, dst)
    return rank, n, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--ranks", type=int, required=True, help="world size N")
    ap.add_argument(
        "--source",
        action="append",
        default=[],
        help="trace path or preset (a100, sampled); repeatable",
    )
    ap.add_argument("--plain", action="store_true", help="write .json, not .json.gz")
    ap.add_argument("--offset-us", type=int, default=10, help="rank r: +r*this µs")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--compresslevel", type=int, default=6, choices=range(1, 10))
    ap.add_argument("--force", action="store_true", help="empty OUT_DIR first")
    args = ap.parse_args(argv)

    out = args.out_dir.resolve()
    if any((d / ".git").exists() for d in (out, *out.parents)) or REPO in out.parents:
        raise SystemExit(f"refusing to write traces inside a git checkout: {out}")
    if out.exists() and any(out.iterdir()):
        if not args.force:
            raise SystemExit(f"{out} is not empty (use --force to replace)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    sources = resolve_sources(args.source)
    width = len(str(args.ranks - 1))
    suffix = ".pt.trace.json" if args.plain else ".pt.trace.json.gz"
    jobs = [
        (
            sources[r % len(sources)],
            out / f"rank{r:0{width}d}{suffix}",
            r,
            args.ranks,
            args.offset_us,
            args.compresslevel,
        )
        for r in range(args.ranks)
    ]
    t0 = time.perf_counter()
    raw = 0
    if args.jobs > 1:
        with get_context("spawn").Pool(args.jobs) as pool:
            for _, n, _ in pool.imap_unordered(write_rank, jobs):
                raw += n
    else:
        for job in jobs:
            raw += write_rank(job)[1]
    wall = time.perf_counter() - t0
    disk = sum(p.stat().st_size for p in out.iterdir())
    rss = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    print(
        f"{args.ranks} ranks from {', '.join(s.name for s in sources)} -> {out}: "
        f"{raw / 1e6:.1f} MB JSON, {disk / 1e6:.1f} MB on disk, {wall:.1f} s, "
        f"peak RSS {rss / 1024:.0f} MiB",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
