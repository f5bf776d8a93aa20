"""Sanitizer fuzz run of the two C readers: the trace scanner and the snapshot reader.

Compiles ``torchlens/formats/kineto/scan.c`` and
``torchlens/formats/snapshot_columns/read.c`` each with a small C driver
(``-O1 -g -fsanitize=address,undefined``) into executables in a temp folder.
A driver reads one input file, calls the reader's entry points the way its
``native.py`` does (every column read to its full length, every string span
checked to lie inside the input, everything freed) and exits 0. The corpus is
built from the shared traces and snapshots (``--data``, default
``../shared/testdata``) cut down to small files, plus small files made here;
each execution runs one mutation of one corpus file (byte flips, truncations,
inserted brackets / quotes / digits, duplicated spans, huge numbers, deep
nesting) drawn from ``--seed``, under ``ASAN_OPTIONS=abort_on_error=1:
detect_leaks=1`` and ``UBSAN_OPTIONS=halt_on_error=1``. A driver that exits
non-zero, or runs past ``--limit`` seconds, is a crash: its input is saved
under ``--out``. Prints executions, corpus size, crashes and wall time; exits 1
on a crash. Without gcc (or its sanitizer runtimes) it says so, prints
"skipped" and exits 0.

    .venv/bin/python benchmarks/fuzz_readers.py --seconds 300 --seed 1 --out DIR
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCAN_C = REPO / "torchlens" / "formats" / "kineto" / "scan.c"
READ_C = REPO / "torchlens" / "formats" / "snapshot_columns" / "read.c"
CFLAGS = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
ENV = {"ASAN_OPTIONS": "abort_on_error=1:detect_leaks=1:symbolize=1",
       "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}

# The drivers include the reader's source, so they may use its column counts.
_COMMON = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static volatile unsigned long long sink;
static const char *g_buf; static long long g_size;
static void touch(const void *p, long long nbytes) {
    const unsigned char *b = p;
    for (long long i = 0; i < nbytes; i++) sink += b[i];
}
static void span(long long off, long long len, const char *what) {
    if (off < 0 || len < 0 || off > g_size || len > g_size - off) {
        fprintf(stderr, "fuzz driver: %s span [%lld, +%lld) outside the %lld-byte input\n",
                what, off, len, g_size);
        abort();
    }
}
static char *slurp(const char *path, long long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(3); }
    fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);  /* NUL-ended, as a Python bytes is */
    if (n && fread(buf, 1, (size_t)n, f) != (size_t)n) { perror(path); exit(3); }
    buf[n] = 0; fclose(f); *size = n; return buf;
}
"""

SCAN_DRIVER = r"""
#include "@SRC@"
@COMMON@
int main(int argc, char **argv) {
    long long n; char *buf = slurp(argv[1], &n); g_buf = buf; g_size = n;
    Scan *s = tl_scan(buf, n);
    if (s) {
        if (tl_status(s) == 0 && tl_rows(s) > 0) {
            long long rows = tl_rows(s);
            int n_top = tl_top_count(s);
            int64_t *top = tl_top(s);
            for (int i = 0; i < n_top; i++) {
                span(top[4 * i], top[4 * i + 1], "top key");
                span(top[4 * i + 2], top[4 * i + 3], "top value");
            }
            for (int k = 0; k < N_TEXT; k++) {
                long long count = tl_text_count(s, k);
                if (!count) continue;
                int32_t *codes = tl_text(s, k);
                for (long long r = 0; r < rows; r++)
                    if (codes[r] < -1 || codes[r] >= count) {
                        fprintf(stderr, "fuzz driver: text code %d of %lld\n", codes[r], count);
                        abort();
                    }
                int64_t *off = tl_text_off(s, k), *len = tl_text_len(s, k);
                char *tag = tl_text_tag(s, k);
                for (long long c = 0; c < count; c++) { span(off[c], len[c], "text key"); sink += tag[c]; }
            }
            for (int k = 0; k < N_INT; k++)
                if (tl_int_any(s, k)) { touch(tl_int(s, k), rows * 8); touch(tl_int_has(s, k), rows); }
            for (int k = 0; k < N_FLOAT; k++)
                if (tl_float_any(s, k)) { touch(tl_float(s, k), rows * 8); touch(tl_float_has(s, k), rows); }
            sink += tl_events_start(s) + tl_events_end(s);
        }
        tl_free(s);
    }
    free(buf);
    return 0;
}
"""

