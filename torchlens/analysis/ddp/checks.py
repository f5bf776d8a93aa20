"""The %ddp_check checklist, from the per-rank records a run left behind.

Pure functions over the run's ``DdpRun`` payload (what the launcher and the
workers recorded; its docstring gives the layout), so a saved ``.tlprof`` gives
the same checklist on a machine without torch. Each line says passed / failed /
not applicable (or warning, for a profiled run's slow rank or memory creep, or
messages dropped for a bad signature: the run works, but something is off),
the evidence, and what to do: the user
should never have to read the raw records to learn which rank did what.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from torchlens.analysis.ddp.sequence import sequence_divergence
from torchlens.analysis.ranks.slow import slow_rank
from torchlens.analysis.ranks.steps import memory_creep, rank_table
from torchlens.formats.fingerprints import describe_collective
from torchlens.formats.locations import (
    CellNames,
    is_user_file,
    label_cells_in,
    location_label,
)
from torchlens.model import DdpRun
from torchlens.model.units import format_bytes

#: ``warning``: the run works but wastes time or memory (profiled runs only).
PASSED, FAILED, NA, WARNING = "passed", "failed", "not applicable", "warning"
ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")
#: Parameters may differ by float summation order across ranks; beyond this
#: relative difference of their sums (or first values) they are out of sync.
RTOL, ATOL = 1e-5, 1e-7
MEMORY_IMBALANCE = 0.25  # 25% more tensor bytes on one rank than on another
MEMORY_MIN_BYTES = 16 << 20  # below this, imbalance is noise


@dataclass
class CheckItem:
    """One checklist line."""

    name: str
    status: str
    evidence: str
    advice: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rank_results(rec: DdpRun) -> list[dict[str, Any] | None]:
    ranks = rec.ranks or []
    return [r if isinstance(r, dict) else None for r in ranks]


def _why_silent(rec: DdpRun, silent: list[int]) -> tuple[str, str]:
    """Why ranks sent no report, and which checklist line tells more.

    A rank reports when its step ends or raises; it says nothing when the
    hang detector or an interrupt stopped it, or when it died of a signal.
    """
    codes = rec.exit_codes or []
    died = [r for r in silent if r < len(codes) and codes[r] is not None and codes[r] < 0]
    who = ", ".join(f"rank {r}" for r in silent)
    if rec.hang or rec.outcome == "hang":
        return f"{who} stopped by the hang detector before reporting", "see the hang line"
    if rec.outcome == "interrupted" or rec.interrupted:
        return f"{who} stopped by the interrupt before reporting", "run the check to its end"
    if rec.outcome == "startup_timeout":
        return f"{who} did not start in time", "see the ranks' logs in the rank table"
    if died:
        return f"{who} died before reporting", "see the crashed-worker line"
    return f"{who} sent no report", "see the crashed-worker line"


def check_environment(rec: DdpRun) -> CheckItem:
    results = _rank_results(rec)
    n = rec.world_size or len(results)
    seen = [(i, r) for i, r in enumerate(results) if r]
    silent = [i for i in range(n) if i >= len(results) or not results[i]]
    if not seen:
        why, look = _why_silent(rec, silent)
        return CheckItem("environment", NA, f"no rank reported its environment ({why})", look)
    problems: list[str] = []
    envs = {i: (r.get("env_end") or r.get("env_start") or {}) for i, r in seen}
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        values = {i: e.get(key) for i, e in envs.items()}
        if len(set(values.values())) > 1:
            problems.append(f"{key} differs: " + ", ".join(f"rank {i}={v}" for i, v in values.items()))
    for i, e in envs.items():
        if e.get("WORLD_SIZE") != str(n):
            problems.append(f"rank {i}: WORLD_SIZE={e.get('WORLD_SIZE')} but {n} ranks run")
        if e.get("RANK") != str(i):
            problems.append(f"rank {i}: RANK={e.get('RANK')}")
    # LOCAL_RANK and GPUs are per node (on one machine every rank is node None)
    node = {i: r.get("node") for i, r in seen}
    local = [(node[i], e.get("LOCAL_RANK")) for i, e in envs.items()]
    if len(set(local)) != len(local):
        problems.append("LOCAL_RANK repeats across ranks"
                        + (" of one node" if rec.nodes else "")
                        + f": {[lr for _, lr in local]}")
    devices = {i: r.get("device") for i, r in seen}
    cuda = [(node[i], d) for i, d in devices.items() if d and str(d).startswith("cuda")]
    if len(set(cuda)) != len(cuda):
        problems.append("two ranks use the same GPU: "
                        + ", ".join(f"rank {i}={d}" for i, d in devices.items()))
    versions = {i: r.get("versions", {}) for i, r in seen}
    for key in ("torch", "cuda", "nccl"):
        values = {i: v.get(key) for i, v in versions.items()}
        if len({str(v) for v in values.values()}) > 1:
            problems.append(f"{key} version differs: {values}")
    first = versions[seen[0][0]]
    evidence = (f"{len(seen)} of {n} ranks reported; devices "
                + ", ".join(f"rank {i}: {d}" for i, d in devices.items())
                + f"; torch {first.get('torch')}, CUDA {first.get('cuda') or 'none'}, "
                f"NCCL {first.get('nccl') or 'none'}")
    if problems:
        return CheckItem("environment", FAILED, "; ".join(problems) + f". ({evidence})",
                         "set the rendezvous variables once, identically on every rank "
                         "(RANK/LOCAL_RANK per rank), and give each rank its own device",
                         {"problems": problems, "silent": silent})
    if silent:  # the ranks that reported agree, but the others were never checked
        why, look = _why_silent(rec, silent)
        return CheckItem("environment", NA,
                         f"only {len(seen)} of {n} ranks reported ({why}), so the environment "
                         f"of every rank could not be compared. ({evidence})", look,
                         {"silent": silent})
    return CheckItem("environment", PASSED, evidence)


def check_communication(rec: DdpRun) -> CheckItem:
    all_results = _rank_results(rec)
    results = [r for r in all_results if r and r.get("comm")]
    if not results:
        silent = [i for i in range(rec.world_size or len(all_results))
                  if i >= len(all_results) or not all_results[i]]
        if silent:
            why, look = _why_silent(rec, silent)
            return CheckItem("communication", NA,
                             f"no rank reported its known-answer all_reduce ({why})", look)
        return CheckItem("communication", NA, "no rank got as far as the all_reduce test",
                         "see the crashed-worker line")
    wrong = []
    for r in results:
        comm = r["comm"]
        if comm.get("error") or comm.get("got") != comm.get("expected"):
            wrong.append(f"rank {r['rank']}: " + (comm.get("error") or
                         f"got {comm.get('got')}, expected {comm.get('expected')}"))
    bw = results[0]["comm"].get("bandwidth") or []
    bw_text = ", ".join(f"{format_bytes(b['bytes'])}: {b['busbw_gbps']:.3g} GB/s" for b in bw)
    if wrong:
        return CheckItem("communication", FAILED,
                         "known-answer all_reduce (each rank sends rank+1) was wrong: "
                         + "; ".join(wrong),
                         "check the network interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME) "
                         "and that every rank joined the same rendezvous")
    expected = results[0]["comm"].get("expected")
    return CheckItem("communication", PASSED,
                     f"all_reduce of rank+1 gave {expected} on every rank; bus bandwidth "
                     f"(rank 0) {bw_text or 'not measured'}", details={"bandwidth": bw})


def check_sequence(rec: DdpRun) -> CheckItem:
    seqs = rec.fingerprints or []
    if rec.profiling is not None and not rec.strict:
        return CheckItem("collective sequence", NA,
                         "not recorded with --profile: the per-op recorder is off (it costs "
                         "about 11 µs per op)", "add --strict to compare every collective "
                         "across ranks before it runs")
    if not any(seqs):
        return CheckItem("collective sequence", NA, "no collective was issued")
    div = sequence_divergence(rec.fingerprints)
    counts = ", ".join(f"rank {r}: {len(s or [])}" for r, s in enumerate(seqs))
    if div is None:
        return CheckItem("collective sequence", PASSED,
                         f"every rank issued the same collectives ({counts})")
    i = div["index"]
    lines = [f"rank {r}: {describe_collective(fp)}" for r, fp in sorted(div["fingerprints"].items())]
    ended = _ended_how(rec)
    for r in div["missing"]:
        lines.append(f"rank {r}: never issued collective #{i} ({ended.get(r, 'it stopped first')})")
    for r, skip in sorted((div.get("skips") or {}).items()):
        q, j = skip["peer"], skip["index"]
        lines.append(f"rank {r} skipped a collective: it never issued rank {q}'s "
                     f"{describe_collective(skip['fingerprint'])}; its own #{j} is rank {q}'s "
                     f"#{j + 1} (same op and tensors"
                     + (", same line)" if seqs[r][j].get("line") == seqs[q][j + 1].get("line")
                        else ")"))
    what = div["difference"]["what"] if div["difference"] else "presence"
    if div["difference"] is None and div["missing"] and rec.outcome == "finished":
        status_note = "ranks issued different numbers of collectives"
    elif div["difference"]:
        status_note = {"op": "the ranks issued different ops", "shapes": "shapes differ",
                       "dtypes": "dtypes differ"}.get(what, f"{what} differs")
    else:
        status_note = "not every rank issued it"
    return CheckItem(
        "collective sequence", FAILED,
        f"first divergence at collective #{i} ({status_note}): " + "; ".join(lines),
        "make every rank issue the same collectives in the same order with the same "
        "shapes and dtypes (look for rank-dependent branches around the lines above); "
        "--strict stops the run there instead of a gloo SIGABRT or an NCCL hang",
        {"index": i, "what": what, "missing": div["missing"], "skipped": div["skipped"],
         "skips": div.get("skips") or {},
         "ranks": sorted(div["fingerprints"]),
         "ops": {r: fp.get("op") for r, fp in div["fingerprints"].items()}})


def _ended_how(rec: DdpRun) -> dict[int, str]:
    out: dict[int, str] = {}
    for r, res in enumerate(_rank_results(rec)):
        if res and res.get("error"):
            out[r] = f"it raised {res['error'].get('type')} first"
        elif res:
            out[r] = "it finished without it"
    return out


_STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


def _user_frame_in(stack: str, cells: CellNames | None = None) -> str:
    """The innermost frame of the user's own code in a faulthandler dump, or ''.

    faulthandler writes the most recent call first; the worker's own threads
    (heartbeat) hold no user frame, so the first user frame is where the
    user's code is now.
    """
    for m in _STACK_FRAME.finditer(stack or ""):
        if is_user_file(m.group(1)):
            return f"{location_label(m.group(1), m.group(2), cells)} in {m.group(3)}"
    return ""


def check_hang(rec: DdpRun) -> CheckItem:
    hang = rec.hang
    if not hang:
        if rec.outcome == "interrupted":
            return CheckItem("hang", NA, "the run was interrupted before it could be judged")
        return CheckItem("hang", PASSED, "every rank kept making progress until it ended")
    statuses = [st or {} for st in hang.get("status") or []]
    stacks = [label_cells_in(st, rec.cells) for st in hang.get("stacks") or []]
    counts = [int(st.get("collectives") or 0) for st in statuses]
    # The rank(s) holding the others up have issued fewer collectives than
    # the rest, which wait in the one the laggards never reached. (Whether a
    # rank is *inside* a collective the heartbeat cannot say: gloo's ops
    # return at once and the wait is in Python, outside the dispatch.)
    most = max(counts, default=0)
    behind = [r for r in range(len(statuses)) if counts[r] < most]
    waiting = [r for r in range(len(statuses)) if counts[r] == most] if behind else []
    parts = []
    for r, st in enumerate(statuses):
        last = st.get("last")
        phase = st.get("phase", "?")
        where = _user_frame_in((hang.get("stacks") or [])[r] if r < len(stacks) else "",
                               rec.cells)
        at = f", now at {where}" if where else ""
        if last:
            parts.append(f"rank {r} is stuck at or after {describe_collective(last)} "
                         f"(phase {phase}){at}")
        else:
            parts.append(f"rank {r} has issued no collective (phase {phase}){at}")
    if behind and waiting:
        who = ", ".join(f"rank {r}" for r in behind)
        waits = ", ".join(f"rank {r}" for r in waiting)
        advice = (f"{who} never reached the collective that {waits} wait(s) in: look at "
                  f"where {who} is (its stack below), not at the collective; a rank-dependent "
                  "branch, loop or data loader keeps it away")
    else:
        advice = (f"every rank issued {most} collective(s): they wait in a collective their "
                  "peers do not join, or all block in their own code; compare the ranks' "
                  "lines and stacks below and the collective sequence line; rerun with --strict")
    return CheckItem(
        "hang", FAILED,
        f"no rank made progress for {hang.get('after_s', 0):.1f} s: " + "; ".join(parts),
        advice, {"stacks": stacks, "behind": behind, "waiting": waiting})


def _param_diff(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.get("sha1") == b.get("sha1"):
        return False
    if a.get("shape") != b.get("shape") or a.get("dtype") != b.get("dtype"):
        return True
    scale = max(abs(a.get("abs_sum") or 0.0), abs(b.get("abs_sum") or 0.0), 1.0)
    if abs((a.get("sum") or 0.0) - (b.get("sum") or 0.0)) > ATOL + RTOL * scale:
        return True
    return any(not math.isclose(x, y, rel_tol=RTOL, abs_tol=ATOL)
               for x, y in zip(a.get("head") or [], b.get("head") or [], strict=False))


def _modules(res: dict[str, Any], step: int) -> list[dict[str, Any]]:
    for s in res.get("steps") or []:
        if s.get("step") == step:
            return s.get("modules") or []
    return []


def check_parameter_sync(rec: DdpRun) -> CheckItem:
    results = [r for r in _rank_results(rec) if r]
    steps = sorted({s["step"] for r in results for s in r.get("steps") or [] if s.get("modules")})
    if len(results) < 2 or not steps:
        return CheckItem("parameter sync", NA,
                         "no DistributedDataParallel module was created and no nn.Module was returned",
                         "return the model from the function to have its parameters compared")
    checked = 0
    for step in steps:
        ref = _modules(results[0], step)
        for m_i, mod in enumerate(ref):
            for r in results[1:]:
                other = _modules(r, step)
                if m_i >= len(other):
                    continue
                for pa, pb in zip(mod["params"], other[m_i]["params"], strict=False):
                    checked += 1
                    if _param_diff(pa, pb):
                        return CheckItem(
                            "parameter sync", FAILED,
                            f"after step {step}, {mod['name']}: {pa['kind']} '{pa['name']}' "
                            f"{pa['dtype']}[{'x'.join(map(str, pa['shape']))}] differs: "
                            f"rank {results[0]['rank']} sum {pa['sum']:.6g} first {pa['head']}, "
                            f"rank {r['rank']} sum {pb['sum']:.6g} first {pb['head']}",
                            "ranks must update parameters only through synchronized gradients: "
                            "look for rank-dependent in-place updates, no_sync without a "
                            "final synced step, or buffers (e.g. BatchNorm stats) not broadcast",
                            {"step": step, "module": mod["name"], "parameter": pa["name"],
                             "ranks": [results[0]["rank"], r["rank"]]})
    names = sorted({m["name"] for r in results for s in steps for m in _modules(r, s)})
    return CheckItem("parameter sync", PASSED,
                     f"{checked} parameter/buffer comparisons across ranks agree "
                     f"(rtol {RTOL:g}) in {', '.join(names)} after step(s) {steps}")


def check_determinism(rec: DdpRun) -> CheckItem:
    results = [r for r in _rank_results(rec) if r]
    if rec.profiling is not None:
        return CheckItem("determinism", NA, "not run with --profile: the function is the "
                         "training loop and runs once", "run it without --profile (one step "
                         "per call) to compare two runs from the same seeds")
    if (rec.steps or 1) < 2:
        return CheckItem("determinism", NA, "needs --steps 2 or more (the same step twice)")
    done = [r for r in results if len([s for s in r.get("steps") or [] if s.get("end")]) >= 2]
    if not done:
        return CheckItem("determinism", NA, "no rank completed two steps")
    for r in done:
        op = (r.get("determinism") or {}).get("first_op")
        first, second = _modules(r, 0), _modules(r, 1)
        for ma, mb in zip(first, second, strict=False):
            for pa, pb in zip(ma["params"], mb["params"], strict=False):
                if pa.get("sha1") != pb.get("sha1"):
                    where = (f"; first op whose result differed: {op['op']} at {op['line']}"
                             if op else "")
                    return CheckItem(
                        "determinism", FAILED,
                        f"rank {r['rank']}: the same step run twice with the same seeds gave "
                        f"different {ma['name']} {pa['kind']} '{pa['name']}' (sum {pa['sum']:.6g} "
                        f"vs {pb['sum']:.6g}){where}",
                        "something outside the seeded RNGs feeds the step (time, os.urandom, "
                        "unseeded generators, data order) or an op is nondeterministic; try "
                        "torch.use_deterministic_algorithms(True)",
                        {"rank": r["rank"], "parameter": pa["name"], "op": op})
        if op and not first:
            return CheckItem("determinism", FAILED,
                             f"rank {r['rank']}: op {op['op']} at {op['line']} gave a different "
                             "result in the second run with the same seeds",
                             "see what feeds that line besides the seeded RNGs",
                             {"rank": r["rank"], "op": op})
    return CheckItem("determinism", PASSED,
                     f"two runs with the same seeds gave bit-identical results on {len(done)} rank(s)")


def check_memory(rec: DdpRun) -> CheckItem:
    peaks = rec.memory_peak or []
    if not any(p for p in peaks):
        return CheckItem("memory", NA, "no memory sample arrived")
    key = "cuda_allocated" if any((p or {}).get("cuda_allocated") for p in peaks) else "tensor_bytes"
    if key == "tensor_bytes" and not any((p or {}).get(key) is not None for p in peaks):
        key = "rss"  # --profile scans no live tensors (milliseconds per step)
    values = [(r, (p or {}).get(key) or 0) for r, p in enumerate(peaks)]
    text = "; ".join(f"rank {r}: RSS {format_bytes((peaks[r] or {}).get('rss'))}"
                     + ("" if key == "rss" else f", {key.replace('_', ' ')} {format_bytes(v)}")
                     for r, v in values)
    hi, lo = max(v for _, v in values), min(v for _, v in values)
    if hi > MEMORY_MIN_BYTES and lo < hi / (1 + MEMORY_IMBALANCE):
        worst = max(values, key=lambda x: x[1])[0]
        return CheckItem("memory", FAILED, f"peak {text}: rank {worst} holds {hi / max(lo, 1):.1f}x",
                         "rank-dependent data or model sizes: the largest rank sets the "
                         "memory limit for all", {"key": key, "peaks": peaks})
    return CheckItem("memory", PASSED, f"peak {text}", details={"key": key, "peaks": peaks})


_SIGTERM = 15
_SIGNALS = {-6: "SIGABRT", -9: "SIGKILL", -11: "SIGSEGV", -_SIGTERM: "SIGTERM"}


def check_crash(rec: DdpRun) -> CheckItem:
    results = _rank_results(rec)
    codes = rec.exit_codes or []
    ended = rec.ended_at or []
    errors = [(r, res["error"]) for r, res in enumerate(results) if res and res.get("error")]
    strict = [e for _, e in errors if e.get("type") == "CollectiveMismatch"]
    if errors and len(strict) == len(errors):
        return CheckItem("crashed worker", NA,
                         "every rank was stopped by --strict (see the collective sequence line)")
    deaths = [(r, c) for r, c in enumerate(codes)
              if c is not None and c < 0 and not (results[r] if r < len(results) else None)]
    if not errors and not deaths:
        if rec.hang:
            return CheckItem("crashed worker", PASSED,
                             "no rank raised or died before the hang detector stopped them")
        return CheckItem("crashed worker", PASSED, "no rank raised or died")
    # Every failure with its time: a rank's error carries ``t``; a rank that
    # died of a signal sent nothing, its time is when the launcher saw it end.
    failures: list[tuple[float | None, int, str]] = []
    for r, err in errors:
        failures.append((err.get("t"), r, f"rank {r} raised {err.get('type')}: "
                         f"{err.get('message')} (during {err.get('phase', 'its step')})"))
    # A launcher (torchrun's agent, ours) ends the surviving ranks with SIGTERM
    # once one fails. A rank found gone is timed by its last heartbeat, 0.2 s
    # apart, so such a rank can look earlier than the one that failed: while
    # any rank failed otherwise, a SIGTERM is a consequence and goes last.
    stopped = {r for r, c in deaths if c == -_SIGTERM} if any(
        c != -_SIGTERM for _, c in deaths) or errors else set()
    for r, c in deaths:
        sig = _SIGNALS.get(c, f"signal {-c}")
        text = (f"rank {r} was stopped by its launcher with SIGTERM" if r in stopped
                else f"rank {r} died with {sig}")
        failures.append((ended[r] if r < len(ended) else None, r, text
                         + (" (gloo aborts on mismatched shapes/dtypes)" if c == -6 else "")))
    timed = all(t is not None for t, _, _ in failures)
    if timed:
        failures.sort(key=lambda f: (f[1] in stopped, f[0], f[1]))
        t0 = rec.t0 or min(t for t, _, _ in failures)
        parts = [f"{text} at +{t - t0:.1f} s" for t, _, text in failures]
    else:
        failures.sort(key=lambda f: f[1] in stopped)
        parts = [text for _, _, text in failures]
    first = failures[0][1]
    err = dict(errors).get(first) or {}
    tb = err.get("traceback", "") or next((e.get("traceback", "") for _, e in errors), "")
    if len(failures) == 1:
        advice = "fix this rank first (traceback below)" if err else (
            "the rank was killed by a signal: see its log in the rank table")
    elif timed:
        advice = (f"rank {first} failed first; the others failed after it, usually because "
                  f"their peer went away. Fix rank {first} first"
                  + (" (traceback below)" if err else " (see its log in the rank table)"))
    else:
        advice = ("which rank failed first is not known (a rank's time is missing): fix the "
                  "error that is not about a closed connection or a timeout first")
    return CheckItem("crashed worker", FAILED, "; ".join(parts), advice,
                     {"traceback": label_cells_in(tb, rec.cells), "first": first if timed else None,
                      "ranks": [r for _, r, _ in failures]})


_SLOW_ADVICE = {
    "data": "rank {r} waits for its next batch while the others wait for it in the next "
            "all_reduce: give its DataLoader more workers or faster storage, or check whether "
            "its shard holds larger samples",
    "compute": "rank {r} does more work per step: look for unequal batch or sequence sizes, "
               "another process on its device or cores, or a slower device; its profiled "
               "steps show which ops",
    "collective": "rank {r} spends longer in its own collectives (a gather to it, a subgroup "
                  "or point-to-point call) and reaches DDP's all_reduce last: move that work "
                  "out of the step or share it",
    None: "the extra time is in no timed phase of rank {r}: open its profiled steps on the "
          "timeline to see where it goes",
}


def check_slow_rank(rec: DdpRun) -> CheckItem | None:
    """The rank the others wait for, over every step all ranks finished
    (``analysis.rank_steps``); None when the run was not profiled."""
    prof = rec.profiling
    if prof is None:
        return None
    verdict = slow_rank(prof.steps, window=None)
    evidence = verdict.words
    if prof.windows:
        evidence += (f" (the function never called torchlens.step(), so the steps are "
                     f"{prof.window_s:g} s windows)")
    if verdict.rank is None:
        return CheckItem("slow rank", PASSED if verdict.steps else NA, evidence,
                         details=asdict(verdict))
    return CheckItem("slow rank", WARNING, evidence,
                     _SLOW_ADVICE[verdict.cause].format(r=verdict.rank), asdict(verdict))


def _rank_memory_words(row: dict[str, Any]) -> str:
    if row["allocated"] is None:
        return f"rank {row['rank']}: RSS {format_bytes(row['rss'])} (peak {format_bytes(row['peak_rss'])})"
    text = (f"rank {row['rank']}{' (modelled)' if row['source'] == 'modelled' else ''}: "
            f"allocated {format_bytes(row['allocated'])} (peak {format_bytes(row['peak_allocated'])}), "
            f"reserved {format_bytes(row['reserved'])} (peak {format_bytes(row['peak_reserved'])})")
    if row["frag"] is not None:
        text += f", fragmentation {row['frag']:.0%}"
    if row["largest_free"] is not None:
        text += f", largest free block {format_bytes(row['largest_free'])}"
    return text


def check_rank_memory(rec: DdpRun) -> CheckItem | None:
    """Each rank's latest and peak memory and fragmentation, and any creep;
    None when the run was not profiled."""
    prof = rec.profiling
    if prof is None:
        return None
    table = rank_table(prof.steps, prof.summaries)
    parts = [_rank_memory_words(row) for row in table if row["source"] is not None]
    if not parts:
        return CheckItem("rank memory", NA, "no rank reported its memory")
    creep = memory_creep(prof.steps, prof.summaries)
    details = {"ranks": table, "creep": [asdict(c) for c in creep]}
    if not creep:
        return CheckItem("rank memory", PASSED, "; ".join(parts), details=details)
    return CheckItem("rank memory", WARNING,
                     "; ".join(c.words for c in creep) + ". Latest: " + "; ".join(parts),
                     "memory that grows every step after warm-up is something kept across "
                     "steps: a loss or output appended to a list without .item() or "
                     ".detach(), a growing cache, retain_graph=True; %%gpumem on a few steps "
                     "names the allocation sites that stay alive", details)


def check_signatures(rec: DdpRun) -> CheckItem | None:
    """Messages dropped for a bad signature; None when there were none (the usual case)."""
    dropped = {k: v for k, v in (rec.dropped or {}).items() if v}
    if not dropped:
        return None
    total = sum(dropped.values())
    kinds = ", ".join(f"{v} {k}" for k, v in sorted(dropped.items()))
    port = f" port {rec.port}" if rec.port else " port"
    return CheckItem(
        "signed messages", WARNING,
        f"{total} message{'s' if total != 1 else ''} with a bad signature "
        f"{'were' if total != 1 else 'was'} dropped ({kinds}): something other than this "
        f"run's ranks wrote to its store{port}",
        "the results above come only from this run's ranks; the writer was a leftover rank "
        "of an earlier run or another process that can reach the port: look for stray "
        "python processes on this machine (docs/SECURITY.md)", {"dropped": dropped})


CHECKS = (check_environment, check_communication, check_sequence, check_hang,
          check_parameter_sync, check_determinism, check_memory, check_slow_rank,
          check_rank_memory, check_crash, check_signatures)


def checklist(rec: DdpRun) -> list[CheckItem]:
    """Every check, in the order the user reads them; the profiled-run lines
    only when the run was profiled. On a multi-node run each rank a line names
    is named with its node and host (the first time in each text)."""
    items = [item for check in CHECKS if (item := check(rec)) is not None]
    if rec.nodes:
        for item in items:
            item.evidence, item.advice = _with_nodes(item.evidence, rec), _with_nodes(item.advice, rec)
    return items


_RANK = re.compile(r"\brank (\d+)\b(?! \(node)")


def _with_nodes(text: str, rec: DdpRun) -> str:
    """``rank 3`` -> ``rank 3 (node 1, host X)``, once per rank in ``text``."""
    named: set[str] = set()

    def sub(m: re.Match[str]) -> str:
        if m.group(1) in named:
            return m.group(0)
        named.add(m.group(1))
        return rec.where(int(m.group(1)))

    return _RANK.sub(sub, text)


def summary(items: list[CheckItem], rec: DdpRun) -> str:
    """One line: ranks, backend, how many checks passed, which failed and
    which warn."""
    failed = [i.name for i in items if i.status == FAILED]
    passed = sum(i.status == PASSED for i in items)
    text = (f"ddp_check: {rec.world_size} ranks ({rec.backend}), "
            f"{rec.outcome}, {passed} passed, {len(failed)} failed")
    warned = [i.name for i in items if i.status == WARNING]
    return (text + (f": {', '.join(failed)}" if failed else "")
            + (f"; warning: {', '.join(warned)}" if warned else ""))
