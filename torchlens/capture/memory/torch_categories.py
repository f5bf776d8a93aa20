"""Categories from torch's own memory profiler, for ``%%gpumem --categories torch``.

``torch.profiler._memory_profiler`` (private: ``profile._memory_profile()``)
replays a profile recorded with ``record_shapes``, ``profile_memory`` and
``with_stack`` through the op graph and names what each tensor version is:
parameter, optimizer state, input, temporary, activation, gradient, autograd
detail. Torchlens' own rules infer a category from the allocating stack; this
is torch's answer for the same allocations, so each trace entry it names gets
``torch_category``: ``[[time_us, name or None], ...]``, one item per version of
the tensor (a version bump can change it: a gradient's buffer reused in place).

The same profile holds each op's input tensors with their dtype (and a
module's parameters and an optimizer's state with theirs), so an allocation
torch saw as a tensor also gets ``torch_dtype`` ("bfloat16", "float16", ...):
the allocator history itself records bytes only. A tensor no recorded op read
(an output dropped unread) has none.

It costs: every aten op is observed with shapes and the Python tracer, and the
replay itself is pure Python (``benchmarks/bench_gpumem_categories.py``: seconds
for a few dozen training steps), so it is an option and the rules stay the
default. The API is private: anything it lacks or raises becomes one line
(``categories_error``) and the categories fall back to the rules.

The profiler's allocation records are the same ones the CPU stand-in's
``[memory]`` events come from (same pointer, same nanosecond), so on the CPU a
record and a trace entry match exactly. On CUDA the allocator history's times
and the profiler's are both wall-clock microseconds from torch's approximate
clock; a record matches the entry at the same address closest in time, within
``CUDA_TOLERANCE_US``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from torchlens.model.snapshot import TraceEntry

#: torch's ``Category`` names -> the words every torchlens view uses
NAMES = {"PARAMETER": "parameter", "OPTIMIZER_STATE": "optimizer state", "INPUT": "input",
         "TEMPORARY": "temporary", "ACTIVATION": "activation", "GRADIENT": "gradient",
         "AUTOGRAD_DETAIL": "autograd detail"}
CPU_TOLERANCE_US = 1  # same clock; float microseconds in the chrome trace
CUDA_TOLERANCE_US = 1000


@dataclass
class TensorRecord:
    """One allocation torch's memory profiler tracked: where, when, and its category per
    version (``(time_us, name or None)``, the first at the allocation)."""

    device: str
    addr: int
    time_us: int
    versions: list[tuple[int, str | None]]
    dtype: str | None = None


def start_profiler() -> Any:
    """The profiler ``_memory_profile`` needs, started (CPU activity: the allocator reports
    CUDA allocations to it too)."""
    import torch.profiler as tp

    prof = tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True,
                      profile_memory=True, with_stack=True)
    prof.__enter__()
    return prof


def stop_profiler(prof: Any) -> None:
    prof.__exit__(None, None, None)


def _name(category: Any) -> str | None:
    return None if category is None else NAMES.get(category.name, category.name.lower())


def records(prof: Any) -> tuple[list[TensorRecord], str]:
    """Every allocation the memory profiler categorised, and why there are none (""
    when it worked). Never raises: the API is private and may change or fail."""
    try:
        from torch.profiler._memory_profiler import Action, TensorKey
    except ImportError as exc:
        return [], f"this torch has no torch.profiler._memory_profiler ({exc})"
    build = getattr(prof, "_memory_profile", None)
    if build is None:
        return [], "this torch's profiler has no _memory_profile()"
    try:
        mp = build()
        cats = mp._categories
        dtypes = _dtypes(mp, TensorKey)
        out: dict[Any, TensorRecord] = {}
        for t_ns, action, (key, version), _n in mp.timeline:
            if not isinstance(key, TensorKey) or t_ns < 0:
                continue  # an allocation torch could not tie to a tensor; or pre-existing
            if action == Action.CREATE:
                out[key] = TensorRecord(str(key.device), int(key.storage.ptr), t_ns // 1000,
                                        [(t_ns // 1000, _name(cats.get(key, version)))],
                                        dtypes.get(key))
            elif action == Action.INCREMENT_VERSION and key in out:
                out[key].versions.append((t_ns // 1000, _name(cats.get(key, version + 1))))
        return list(out.values()), ""
    except Exception as exc:  # noqa: BLE001 - a private API: any failure is one line
        first = (str(exc).splitlines() or [""])[0][:160]
        return [], f"torch's memory profiler failed ({type(exc).__name__}: {first})"


def _dtypes(mp: Any, tensor_key: Any) -> dict[Any, str]:
    """The dtype of each tensor the profile names: an op's inputs, a module's
    parameters and gradients, an optimizer's state (``_TensorMetadata.dtype``).
    Empty when the private op tree is not there as read: the categories stand
    without dtypes."""
    out: dict[Any, str] = {}

    def seen(t: Any) -> None:
        key = tensor_key.from_tensor(t) if t is not None else None
        dtype = getattr(t, "dtype", None)
        if key is not None and dtype is not None:
            out.setdefault(key, str(dtype).removeprefix("torch."))

    try:
        for node in mp._op_tree.sorted_nodes:
            kind, fields = node.typed
            name = getattr(kind, "name", "")
            if name == "TorchOp":
                for i in fields.inputs:
                    for t in i if isinstance(i, list) else (i,):
                        if hasattr(t, "dtype") and hasattr(t, "storage_data_ptr"):
                            seen(t)
            elif name == "PyCall":
                if fields.module is not None:
                    for _, p, grad in fields.module.parameters:
                        seen(p)
                        seen(grad)
                if fields.optimizer is not None:
                    for p, grad, state in fields.optimizer.parameters:
                        seen(p)
                        seen(grad)
                        for _, t in state:
                            seen(t)
    except Exception:  # noqa: BLE001 - a private API: the dtypes read so far, the rest stands
        pass
    return out


def annotate(trace: list[TraceEntry], recs: list[TensorRecord], device: str,
             tolerance_us: int) -> int:
    """Give each ``alloc`` entry of ``trace`` its record's ``torch_category`` (records of
    ``device`` only); returns how many matched. Per address, entries and records are
    both in time order: a record more than ``tolerance_us`` before the entry is one
    the trace lacks and is skipped."""
    by_addr: dict[int, list[TensorRecord]] = defaultdict(list)
    for r in sorted((r for r in recs if r.device == device), key=lambda r: r.time_us):
        by_addr[r.addr].append(r)
    nxt: dict[int, int] = defaultdict(int)
    matched = 0
    for e in trace:
        if e.action != "alloc" or e.addr not in by_addr:
            continue
        rs, j, t = by_addr[e.addr], nxt[e.addr], e.time_us or 0
        while j < len(rs) and rs[j].time_us < t - tolerance_us:
            j += 1
        if j < len(rs) and rs[j].time_us <= t + tolerance_us:
            e.torch_category = [[ts, name] for ts, name in rs[j].versions]
            e.torch_dtype = rs[j].dtype
            matched += 1
            j += 1
        nxt[e.addr] = j
    return matched