READ_DRIVER = r"""
#include "@SRC@"
@COMMON@
static void value(void *h, int32_t k, int depth) {
    if (depth > 50) return;
    int t = sr_node_type(h, k);
    if (t == 4) { span((long long)sr_node_u(h, k), sr_node_len(h, k), "string node"); return; }
    if (t < 5) { sink += sr_node_u(h, k) + sr_node_flags(h, k); return; }
    for (int64_t i = 0; i < sr_node_len(h, k); i++) value(h, sr_node_item(h, k, i), depth + 1);
}
static const int SIZE[] = {4, 1, 8, 8, 8, 4, 8, 8, 4, 4, 4, 4, 8, 8, 1, 4,
                           8, 8, 8, 8, 8, 1, 4, 4};
static const int WHICH[] = {0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                            3, 3, 3, 3, 3, 3, 4, 5};
int main(int argc, char **argv) {
    long long n; char *buf = slurp(argv[1], &n); g_buf = buf; g_size = n;
    void *h = n ? sr_read((const uint8_t *)buf, n) : NULL;
    if (h) {
        sink += sr_status(h) + strlen(sr_error(h));
        if (sr_status(h) == 0) {
            int32_t top = sr_top(h);
            sink += sr_get(h, top, "torchlens_record");
            const char *keys[] = {"allocator_settings", "external_annotations"};
            for (int i = 0; i < 2; i++) {
                int32_t k = sr_get(h, top, keys[i]);
                if (k >= 0) value(h, k, 0);
            }
            int32_t traces = sr_get(h, top, "device_traces");
            if (traces >= 0 && sr_node_type(h, traces) == 5) sink += sr_node_len(h, traces);
            sr_free_tree(h);
            int64_t counts[6];
            for (int i = 0; i < 6; i++) counts[i] = sr_count(h, i);
            for (int k = 0; k < 24; k++) {
                int64_t m = counts[WHICH[k]] + (k == 22);
                if (m) touch(sr_column(h, k), m * SIZE[k]);
            }
            int64_t *fo = sr_column(h, 16), *fl = sr_column(h, 17);
            int64_t *no = sr_column(h, 18), *nl = sr_column(h, 19);
            int8_t *has = sr_column(h, 21);
            for (int64_t i = 0; i < counts[3]; i++) {
                if (has[i] & 1) span(fo[i], fl[i], "frame file");
                if (has[i] & 2) span(no[i], nl[i], "frame name");
            }
            int64_t ne = counts[0], nb = counts[2];
            int8_t *kind = malloc(ne + 1); int32_t *partner = malloc((ne + 1) * 4);
            int8_t *touched = malloc(nb + 1);
            sink += sr_pair(ne, sr_column(h, 1), sr_column(h, 2), kind, partner, nb,
                            sr_column(h, 12), touched);
            free(kind); free(partner); free(touched);
        }
        sr_free(h);
    }
    free(buf);
    return 0;
}
"""


