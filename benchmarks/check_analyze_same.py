"""Check that ``torchlens analyze --json`` prints the same document before and
after a change (speed work must not move a single figure).

Run::

    # rank sets to analyse (benchmarks/make_rank_set.py), outside the checkout
    python benchmarks/make_rank_set.py ../rank-sets/ranks8 --ranks 8
    python benchmarks/make_rank_set.py ../rank-sets/ranks32 --ranks 32
    # before the change: record
    python benchmarks/check_analyze_same.py --record ../analyze-before \\
        ../rank-sets/ranks8 ../rank-sets/ranks32
    # after: compare (exit 1 and the first differences when any)
    python benchmarks/check_analyze_same.py --compare ../analyze-before \\
        ../rank-sets/ranks8 ../rank-sets/ranks32

Inputs: the folders given, plus every shared trace
(``*.json.gz`` in ``benchmarks/paths.py``'s traces folder: ``$TORCHLENS_TESTDATA``
or ``../shared/testdata`` beside the checkout, ``$TORCHLENS_TRACES`` overrides)
on its own, each again as ``rank0.json.gz`` in a folder of its own (so the
ones without ``distributedInfo`` are analysed too), a folder of bad input
(``bad_folder``) and the two ``sampled_rank-*`` traces as one run. ``--dask
SCHEDULER`` (``local``: two worker processes on this machine) reads every
input on a Dask cluster: compared with a ``--record`` made on one machine,
the cluster must give the same documents. Each input runs
``python -m torchlens analyze INPUT --json`` with this checkout first on
``PYTHONPATH`` (``--pythonpath`` another, ``--python`` the interpreter); its stdout, exit status
and the first line of stderr are recorded. Floats are compared exactly: the
change must give the same numbers, not nearly the same.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import paths as bench_paths

REPO = bench_paths.REPO
TRACES = bench_paths.traces()


def inputs(folders: list[str]) -> dict[str, list[str]]:
    """Name -> the analyze command's path arguments."""
    out = {Path(f).name: [str(Path(f).resolve())] for f in folders}
    links = Path(tempfile.gettempdir()) / "torchlens-check-links"
    for trace in sorted(TRACES.glob("*.json.gz")):
        out[trace.name] = [str(trace)]
        # named as a rank's file, so a trace without distributedInfo is analysed
        # too (a fixed folder: the document holds its path)
        link = links / trace.name.split(".")[0] / "rank0.json.gz"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(trace)
        out[f"{trace.name} as rank0"] = [str(link.parent)]
    pair = [TRACES / "sampled_rank-0.json.gz", TRACES / "sampled_rank-1.json.gz"]
    if all(p.exists() for p in pair):
        out["sampled_rank-0+1"] = [str(p) for p in pair]
        out["bad input"] = [str(bad_folder(links / "bad-input", *pair))]
    return out


def bad_folder(folder: Path, first: Path, second: Path) -> Path:
    """A run folder with one of each odd file (written once, then reused): a
    plain copy, a truncated gzip, two gzip members, a damaged gzip, JSON that
    is no trace, text that is no JSON, and a file whose rank repeats one."""
    if folder.is_dir():
        return folder
    folder.mkdir(parents=True)
    a, b = gzip.decompress(first.read_bytes()), gzip.decompress(second.read_bytes())
    (folder / "rank0.json.gz").write_bytes(first.read_bytes())
    (folder / "rank1.json").write_bytes(b)
    (folder / "rank2.json.gz").write_bytes(second.read_bytes()[:40_000])
    half = len(b) // 2
    (folder / "rank3.json.gz").write_bytes(gzip.compress(b[:half]) + gzip.compress(b[half:]))
    damaged = bytearray(gzip.compress(a))
    damaged[len(damaged) // 2:len(damaged) // 2 + 64] = bytes(64)
    (folder / "rank4.json.gz").write_bytes(bytes(damaged))
    (folder / "rank5.json").write_text('{"schemaVersion": 1, "other": []}')
    (folder / "rank6.json").write_text("hello")
    (folder / "rank7_copy.json.gz").write_bytes(gzip.compress(a))
    return folder


def run(python: str, paths: list[str], pythonpath: str, dask: str | None = None
        ) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    more = ["--dask", dask] if dask else []
    # cwd: ``-m`` puts the working folder first on sys.path, before PYTHONPATH
    r = subprocess.run([python, "-m", "torchlens", "analyze", *paths, "--json", *more],
                       capture_output=True, env=env, text=True, timeout=1800,
                       cwd=pythonpath)
    doc: Any = None
    if r.stdout.strip():
        try:
            doc = json.loads(r.stdout)
        except json.JSONDecodeError:
            doc = r.stdout
    return {"rc": r.returncode, "json": doc,
            "stderr": (r.stderr.strip().splitlines() or [""])[-1]}


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Paths at which two JSON values differ (exactly), the first few."""
    if type(a) is not type(b):
        return [f"{where}: {a!r:.80} != {b!r:.80}"]
    if isinstance(a, dict):
        out = [f"{where}.{k}: only on one side" for k in a.keys() ^ b.keys()]
        for k in a.keys() & b.keys():
            out += differences(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list):
        out = [f"{where}: {len(a)} != {len(b)} items"] if len(a) != len(b) else []
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            out += differences(x, y, f"{where}[{i}]")
        return out
    return [] if a == b else [f"{where}: {a!r:.80} != {b!r:.80}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", help="run folders (e.g. ../rank-sets/ranks8)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", metavar="DIR", help="write each input's output here")
    mode.add_argument("--compare", metavar="DIR", help="compare with what DIR holds")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--pythonpath", default=str(REPO),
                    help="the torchlens checkout to run (default: this one); e.g. a "
                         "`git archive` of the commit before the change, for --record")
    ap.add_argument("--dask", metavar="SCHEDULER",
                    help="analyse on this Dask cluster (analyze --dask): --compare it with "
                         "a --record made on one machine; 'local' starts a cluster of two "
                         "worker processes on this machine for the check")
    args = ap.parse_args(argv)
    if args.dask == "local":
        from distributed import LocalCluster

        with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                          dashboard_address=None) as local:
            return main(_with(sys.argv[1:] if argv is None else argv,
                              local.scheduler_address))
    bad = 0
    for name, paths in inputs(args.folders).items():
        now = run(args.python, paths, args.pythonpath, args.dask)
        if args.record:
            Path(args.record).mkdir(parents=True, exist_ok=True)
            (Path(args.record) / f"{name}.json").write_text(json.dumps(now))
            print(f"{name}: recorded (rc {now['rc']})")
            continue
        before = json.loads((Path(args.compare) / f"{name}.json").read_text())
        diff = differences(before, now)
        bad += bool(diff)
        print(f"{name}: {'same' if not diff else f'{len(diff)} differences'}")
        for line in diff[:10]:
            print(f"    {line}")
    return 1 if bad else 0


def _with(argv: list[str], address: str) -> list[str]:
    """``argv`` with ``--dask local`` made ``--dask ADDRESS``."""
    out = list(argv)
    i = out.index("--dask")
    out[i + 1] = address
    return out


if __name__ == "__main__":
    raise SystemExit(main())
