"""The %ddp_check checklist, from the per-rank records a run left behind.

Pure functions over the run's ``DdpRun`` payload (what the launcher and the
workers recorded; its docstring gives the layout), so a saved ``.tlprof`` gives
the same checklist on a machine without torch. Each line says passed / failed /
not applicable (or warning, for a profiled run's slow rank or memory creep, or
messages dropped for a bad signature: the run works, but something is off),
the evidence, and what to do: the user
should never have to read the raw records to learn which rank did what.

Each line is a ``Finding`` titled with its check (``status``, ``evidence`` and
``name`` are its severity, sentence and title). How the ranks ended (hang,
crashes, silent ranks) is ``analysis.ddp.failures``; a profiled run's lines
(slow rank, rank memory) are ``analysis.ddp.profiled``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from torchlens.analysis.ddp.failures import (
    check_crash,
    check_hang,
    check_oom,
    ended_how,
    rank_results,
    why_silent,
)
from torchlens.analysis.ddp.fsdp import (
    layout_text,
    memory_text,
    shard_relation,
    sharded_text,
)
from torchlens.analysis.ddp.profiled import check_rank_memory, check_slow_rank
from torchlens.analysis.ddp.sequence import sequence_divergence
from torchlens.analysis.ranks.slow import creep_leads
from torchlens.formats.fingerprints import describe_collective
from torchlens.model import DdpRun
from torchlens.model.checksums import ModuleChecksums, ParamChecksum
from torchlens.model.findings import FAILED, NA, PASSED, SLOW_RANK, WARNING, Finding
from torchlens.model.messages import MemoryReading
from torchlens.model.rank_report import RankReport
from torchlens.model.units import format_bytes, format_gbps

ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")
#: Parameters may differ by float summation order across ranks; beyond this
#: relative difference of their sums (or first values) they are out of sync.
RTOL, ATOL = 1e-5, 1e-7
MEMORY_IMBALANCE = 0.25  # 25% more tensor bytes on one rank than on another
MEMORY_MIN_BYTES = 16 << 20  # below this, imbalance is noise


def shared_gpus(seen: list[tuple[int, RankReport]], node: dict[int, Any],
                ) -> tuple[list[tuple[list[int], str]], list[int]]:
    """(ranks that share one GPU, and how it was told), ranks compared without a UUID.

    A GPU is its UUID (``device_uuid`` in the rank's report): the device name
    is not, since with per-rank ``CUDA_VISIBLE_DEVICES`` every rank's GPU is
    ``cuda:0``. Without a UUID (a report from before it was recorded, or a
    torch whose device properties lack it) the host and device name stand in.
    """
    groups: dict[tuple[Any, ...], list[int]] = {}
    unnamed = []
    for i, r in seen:
        device = r.device
        if not device or not device.startswith("cuda"):
            continue
        if r.device_uuid:
            key: tuple[Any, ...] = ("uuid", r.device_uuid)
        else:
            unnamed.append(i)
            key = ("name", device, r.hostname, node.get(i))
        groups.setdefault(key, []).append(i)
    shared = [(ranks, f"UUID {key[1]}" if key[0] == "uuid" else
               key[1] + (f" on {key[2]}" if key[2] else "") + ", no UUID reported")
              for key, ranks in groups.items() if len(ranks) > 1]
    return shared, unnamed


def check_environment(rec: DdpRun) -> Finding:
    results = rank_results(rec)
    n = rec.world_size or len(results)
    seen = [(i, r) for i, r in enumerate(results) if r is not None]
    silent = [i for i in range(n) if i >= len(results) or results[i] is None]
    if not seen:
        why, look = why_silent(rec, silent)
        return Finding(NA, f"no rank reported its environment ({why})", advice=look,
                       title="environment")
    problems: list[str] = []
    envs = {i: r.env() for i, r in seen}
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
    node = {i: r.node for i, r in seen}
    local = [(node[i], e.get("LOCAL_RANK")) for i, e in envs.items()]
    if len(set(local)) != len(local):
        problems.append("LOCAL_RANK repeats across ranks"
                        + (" of one node" if rec.nodes else "")
                        + f": {[lr for _, lr in local]}")
    devices = {i: r.device for i, r in seen}
    shared, unnamed = shared_gpus(seen, node)
    for ranks, what in shared:
        problems.append(f"ranks {', '.join(map(str, ranks))} use the same GPU ({what}): "
                        + ", ".join(f"rank {i}={devices[i]}" for i in ranks))
    versions = {i: r.versions for i, r in seen}
    for key in ("torch", "cuda", "nccl"):
        values = {i: v.get(key) for i, v in versions.items()}
        if len({str(v) for v in values.values()}) > 1:
            problems.append(f"{key} version differs: {values}")
    first = versions[seen[0][0]]
    evidence = (f"{len(seen)} of {n} ranks reported; devices "
                + ", ".join(f"rank {i}: {d}" for i, d in devices.items())
                + f"; torch {first.get('torch')}, CUDA {first.get('cuda') or 'none'}, "
                f"NCCL {first.get('nccl') or 'none'}")
    if unnamed:
        evidence += (f"; rank(s) {', '.join(map(str, unnamed))} reported no GPU UUID, so "
                     "their GPUs were compared by host and device name (under per-rank "
                     "CUDA_VISIBLE_DEVICES two different GPUs can both be cuda:0)")
    if problems:
        return Finding(FAILED, "; ".join(problems) + f". ({evidence})",
                       advice="set the rendezvous variables once, identically on every rank "
                              "(RANK/LOCAL_RANK per rank), and give each rank its own device",
                       title="environment", details={"problems": problems, "silent": silent})
    if silent:  # the ranks that reported agree, but the others were never checked
        why, look = why_silent(rec, silent)
        return Finding(NA,
                       f"only {len(seen)} of {n} ranks reported ({why}), so the environment "
                       f"of every rank could not be compared. ({evidence})", advice=look,
                       title="environment", details={"silent": silent})
    return Finding(PASSED, evidence, title="environment")


def check_communication(rec: DdpRun) -> Finding:
    all_results = rank_results(rec)
    results = [(r, r.comm) for r in all_results if r is not None and r.comm is not None]
    if not results:
        silent = [i for i in range(rec.world_size or len(all_results))
                  if i >= len(all_results) or all_results[i] is None]
        if silent:
            why, look = why_silent(rec, silent)
            return Finding(NA, f"no rank reported its known-answer all_reduce ({why})",
                           advice=look, title="communication")
        return Finding(NA, "no rank got as far as the all_reduce test",
                       advice="see the crashed-worker line", title="communication")
    wrong = []
    for r, comm in results:
        if comm.error or comm.got != comm.expected:
            wrong.append(f"rank {r.rank}: " + (comm.error or
                         f"got {comm.got}, expected {comm.expected}"))
    bw = results[0][1].bandwidth
    bw_text = ", ".join(f"{format_bytes(b.bytes)}: {format_gbps(b.busbw_gbps)}" for b in bw)
    if wrong:
        return Finding(FAILED,
                       "known-answer all_reduce (each rank sends rank+1) was wrong: "
                       + "; ".join(wrong),
                       advice="check the network interface (GLOO_SOCKET_IFNAME / "
                              "NCCL_SOCKET_IFNAME) and that every rank joined the same rendezvous",
                       title="communication")
    expected = results[0][1].expected
    return Finding(PASSED,
                   f"all_reduce of rank+1 gave {expected} on every rank; bus bandwidth "
                   f"(rank 0) {bw_text or 'not measured'}", title="communication",
                   details={"bandwidth": msgspec.to_builtins(bw)})


def check_sequence(rec: DdpRun) -> Finding:
    seqs = rec.fingerprints or []
    if rec.profiling is not None and not rec.strict:
        return Finding(NA,
                       "not recorded with --profile: the per-op recorder is off (it costs "
                       "about 11 µs per op)",
                       advice="add --strict to compare every collective "
                              "across ranks before it runs", title="collective sequence")
    if not any(seqs):
        return Finding(NA, "no collective was issued", title="collective sequence")
    div = sequence_divergence(rec.fingerprints)
    counts = ", ".join(f"rank {r}: {len(s or [])}" for r, s in enumerate(seqs))
    if div is None:
        return Finding(PASSED, f"every rank issued the same collectives ({counts})",
                       title="collective sequence")
    i = div.index
    lines = [f"rank {r}: {describe_collective(fp)}" for r, fp in sorted(div.fingerprints.items())]
    ended = ended_how(rec)
    crashed = _crashed(rec)
    if (div.difference is None and div.missing and not div.skips
            and all(r in crashed for r in div.missing)):
        # the sequences agree as far as every rank got: a rank that stopped
        # in an exception says nothing about rank-dependent branches
        gone = "; ".join(f"rank {r} stopped before collective #{i} "
                         f"({ended.get(r, 'it died first')})" for r in div.missing)
        return Finding(NA, f"not judged past collective #{i} ({'; '.join(lines)}): {gone}; up "
                       f"to there every rank issued the same collectives ({counts})",
                       advice="see the crashed-worker line", title="collective sequence",
                       details={"index": i, "missing": div.missing, "crashed": crashed})
    for r in div.missing:
        lines.append(f"rank {r}: never issued collective #{i} ({ended.get(r, 'it stopped first')})")
    for r, skip in sorted(div.skips.items()):
        q, j = skip.peer, skip.index
        lines.append(f"rank {r} skipped a collective: it never issued rank {q}'s "
                     f"{describe_collective(skip.fingerprint)}; its own #{j} is rank {q}'s "
                     f"#{j + 1} (same op and tensors"
                     + (", same line)" if seqs[r][j].line == seqs[q][j + 1].line
                        else ")"))
    what = div.difference.what if div.difference else "presence"
    if div.difference is None and div.missing and rec.outcome == "finished":
        status_note = "ranks issued different numbers of collectives"
    elif div.difference:
        status_note = {"op": "the ranks issued different ops", "shapes": "shapes differ",
                       "dtypes": "dtypes differ",
                       "module": "the ranks moved different FSDP modules"}.get(
                           what, f"{what} differs")
    else:
        status_note = "not every rank issued it"
    return Finding(FAILED,
                   f"first divergence at collective #{i} ({status_note}): " + "; ".join(lines),
                   advice="make every rank issue the same collectives in the same order with "
                          "the same shapes and dtypes (look for rank-dependent branches around "
                          "the lines above); --strict stops the run there instead of a gloo "
                          "SIGABRT or an NCCL hang",
                   title="collective sequence",
                   details={"index": i, "what": what, "missing": div.missing,
                            "skipped": div.skipped,
                            "skips": {r: {"peer": s.peer, "index": s.index,
                                          "fingerprint": msgspec.to_builtins(s.fingerprint)}
                                      for r, s in div.skips.items()},
                            "ranks": sorted(div.fingerprints),
                            "ops": {r: fp.op for r, fp in div.fingerprints.items()}})


def _crashed(rec: DdpRun) -> list[int]:
    """Ranks that raised, or died of a signal without a report."""
    results = rank_results(rec)
    codes = rec.exit_codes or []
    return [r for r in range(max(len(results), len(codes)))
            if (r < len(results) and (res := results[r]) is not None and res.error is not None)
            or (r < len(codes) and codes[r] is not None and codes[r] < 0
                and not (r < len(results) and results[r] is not None))]


def _cut_short(rec: DdpRun) -> str:
    """``rank 1 raised, then rank 0``: the ranks that stopped in their step,
    the first to raise first ('' when none did)."""
    crashed = _crashed(rec)
    if not crashed:
        return ""
    results = rank_results(rec)

    errors = {r: res.error if r < len(results) and (res := results[r]) is not None else None
              for r in crashed}
    at = {r: float(e.t) if e is not None and e.t is not None else float("inf")
          for r, e in errors.items()}
    first, *rest = sorted(crashed, key=lambda r: (at[r], r))
    said = errors[first]
    how = ("was stopped by --strict" if said is not None and said.type == "CollectiveMismatch" else
           "raised" if at[first] != float("inf") else "stopped")
    then = (f", then {'rank' if len(rest) == 1 else 'ranks'} {', '.join(map(str, rest))}"
            if rest else "")
    return f"rank {first} {how}{then}"


def _param_diff(a: ParamChecksum, b: ParamChecksum) -> bool:
    if a.sha1 == b.sha1:
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return True
    scale = max(abs(a.abs_sum), abs(b.abs_sum), 1.0)
    if abs(a.sum - b.sum) > ATOL + RTOL * scale:
        return True
    return any(not math.isclose(x, y, rel_tol=RTOL, abs_tol=ATOL)
               for x, y in zip(a.head, b.head, strict=False))


def _modules(res: RankReport, step: int) -> list[ModuleChecksums]:
    """The modules ``res``'s rank checksummed after ``step``."""
    return next((s.modules for s in res.steps if s.step == step), [])


def check_parameter_sync(rec: DdpRun) -> Finding:
    results = [r for r in rank_results(rec) if r is not None]
    steps = sorted({s.step for r in results for s in r.steps if s.modules})
    cut = _cut_short(rec)
    if cut and (len(results) < 2 or not steps):
        # modules are checksummed when a step returns: a rank that raised or
        # died never got there, whatever it had built
        return Finding(NA, f"not compared: {cut} before the step returned, and parameters are "
                       "checksummed only when it returns", advice="see the crashed-worker line",
                       title="parameter sync")
    limit = max((s.step_limit or 0 for r in results for s in r.steps), default=0)
    if limit and not steps:  # the function never returned: nothing to blame it for
        return Finding(NA, f"not compared: --steps {limit} stopped the loop at its step {limit}, "
                       "before the function returned its model (checksummed when it returns)",
                       advice="leave out --steps, or set it above the loop's own step count",
                       title="parameter sync")
    if len(results) < 2 or not steps:
        return Finding(NA,
                       "no DistributedDataParallel module was created and no nn.Module was returned",
                       advice="return the model from the function to have its parameters compared",
                       title="parameter sync")
    checked, sharded = 0, {}
    for step in steps:
        ref = _modules(results[0], step)
        for m_i, mod in enumerate(ref):
            for r in results[1:]:
                other = _modules(r, step)
                if m_i >= len(other):
                    continue
                for pa, pb in zip(mod.params, other[m_i].params, strict=False):
                    how = shard_relation(pa, pb)
                    if how == "other shard":  # FSDP: one copy per shard, nothing to compare
                        sharded.setdefault(pa.name, pa.shard_key[1] or "")
                        continue
                    checked += 1
                    if how == "layout" or _param_diff(pa, pb):
                        return Finding(
                            FAILED,
                            f"after step {step}, {mod.name}: {pa.kind} '{pa.name}' "
                            f"{pa.dtype}[{'x'.join(map(str, pa.shape))}] differs: "
                            + (layout_text(pa, pb, results[0].rank, r.rank)
                               if how == "layout" else
                               f"rank {results[0].rank} sum {pa.sum:.6g} first "
                               f"{pa.head}, rank {r.rank} sum {pb.sum:.6g} first "
                               f"{pb.head}"),
                            advice="ranks must update parameters only through synchronized "
                                   "gradients: look for rank-dependent in-place updates, no_sync "
                                   "without a final synced step, or buffers (e.g. BatchNorm "
                                   "stats) not broadcast",
                            title="parameter sync",
                            details={"step": step, "module": mod.name, "parameter": pa.name,
                                     "ranks": [results[0].rank, r.rank]})
    if not checked and not sharded:  # one rank's modules, nobody else's to compare them with
        return Finding(NA, "not compared: only one rank checksummed its parameters"
                       + (f" ({cut} before the step returned)" if cut else ""),
                       advice="see the crashed-worker line" if cut else "",
                       title="parameter sync")
    names = sorted({m.name for r in results for s in steps for m in _modules(r, s)})
    compared = (f"{checked} parameter/buffer comparisons across ranks agree (rtol {RTOL:g})"
                if checked else "no replicated parameter or buffer to compare")
    return Finding(PASSED,
                   f"{compared} in {', '.join(names)} after step(s) {steps}"
                   + sharded_text(len(sharded), ", ".join(sorted(set(sharded.values())))),
                   title="parameter sync")


def check_determinism(rec: DdpRun) -> Finding:
    results = [r for r in rank_results(rec) if r is not None]
    if rec.profiling is not None:
        return Finding(NA,
                       "not run with --profile: the function is the "
                       "training loop and runs once",
                       advice="run it without --profile (one step "
                              "per call) to compare two runs from the same seeds",
                       title="determinism")
    if (rec.steps or 1) < 2:
        return Finding(NA, "needs --steps 2 or more (the same step twice)", title="determinism")
    done = [r for r in results if len([s for s in r.steps if s.end]) >= 2]
    if not done:
        return Finding(NA, "no rank completed two steps", title="determinism")
    for r in done:
        first_op = r.determinism.first_op if r.determinism is not None else None
        op = msgspec.to_builtins(first_op) if first_op is not None else None
        first, second = _modules(r, 0), _modules(r, 1)
        for ma, mb in zip(first, second, strict=False):
            for pa, pb in zip(ma.params, mb.params, strict=False):
                if pa.sha1 != pb.sha1:
                    where = (f"; first op whose result differed: {op['op']} at {op['line']}"
                             if op else "")
                    return Finding(
                        FAILED,
                        f"rank {r.rank}: the same step run twice with the same seeds gave "
                        f"different {ma.name} {pa.kind} '{pa.name}' "
                        f"(sum {pa.sum:.6g} vs {pb.sum:.6g}){where}",
                        advice="something outside the seeded RNGs feeds the step (time, "
                               "os.urandom, unseeded generators, data order) or an op is "
                               "nondeterministic; try torch.use_deterministic_algorithms(True)",
                        title="determinism",
                        details={"rank": r.rank, "parameter": pa.name, "op": op})
        if op and not first:
            return Finding(FAILED,
                           f"rank {r.rank}: op {op['op']} at {op['line']} gave a different "
                           "result in the second run with the same seeds",
                           advice="see what feeds that line besides the seeded RNGs",
                           title="determinism", details={"rank": r.rank, "op": op})
    return Finding(PASSED,
                   f"two runs with the same seeds gave bit-identical results on {len(done)} rank(s)",
                   title="determinism")


def check_memory(rec: DdpRun) -> Finding:
    read = [p or MemoryReading() for p in rec.memory_peak or []]
    # the readings as the details' JSON has them: a figure not read is left out
    peaks = [None if p is None else msgspec.to_builtins(p) for p in rec.memory_peak or []]
    if not any(peaks):
        return Finding(NA, "no memory sample arrived", title="memory")
    key = "cuda_allocated" if any(p.cuda_allocated for p in read) else "tensor_bytes"
    if key == "tensor_bytes" and not any(p.tensor_bytes is not None for p in read):
        key = "rss"  # --profile scans no live tensors (milliseconds per step)
    values = [(r, getattr(p, key) or 0) for r, p in enumerate(read)]
    text = "; ".join(f"rank {r}: RSS {format_bytes(read[r].rss)}"
                     + ("" if key == "rss" else f", {key.replace('_', ' ')} {format_bytes(v)}")
                     for r, v in values)
    fsdp, figures = memory_text(rank_results(rec), rec.fingerprints or [])
    fsdp_figures = {r: msgspec.to_builtins(f) for r, f in figures.items()}
    text += fsdp
    hi, lo = max(v for _, v in values), min(v for _, v in values)
    if hi > MEMORY_MIN_BYTES and lo < hi / (1 + MEMORY_IMBALANCE):
        worst = max(values, key=lambda x: x[1])[0]
        return Finding(FAILED, f"peak {text}: rank {worst} holds {hi / max(lo, 1):.1f}x",
                       advice="rank-dependent data or model sizes: the largest rank sets the "
                              "memory limit for all", title="memory",
                       details={"key": key, "peaks": peaks, "fsdp": fsdp_figures})
    return Finding(PASSED, f"peak {text}", title="memory",
                   details={"key": key, "peaks": peaks, "fsdp": fsdp_figures})


def check_signatures(rec: DdpRun) -> Finding | None:
    """Messages dropped for a bad signature; None when there were none (the usual case)."""
    dropped = {k: v for k, v in (rec.dropped or {}).items() if v}
    if not dropped:
        return None
    total = sum(dropped.values())
    kinds = ", ".join(f"{v} {k}" for k, v in sorted(dropped.items()))
    port = f" port {rec.port}" if rec.port else " port"
    return Finding(WARNING,
                   f"{total} message{'s' if total != 1 else ''} with a bad signature "
                   f"{'were' if total != 1 else 'was'} dropped ({kinds}): something other than "
                   f"this run's ranks wrote to its store{port}",
                   advice="the results above come only from this run's ranks; the writer was a "
                          "leftover rank of an earlier run or another process that can reach the "
                          "port: look for stray python processes on this machine "
                          "(docs/SECURITY.md)",
                   title="signed messages", details={"dropped": dropped})


CHECKS = (check_environment, check_communication, check_sequence, check_hang,
          check_parameter_sync, check_determinism, check_memory, check_slow_rank,
          check_rank_memory, check_crash, check_oom, check_signatures)


def checklist(rec: DdpRun) -> list[Finding]:
    """Every check, in the order the user reads them (a failed crashed-worker
    line, and its out-of-memory line, first); the profiled-run lines
    only when the run was profiled. On a multi-node run each rank a line names
    is named with its node and host (the first time in each text)."""
    items = [item for check in CHECKS if (item := check(rec)) is not None]
    crash = next((i for i in items if i.code == "crashed_worker"), None)
    if crash is not None and crash.severity == FAILED:
        # a crash leads: the other lines are judged on a run it cut short
        first = [crash, *(i for i in items if i.code == "out_of_memory")]
        items = first + [i for i in items if i not in first]
    items = _creep_before_slow_rank(items)
    if rec.nodes:
        for item in items:
            item.sentence, item.advice = _with_nodes(item.sentence, rec), _with_nodes(item.advice, rec)
    return items


def _creep_before_slow_rank(items: list[Finding]) -> list[Finding]:
    """A rank whose memory creeps is read before a slow rank it outweighs
    (``analysis.ranks.slow.creep_leads``), as in every other view. Any other
    slow rank keeps its place."""
    slow = next((i for i in items if i.code == SLOW_RANK), None)
    creep = next((i for i in items if i.code == "rank_memory"), None)
    if (slow is None or creep is None or creep.severity != WARNING
            or not creep_leads(slow, [c["rank"] for c in creep.details.get("creep", [])])
            or items.index(creep) < items.index(slow)):
        return items
    rest = [i for i in items if i is not creep]
    at = rest.index(slow)
    return [*rest[:at], creep, *rest[at:]]


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


def summary(items: list[Finding], rec: DdpRun) -> str:
    """One line: ranks, backend, how many checks passed, which failed and
    which warn."""
    failed = [i.title for i in items if i.severity == FAILED]
    passed = sum(i.severity == PASSED for i in items)
    text = (f"ddp_check: {rec.world_size} ranks ({rec.backend}), "
            f"{rec.outcome}, {passed} passed, {len(failed)} failed")
    warned = [i.title for i in items if i.severity == WARNING]
    return (text + (f": {', '.join(failed)}" if failed else "")
            + (f"; warning: {', '.join(warned)}" if warned else ""))
