"""Every reader of a user's file, fed damaged files: no traceback, no hang.

Mutated traces, snapshots, saved ``.tlprof`` files and run
folders (byte flips, files cut short, a value of the wrong type, huge numbers,
deep nesting) each ended in a Python traceback from ``torchlens report``,
``analyze``, ``simulate`` or ``diff``. Here a fixed seed builds a few hundred
such files from small valid ones (made by the test or kept in ``tests/data``)
and runs every reader on each, in this process: the command line's ``main``
must exit 0, or 2 with one line starting with ``torchlens:``; ``torchlens.load``
must return or raise an ``InputError``; and each case must end within
``LIMIT_S``. A failure lists every case that broke, with its mutation, so it
can be rebuilt from the seed.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gzip
import io
import json
import os
import pickle
import random
import re
import signal
import traceback
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import torchlens
from torchlens.formats.kineto import ingest_bytes
from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    Manifest,
    RankEntry,
    write_manifest,
)
from torchlens.formats.run_folder.records import write_steps
from torchlens.frontends.cli.main import main
from torchlens.model import InputError, load_profile
from torchlens.model.store import save_profile

DATA = Path(__file__).resolve().parents[1] / "data"
SEED = 2117
#: seconds one reader may take on one mutated file
LIMIT_S = 10.0
#: values a mutation puts where the file had another
SWAPS: list[Any] = ["12x", "", None, True, [], {}, -1, 1e300, -1e300, 10**30, -(10**30),
                    1.5, "1e999"]
DEEP = 5000


class Hang(BaseException):
    """Raised by the alarm: a reader ran past LIMIT_S (BaseException: nothing catches it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def ring(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------ mutations
def _slots(obj: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Every (container, key) holding a value, depth first."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    for key, value in items:
        out.append((obj, key))
        if isinstance(value, (dict, list)):
            _slots(value, out)
    return out


def mutate_value(doc: Any, rng: random.Random, deep: Any = None) -> tuple[Any, str]:
    """A deep copy of ``doc`` with one value swapped for another type, a huge
    number or a deep nest (``deep``, default ``nest(DEEP)``); and words saying which."""
    doc = copy.deepcopy(doc)
    slots = _slots(doc, [])
    numbers = [s for s in slots if isinstance(s[0][s[1]], (int, float))
               and not isinstance(s[0][s[1]], bool)]
    pool = numbers if numbers and rng.random() < 0.5 else slots
    holder, key = rng.choice(pool)
    roll = rng.random()
    if roll < 0.1:
        new: Any = nest(DEEP) if deep is None else deep
        what = "a deep nest"
    else:
        new = rng.choice(SWAPS)
        what = repr(new)
    holder[key] = new
    return doc, f"[{key!r}] = {what}"


def nest(depth: int) -> Any:
    out: Any = []
    for _ in range(depth):
        out = [out]
    return out


def json_bytes(doc: Any) -> bytes:
    """JSON that also holds what ``json.dumps`` refuses: nests deeper than its recursion."""
    try:
        return json.dumps(doc).encode()
    except RecursionError:
        return _deep_dumps(doc).encode()


def _deep_dumps(doc: Any) -> str:
    if isinstance(doc, list) and len(doc) == 1 and isinstance(doc[0], list):
        depth, inner = 0, doc
        while isinstance(inner, list) and len(inner) == 1 and isinstance(inner[0], list):
            depth, inner = depth + 1, inner[0]
        return "[" * depth + _deep_dumps(inner) + "]" * depth
    if isinstance(doc, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_deep_dumps(v)}" for k, v in doc.items()) + "}"
    if isinstance(doc, list):
        return "[" + ",".join(_deep_dumps(v) for v in doc) + "]"
    return json.dumps(doc)


#: stands for a deep nest in a pickle (``pickle.dumps`` itself recurses too deep)
NEST_MARK = "@@deep-nest@@"


def pickle_bytes(doc: Any) -> bytes:
    """``doc`` pickled, ``NEST_MARK`` replaced by DEEP nested lists (built without
    recursion: DEEP+1 EMPTY_LIST opcodes, then DEEP APPENDs)."""
    data = pickle.dumps(doc, protocol=2)  # protocol 2: no frames to keep in step
    mark = pickle.dumps(NEST_MARK, protocol=2)[2:].split(b"q", 1)[0]
    return data.replace(mark, b"]" * (DEEP + 1) + b"a" * DEEP)


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Bytes flipped or the file cut short."""
    if rng.random() < 0.35:
        cut = rng.randrange(0, len(data))
        return data[:cut], f"cut at {cut} of {len(data)}"
    out = bytearray(data)
    at = []
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(out))
        out[i] = rng.randrange(256)
        at.append(i)
    return bytes(out), f"bytes changed at {at}"


def mutate_json_file(doc: Any, rng: random.Random) -> tuple[bytes, str]:
    if rng.random() < 0.4:
        return mutate_bytes(json.dumps(doc).encode(), rng)
    changed, what = mutate_value(doc, rng)
    return json_bytes(changed), what


# ---------------------------------------------------------------- seed files
def small_trace() -> dict[str, Any]:
    """A real CUDA training-step trace (tests/data), cut to its first events."""
    doc = json.loads(gzip.decompress((DATA / "cuda" / "cuda_torchprof.json.gz").read_bytes()))
    events = doc["traceEvents"]
    doc["traceEvents"] = [e for e in events if e.get("ph") == "M"] + \
        [e for e in events if e.get("ph") != "M"][:300]
    return doc


def small_snapshot() -> dict[str, Any]:
    """A real CUDA allocator snapshot (tests/data) with its trace cut short."""
    snap = pickle.loads((DATA / "cuda" / "cuda_gpumem_side_stream.pickle").read_bytes())
    snap["device_traces"] = [t[:120] for t in snap["device_traces"]]
    return snap


def tlprof_seeds(trace: dict[str, Any], folder: Path) -> list[Path]:
    """A torchprof capture (tests/data, its trace replaced by the small one) and
    version-1 files of the other kinds."""
    captured = load_profile(DATA / "cuda" / "cuda_torchprof.tlprof")
    small = dataclasses.replace(
        captured, traces={"main": ingest_bytes(json.dumps(trace).encode(), "small.json")},
        attachments={})
    out = [Path(save_profile(small, folder / "torchprof.tlprof"))]
    return out + [DATA / "v1" / name for name in ("gpumem.tlprof", "ddp_check.tlprof")]


def write_run(folder: Path, trace: dict[str, Any]) -> Path:
    """A ``torchlens run`` folder of two ranks: manifest, steps.jsonl, one trace each."""
    ranks = []
    for rank in range(2):
        doc = copy.deepcopy(trace)
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
        name = f"rank{rank}/step00003.pt.trace.json"
        (folder / f"rank{rank}").mkdir(parents=True)
        (folder / name).write_text(json.dumps(doc))
        write_steps(str(folder), rank, [
            {"step": s, "t0": 1000.0 + s, "t1": 1000.5 + s, "phases": {"data": 0.1},
             "profiled": s == 3, "window": False,
             "mem": {"rss": 1 << 20, "source": "rss"}} for s in range(6)])
        ranks.append(RankEntry(rank=rank, traces=[name], host="h", state="finished",
                               steps=6))
    write_manifest(str(folder), Manifest(source=SOURCE_RUN, world_size=2, ranks=ranks,
                                         started=999.0, exit_code=0))
    return folder


# ------------------------------------------------------------------- readers
def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


#: an exception's class named in a message: something leaked past the readers
LEAKED = re.compile(r"\b(?!InputError|ManifestError|FormatVersionError)[A-Z]\w*(Error|Exception): ")


def check(label: str, call: Callable[[], Any], cli: bool, problems: list[str],
          name: str = "") -> None:
    """Run one reader under the time limit; note what a user should not see."""
    try:
        with time_limit(LIMIT_S):
            result = call()
    except Hang as exc:
        problems.append(f"{label}: hang ({exc})")
        return
    except InputError as exc:
        if cli or "\n" in str(exc).strip() or not str(exc):
            problems.append(f"{label}: InputError escaped or not one line: {exc!r}")
        return
    except BaseException as exc:  # noqa: BLE001 - what the user would see as a traceback
        problems.append(f"{label}: {type(exc).__name__}: {str(exc)[:200]} at {_where(exc)}")
        return
    if not cli:
        return
    rc, out, err = result
    lines = [ln for ln in err.splitlines() if ln.strip()]
    said = (lines[0] if len(lines) == 1 else "") if lines else ""
    if rc == 2 and not lines and " analyze" in label and name in out:
        # analyze lists a run's input problems, each naming its file, on stdout
        said = "torchlens: " + " ".join(ln for ln in out.splitlines() if "error" in ln.lower()
                                        or "message" in ln or name in ln)
    if rc not in (0, 2) or (rc == 2 and not said.startswith(("torchlens:", name))):
        problems.append(f"{label}: exit {rc}, stderr {err[:300]!r}, stdout {out[:300]!r}")
    elif LEAKED.search(said):
        problems.append(f"{label}: an exception's words reached the user: {said[:300]}")


def _where(exc: BaseException) -> str:
    """The innermost torchlens line the exception passed (where to fix it)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "torchlens/" in f.filename
              and "/tests/" not in f.filename]
    return f"{frames[-1].filename.split('torchlens/')[-1]}:{frames[-1].lineno}" if frames else "?"


def readers(path: Path, kind: str, good: Path, tmp: Path) -> list[tuple[str, Callable, bool]]:
    html = str(tmp / "out.html")
    p = str(path)
    out = [("report", lambda: run_cli(["report", p, "-o", html]), True)]
    if kind in ("trace", "run"):
        out += [("analyze", lambda: run_cli(["analyze", p, "--workers", "1"]), True),
                ("analyze --json", lambda: run_cli(["analyze", p, "--json", "--workers", "1"]),
                 True),
                ("diff", lambda: run_cli(["diff", str(good), p, "--workers", "1"]), True),
                ("diff --json", lambda: run_cli(["diff", p, str(good), "--json",
                                                 "--workers", "1"]), True)]
    if kind == "snapshot":
        out.append(("simulate", lambda: run_cli(["simulate", p, "--capacity", "64MiB"]), True))
    if kind in ("trace", "run", "tlprof"):
        out.append(("torchlens.load", lambda: torchlens.load(p), False))
    return out


def run_all(cases: Iterator[tuple[Path, str, str, Path]], tmp: Path) -> list[str]:
    problems: list[str] = []
    for path, kind, what, good in cases:
        for name, call, cli in readers(path, kind, good, tmp):
            check(f"{kind} {path.name} ({what}) {name}", call, cli, problems, path.name)
    return problems


def _report(problems: list[str], n: int) -> str:
    return f"{len(problems)} problems in {n} cases:\n" + "\n".join(problems[:60])


# --------------------------------------------------------------------- tests
@pytest.fixture(autouse=True)
def one_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run folders are read in this process (``RunReader`` takes the CPU count as
    its default), as ``--workers 1`` does: a pool per case would cost seconds."""
    monkeypatch.setattr(os, "cpu_count", lambda: 1)


def test_the_seed_files_read_cleanly(tmp_path: Path) -> None:
    """The unmutated files pass every reader: the mutations are what breaks."""
    trace = small_trace()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(trace))
    snap = tmp_path / "snap.pickle"
    snap.write_bytes(pickle.dumps(small_snapshot()))
    run = write_run(tmp_path / "run", trace)
    cases = [(good, "trace", "as is", good), (snap, "snapshot", "as is", good),
             (run, "run", "as is", good)]
    cases += [(p, "tlprof", "as is", good) for p in tlprof_seeds(trace, tmp_path)]
    problems = run_all(iter(cases), tmp_path)
    assert not problems, _report(problems, len(cases))
    rc, out, _ = run_cli(["simulate", str(snap), "--capacity", "64MiB"])
    assert rc == 0 and "events" in out


def trace_cases(tmp: Path, rng: random.Random, n: int) -> Iterator[tuple[Path, str, str, Path]]:
    trace = small_trace()
    good = tmp / "good.json"
    good.write_text(json.dumps(trace))
    for i in range(n):
        data, what = mutate_json_file(trace, rng)
        if i % 5 == 4:
            data, what = gzip.compress(data, mtime=0), what + ", gzipped"
            if rng.random() < 0.5:
                data, more = mutate_bytes(data, rng)
                what += f", then {more}"
        path = tmp / f"trace{i}.json"
        path.write_bytes(data)
        yield path, "trace", what, good


def snapshot_cases(tmp: Path, rng: random.Random, n: int) -> Iterator[tuple[Path, str, str, Path]]:
    snap = small_snapshot()
    for i in range(n):
        if rng.random() < 0.3:
            data, what = mutate_bytes(pickle.dumps(snap), rng)
        else:
            changed, what = mutate_value(snap, rng, deep=NEST_MARK)
            data = pickle_bytes(changed)
        path = tmp / f"snap{i}.pickle"
        path.write_bytes(data)
        yield path, "snapshot", what, path


def tlprof_cases(tmp: Path, rng: random.Random, n: int) -> Iterator[tuple[Path, str, str, Path]]:
    seeds = tlprof_seeds(small_trace(), tmp)
    for i in range(n):
        seed = seeds[i % len(seeds)]
        blob = seed.read_bytes()
        path = tmp / f"saved{i}.tlprof"
        if rng.random() < 0.5:
            data, what = mutate_bytes(blob, rng)
            path.write_bytes(data)
        else:  # one member of the zip changed, the zip itself sound
            with zipfile.ZipFile(io.BytesIO(blob)) as zf:
                members = {name: zf.read(name) for name in zf.namelist()}
            name = rng.choice(sorted(members))
            if name.endswith(".json"):
                members[name], what = mutate_json_file(json.loads(members[name]), rng)
            else:
                members[name], what = mutate_bytes(members[name], rng)
            what = f"{name}: {what}"
            with zipfile.ZipFile(path, "w") as zf:
                for key, value in members.items():
                    zf.writestr(key, value)
        yield path, "tlprof", f"{seed.name}: {what}", path


def run_cases(tmp: Path, rng: random.Random, n: int) -> Iterator[tuple[Path, str, str, Path]]:
    trace = small_trace()
    good = write_run(tmp / "good-run", trace)
    files = ["manifest.json", "rank0/steps.jsonl", "rank1/step00003.pt.trace.json"]
    for i in range(n):
        folder = write_run(tmp / f"run{i}", trace)
        name = files[i % len(files)]
        target = folder / name
        if name.endswith(".jsonl"):
            lines = target.read_text().splitlines()
            at = rng.randrange(len(lines))
            if rng.random() < 0.5:
                data, what = mutate_bytes(target.read_bytes(), rng)
            else:
                changed, what = mutate_value(json.loads(lines[at]), rng)
                lines[at] = json_bytes(changed).decode()
                data, what = "\n".join(lines).encode() + b"\n", f"line {at}: {what}"
        else:
            data, what = mutate_json_file(json.loads(target.read_text()), rng)
        target.write_bytes(data)
        yield folder, "run", f"{name}: {what}", good


@pytest.mark.parametrize(("make", "n"), [(trace_cases, 120), (snapshot_cases, 120),
                                         (tlprof_cases, 90), (run_cases, 60)],
                         ids=["traces", "snapshots", "tlprof", "run-folders"])
def test_damaged_files_give_one_line_and_no_hang(tmp_path: Path, make: Any, n: int) -> None:
    rng = random.Random(f"{SEED}-{make.__name__}")
    problems = run_all(make(tmp_path, rng, n), tmp_path)
    assert not problems, _report(problems, n)