def build(folder: Path) -> dict[str, Path] | str:
    """The two driver executables, or why they could not be built."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return "no gcc on this machine"
    out = {}
    for name, src, template in (("scan", SCAN_C, SCAN_DRIVER), ("snapshot", READ_C, READ_DRIVER)):
        c = folder / f"drive_{name}.c"
        c.write_text(template.replace("@SRC@", str(src)).replace("@COMMON@", _COMMON))
        exe = folder / f"drive_{name}"
        done = subprocess.run([gcc, *CFLAGS, "-o", str(exe), str(c), "-lm"],
                              capture_output=True, text=True)
        if done.returncode:
            return f"gcc could not build the {name} driver with sanitizers: {done.stderr[-600:]}"
        probe = subprocess.run([str(exe), str(c)], capture_output=True, env={**os.environ, **ENV})
        if probe.returncode:
            return f"the {name} driver does not run: {probe.stderr[-600:]!r}"
        out[name] = exe
    return out


# ------------------------------------------------------------------ corpus
def _small_trace() -> bytes:
    ev = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
          {"ph": "M", "name": "thread_name", "pid": 1, "tid": "7", "args": {"name": "main"}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 7, "ts": 1.5,
           "dur": 3, "args": {"External id": 4, "Input Dims": [[2, 3], []],
                              "Input type": ["float", "Scalar"], "Sequence number": 1}},
          {"ph": "X", "cat": "kernel", "name": "void k<float>(\\u00e9\")", "pid": 0,
           "tid": "stream 7", "ts": 9.25, "dur": 1.0,
           "args": {"correlation": 12, "device": 0, "stream": 7, "external id": 4}},
          {"ph": "s", "id": 12, "pid": 1, "tid": 7, "ts": 2, "cat": "ac2g", "name": "ac2g"},
          {"ph": "f", "id": 12, "pid": 0, "tid": 7, "ts": 9.25, "bp": "e", "cat": "ac2g",
           "name": "ac2g"},
          {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 7, "ts": 3,
           "args": {"Addr": 1234, "Bytes": 512, "Total Allocated": 512,
                    "Total Reserved": 2048, "Device Type": 1, "Device Id": 0}},
          {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 1, "tid": 7,
           "ts": 4, "dur": 2e3, "args": {"Collective name": "allreduce", "dtype": "Float",
                                         "In msg nelems": 100, "Out msg nelems": 100,
                                         "Group size": 2, "Process Group Name": "0",
                                         "Process Group Ranks": [0, 1]}}]
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "X"}],
           "distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": ev,
           "traceName": "t", "displayTimeUnit": "ms", "baseTimeNanoseconds": 17}
    return json.dumps(doc).encode()


def _small_snapshot() -> dict:
    frames = [{"filename": "train.py", "line": 3, "name": "step"},
              {"filename": "é.py", "line": 10**12, "name": "f"}]
    blocks = [{"address": 1 << 40, "size": 512, "requested_size": 500,
               "state": "active_allocated", "frames": frames},
              {"address": (1 << 40) + 512, "size": 1536, "state": "inactive", "frames": []}]
    seg = {"device": 0, "address": 1 << 40, "total_size": 2048, "allocated_size": 512,
           "active_size": 512, "requested_size": 500, "stream": 0, "segment_type": "small",
           "segment_pool_id": (0, 0), "is_expandable": False, "blocks": blocks}
    trace = [{"action": a, "addr": 1 << 40, "size": 512, "stream": 0, "time_us": t,
              "frames": frames[:i]} for i, (a, t) in enumerate(
                  [("segment_alloc", 1), ("alloc", 2), ("free_requested", 3),
                   ("free_completed", 4), ("alloc", 5), ("snapshot", 6)])]
    return {"segments": [seg], "device_traces": [trace, []],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                   "roundup": [1, 2.5, None, True]},
            "external_annotations": [{"stage": "fwd", "time_us": 3}]}


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> None:  # type: ignore[override]
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def _cut(obj, keep: int, depth: int = 0):
    """obj with every list beyond the top shortened to ``keep`` items."""
    if isinstance(obj, dict):
        return {k: _cut(v, keep, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_cut(v, keep, depth + 1) for v in obj[:keep if depth else None]]
    return obj


def corpus(data: Path | None, limit: int) -> list[tuple[str, str, bytes]]:
    """(reader, name, bytes) seeds: generated files, then cut-down shared ones."""
    seeds = [("scan", "generated_trace.json", _small_trace()),
             ("scan", "generated_trace_empty.json", b'{"traceEvents": []}')]
    snap = _small_snapshot()
    for proto in (2, 4, 5):
        seeds.append(("snapshot", f"generated_snapshot_p{proto}.pickle",
                      pickle.dumps(snap, protocol=proto)))
    if data is None:
        return seeds
    for path in sorted((data / "traces").glob("*.json.gz")):
        raw = gzip.decompress(path.read_bytes())
        if len(raw) <= limit:
            seeds.append(("scan", path.name, raw))
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
            events = doc["traceEvents"]
            meta = [e for e in events if isinstance(e, dict) and e.get("ph") == "M"][:40]
            rest = [e for e in events if not (isinstance(e, dict) and e.get("ph") == "M")]
            doc["traceEvents"] = meta + rest[:: max(1, len(rest) // 150)][:150]
            seeds.append(("scan", f"cut_{path.name}", json.dumps(doc).encode()))
    for path in sorted((data / "snapshots").glob("*.pickle")):
        raw = path.read_bytes()
        if len(raw) <= limit:
            seeds.append(("snapshot", path.name, raw))
        try:
            obj = _NoGlobals(gzip.open(path) if raw[:2] == b"\x1f\x8b" else
                             __import__("io").BytesIO(raw)).load()
        except Exception:  # a file the plain unpickler refuses is kept whole above or not at all
            continue
        for keep in (2, 12):
            seeds.append(("snapshot", f"cut{keep}_{path.name}",
                          pickle.dumps(_cut(obj, keep), protocol=4)))
    return seeds


# ------------------------------------------------------------------ mutations
_INSERTS = [b"[", b"]", b"{", b"}", b'"', b"\\", b",", b":", b"0", b"-", b"9" * 30, b"1e999",
            b"-0", b".", b"\\u", b"\\ud800", b"\x00", b"\xff", b"null", b"true", b"NaN"]
_HUGE = [b"9" * 400, b"18446744073709551616", b"-9223372036854775809", b"1e-400",
         b"4294967296", b"2147483648", b"-1", b"\xff\xff\xff\xff\xff\xff\xff\x7f",
         b"\x00\x00\x00\x80", b"\xff\xff\xff\xff"]


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One to four mutations of data, and their names."""
    buf = bytearray(data)
    done = []
    for _ in range(rng.choice((1, 1, 1, 2, 3, 4))):
        n = len(buf)
        at = rng.randrange(n + 1) if n else 0
        op = rng.choice(("flip", "byte", "truncate", "insert", "dup", "huge", "nest", "delete",
                         "digit"))
        if op == "flip" and n:
            i = rng.randrange(n)
            buf[i] ^= 1 << rng.randrange(8)
        elif op == "byte" and n:
            buf[rng.randrange(n)] = rng.randrange(256)
        elif op == "truncate":
            del buf[at:]
        elif op == "insert":
            buf[at:at] = rng.choice(_INSERTS)
        elif op == "dup" and n:
            a = rng.randrange(n)
            b = min(n, a + rng.randrange(1, 4096))
            buf[at:at] = buf[a:b] * rng.choice((1, 2, 8))
        elif op == "huge":
            buf[at:at + rng.randrange(0, 9)] = rng.choice(_HUGE)
        elif op == "nest":
            depth = rng.choice((64, 1000, 20000))
            pair = rng.choice(((b"[", b"]"), (b"{\"a\":", b"}"), (b"(", b")"), (b"]", b"")))
            buf[at:at] = pair[0] * depth + b"1" + pair[1] * depth
        elif op == "delete" and n:
            del buf[at:at + rng.randrange(1, 64)]
        elif op == "digit" and n:
            digits = [i for i in range(max(0, at - 256), min(n, at + 256))
                      if 48 <= buf[i] <= 57]
            if digits:
                i = rng.choice(digits)
                buf[i:i + 1] = str(rng.randrange(10)).encode() * rng.randrange(1, 24)
        done.append(op)
    return bytes(buf), "+".join(done)


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tl-fuzz-") as tmp:
        folder = Path(tmp)
        drivers = build(folder)
        if isinstance(drivers, str):
            print(f"fuzz_readers: {drivers}: skipped")
            return 0
        data = Path(args.data) if args.data else REPO.parent / "shared" / "testdata"
        seeds = corpus(data if data.is_dir() else None, args.seed_limit)
        env = {**os.environ, **ENV}
        rng = random.Random(args.seed)
        execs = {"scan": 0, "snapshot": 0}
        crashes = []
        case = folder / "case"
        i = 0
        while time.monotonic() - start < args.seconds:
            reader, name, raw = seeds[i] if i < len(seeds) else rng.choice(seeds)
            body, how = (raw, "as is") if i < len(seeds) else mutate(raw, rng)
            i += 1
            case.write_bytes(body)
            try:
                done = subprocess.run([str(drivers[reader]), str(case)], capture_output=True,
                                      env=env, timeout=args.limit)
                rc, err = done.returncode, done.stderr.decode("utf-8", "replace")
            except subprocess.TimeoutExpired:
                rc, err = "hang", f"still running after {args.limit} s"
            execs[reader] += 1
            if rc != 0:
                saved = out / f"crash_{reader}_{len(crashes):03d}_{name}"
                saved.write_bytes(body)
                saved.with_suffix(saved.suffix + ".txt").write_text(
                    f"seed {name}, mutation {how}, exit {rc}\n{err}")
                crashes.append(saved)
                summary = next((ln for ln in err.splitlines()
                                if "ERROR" in ln or "runtime error" in ln or "fuzz driver" in ln),
                               err.strip().splitlines()[-1] if err.strip() else "")
                print(f"CRASH {reader} {name} ({how}) exit {rc}: {summary}", flush=True)
        wall = time.monotonic() - start
    print(f"executions: {sum(execs.values())} (scanner {execs['scan']}, snapshot reader "
          f"{execs['snapshot']}); corpus: {len(seeds)} files; crashes: {len(crashes)}"
          f"{' saved under ' + str(out) if crashes else ''}; wall {wall:.1f} s; seed {args.seed}")
    return 1 if crashes else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long to run (default 60)")
    p.add_argument("--seed", type=int, default=0, help="the mutations' random seed")
    p.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "tl-fuzz-out"),
                   help="where crashing inputs are saved")
    p.add_argument("--data", default=None,
                   help="folder with traces/ and snapshots/ (default ../shared/testdata)")
    p.add_argument("--seed-limit", type=int, default=400_000,
                   help="shared files up to this many bytes join the corpus whole")
    p.add_argument("--limit", type=float, default=20.0,
                   help="seconds one execution may take before it counts as a hang")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
