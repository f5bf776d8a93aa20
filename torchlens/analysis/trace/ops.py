"""Op and kernel tables from a ``Trace``: what the user reads first.

Definitions (the ones ``torch.profiler``'s ``key_averages`` and the
TensorBoard profiler plugin use, so numbers agree with what users know):

- an op is a ``cpu_op`` complete event, except ``ProfilerStep#N`` markers;
- total CPU time of a call is its duration; self CPU time is that minus the
  durations of its *direct* child ops and of its *direct* CUDA runtime /
  driver calls (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``cuLaunchKernel``
  ...: ``cuda_runtime`` / ``cuda_driver`` events whose innermost enclosing op
  on the same thread is this one). This is the plugin's ``self_host_duration``
  (tb_plugin ``OperatorNode.fill_stats``: "From PyTorch 1.8 RC1, cpu_self_time
  does not include runtime's time"); the runtime time is shown nowhere in the
  op table, it is the step breakdown's ``runtime_us``;
- device time of a call is the sum of the GPU kernel / memcpy / memset
  durations it launched itself: each GPU event is linked by ``correlation`` to
  its CUDA runtime / driver call, and that call to the innermost op enclosing
  it (by ``External id`` when the runtime call is missing). Children's device
  time stays with the children, like the self time;
- achieved FLOP/s of a row is its FLOPs (torch's estimate, ``--flops``) over
  the time that did them: the row's device time when the trace has GPU work
  (the kernels the op launched itself), else its total CPU time (the whole
  call: the arithmetic may run in a child op or library call). ``flops_basis``
  says which.
"""

from __future__ import annotations

import math
import re
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from torchlens.analysis.trace.events import (
    COMM_KERNEL,
    DEVICE_CATEGORIES,
    LAUNCH_CATEGORIES,
    category_mask,
    enclosing,
    lookup,
    name_mask,
    phase_mask,
)
from torchlens.model import InputError, Trace

if TYPE_CHECKING:  # imported where a frame is built: op_calls serves pandas-free workers
    import pandas as pd

OP_COLUMNS = ["name", "calls", "self_cpu_us", "total_cpu_us", "device_us",
              "kernels", "input_shapes", "input_types", "flops", "flops_per_s", "stack"]
KERNEL_COLUMNS = ["name", "calls", "total_us", "mean_us", "max_us", "streams",
                  "is_comm"]

#: ``--sort`` keys -> the op-table column (``OP_COLUMNS``) they order by. The
#: first key of each column is the one to document (``SORT_NAMES``); the
#: others are torch's ``key_averages().table(sort_by=...)`` spellings, accepted
#: so that a profile saved by any front end renders. The columns themselves
#: are accepted too (``sort_column``): a Profile stores the column.
SORT_KEYS = {
    "total_cpu": "total_cpu_us",
    "self_cpu": "self_cpu_us",
    "device": "device_us",
    "calls": "calls",
    "kernels": "kernels",
    "flops": "flops",
    "flops_per_s": "flops_per_s",
    "name": "name",
    "cpu_time_total": "total_cpu_us",
    "self_cpu_time_total": "self_cpu_us",
    "cuda": "device_us",
    "cuda_time_total": "device_us",
    "device_time_total": "device_us",
    "count": "calls",
}
#: The documented sort keys, one per column, in the order help texts list them.
SORT_NAMES = tuple(key for i, (key, column) in enumerate(SORT_KEYS.items())
                   if column not in list(SORT_KEYS.values())[:i])


def sort_column(key: str | None) -> str:
    """The op-table column a sort key orders by; InputError names the valid keys.

    ``None`` is the default order (total CPU time). Case, surrounding blanks
    and ``-`` for ``_`` do not matter.
    """
    if key is None:
        return "total_cpu_us"
    norm = str(key).strip().lower().replace("-", "_")
    if norm in SORT_KEYS.values():
        return norm
    if norm not in SORT_KEYS:
        raise InputError(f"sort: unknown sort key {key!r}; use one of: {', '.join(SORT_NAMES)}")
    return SORT_KEYS[norm]


def top_ops(ops: pd.DataFrame, sort: str | None, top: int) -> pd.DataFrame:
    """The ``top`` rows of an op table in ``sort`` order (descending; names ascending)."""
    column = sort_column(sort)
    if column not in ops.columns or len(ops) == 0:
        return ops.head(top)
    return ops.sort_values(column, ascending=column == "name", kind="stable").head(top)


@dataclass(frozen=True)
class OpCalls:
    """Per-call arrays behind ``op_table``; hints and summaries reuse them."""

    rows: np.ndarray  # event row of each op call
    self_us: np.ndarray
    device_us: np.ndarray
    kernels: np.ndarray
    #: device time launched outside every op (e.g. directly in an annotation)
    unattributed_device_us: float


def op_calls(trace: Trace) -> OpCalls:
    """Self CPU time and launched device time of every op call.

    Computed once per trace: the summary, the op tables (with and without
    shapes) and the hints all read the same calls. The memo is dropped with
    the trace, and ignored if its events table was replaced.
    """
    key = id(trace)
    hit = _OP_CALLS.get(key)
    if hit is not None and hit[0]() is trace and hit[1] is trace.events.columns:
        return hit[2]
    calls = _op_calls(trace)
    weakref.finalize(trace, _OP_CALLS.pop, key, None)
    _OP_CALLS[key] = (weakref.ref(trace), trace.events.columns, calls)
    return calls


#: id(trace) -> (weak reference to it, its columns dict, its op calls)
_OP_CALLS: dict[int, tuple[weakref.ref, dict, OpCalls]] = {}


def _op_calls(trace: Trace) -> OpCalls:
    ev = trace.events
    step_names = name_mask(trace, re.compile(r"^ProfilerStep#"))
    is_x = phase_mask(trace, "X")
    op_rows = np.flatnonzero(category_mask(trace, "cpu_op") & is_x & ~step_names)
    rt_rows = np.flatnonzero(category_mask(trace, *LAUNCH_CATEGORIES) & is_x)
    rows = np.concatenate([op_rows, rt_rows])
    is_op = np.arange(len(rows)) < len(op_rows)
    thread = ev["pid"][rows] * (1 << 32) + ev["tid"][rows]
    parent = enclosing(ev["ts"][rows], ev["dur"][rows], thread, is_op)

    n_ops = len(op_rows)
    dur = ev["dur"][op_rows]
    # a child op's or runtime call's duration leaves its innermost enclosing op
    child = parent >= 0
    children_us = np.bincount(parent[child], weights=ev["dur"][rows][child],
                              minlength=n_ops)
    self_us = np.maximum(dur - children_us[:n_ops], 0.0)

    # GPU event -> runtime call (by correlation) -> enclosing op (position)
    launcher_op = parent[n_ops:]  # op position for each runtime call, or -1
    gpu_rows = np.flatnonzero(category_mask(trace, *DEVICE_CATEGORIES))
    owner = lookup(ev["correlation"][rt_rows], launcher_op,
                    ev["correlation"][gpu_rows])
    missing = owner < 0
    if missing.any():
        owner[missing] = lookup(ev["external_id"][op_rows], np.arange(n_ops),
                                 ev["external_id"][gpu_rows[missing]])
    linked = owner >= 0
    device_us = np.bincount(owner[linked], weights=ev["dur"][gpu_rows][linked],
                            minlength=n_ops)[:n_ops]
    is_kernel = category_mask(trace, "kernel")[gpu_rows]
    kernels = np.bincount(owner[linked & is_kernel], minlength=n_ops)[:n_ops]
    unattributed = float(ev["dur"][gpu_rows][~linked].sum())
    return OpCalls(op_rows, self_us, device_us, kernels.astype(np.int64), unattributed)


class OpSums(msgspec.Struct, frozen=True):
    """One trace's op calls summed per group (op name; and input shapes, and
    source line, when grouped by them), groups in order of first call: what
    ``op_frame`` makes the op table of. A run's workers send it per trace
    (``bounded``: a few KB), as builtins (``msgspec.to_builtins``).

    Times are µs, summed exactly (``math.fsum``: the correctly rounded sum,
    whatever the order); ``flops`` is NaN for a group without an estimate.
    """

    name: list[str]
    calls: list[int]
    self_cpu_us: list[float]
    total_cpu_us: list[float]
    device_us: list[float]
    kernels: list[int]
    flops: list[float]
    input_shapes: list[str] = []
    #: the inputs' dtypes (an autocast op's bfloat16 or float16), with the shapes
    input_types: list[str] = []
    stack: list[str] = []
    #: the column FLOP/s divide by (``flops_basis``)
    flops_basis: str = "total_cpu_us"
    #: ``ProfilerStep#N`` spans in the trace (``steps.step_rows``)
    steps: int = 0


#: The row that ``bounded`` folds the ops past its bound into.
OTHER_OPS = "(other ops)"
#: Op names a run keeps per trace (``bounded``); the rest is one ``OTHER_OPS`` row.
TOP_OPS = 250
_SUMMED = ("self_cpu_us", "total_cpu_us", "device_us")


def op_sums(trace: Trace, group_by_shapes: bool = False,
            group_by_source: bool = False) -> OpSums:
    """Calls, CPU and device time, kernels and FLOPs of each group of op calls.

    Groups are op names, split by input shapes (the ``--shapes`` view) and by
    the user code line that issued the op (``--stack``, see ``sources``) when
    asked. Numpy only: a run's workers compute it without pandas.
    """
    from torchlens.analysis.trace.steps import step_rows  # steps builds on this module

    calls = op_calls(trace)
    ev = trace.events
    rows = calls.rows
    keys = [_text_codes(trace, "name", rows)]
    if group_by_shapes:  # the inputs' dtypes with their shapes: an autocast op's own row
        keys.append(_text_codes(trace, "input_dims", rows))
        keys.append(_text_codes(trace, "input_types", rows))
    if group_by_source:
        from torchlens.analysis.trace.sources import (
            op_sources,  # sources builds on this module
        )

        source_codes, source_labels = _factorize(op_sources(trace, rows))
        keys.append(source_codes)
    group, first = _groups(keys, len(rows))
    n = len(first)
    self_us, total_us, device_us = _group_fsum(
        [calls.self_us, ev["dur"][rows], calls.device_us], group, n)
    return OpSums(
        name=_decode(trace, "name", keys[0][first]),
        calls=np.bincount(group, minlength=n).tolist(),
        self_cpu_us=self_us,
        total_cpu_us=total_us,
        device_us=device_us,
        kernels=np.bincount(group, weights=calls.kernels, minlength=n).astype(np.int64).tolist(),
        flops=_group_nansum(ev["flops"][rows], group, n).tolist(),
        input_shapes=(_decode(trace, "input_dims", keys[1][first]) if group_by_shapes
                      else [""] * n),
        input_types=(_decode(trace, "input_types", keys[2][first]) if group_by_shapes
                     else [""] * n),
        stack=(source_labels[source_codes[first]].tolist() if group_by_source
               else [""] * n),
        flops_basis=flops_basis(trace),
        steps=len(step_rows(trace)),
    )


def op_table(trace: Trace, group_by_shapes: bool = False,
             group_by_source: bool = False) -> pd.DataFrame:
    """One row per op name (and input shapes, and source line): calls, CPU and
    device time; ``op_frame`` of ``op_sums``.

    Sorted by total CPU time, largest first. ``input_shapes`` is filled only
    when grouping by shapes (the ``--shapes`` view), ``stack`` (the user code
    line that issued the op, see ``sources``) only when grouping by source
    (``--stack``); ``flops`` is the sum of the profiler's estimates, NaN when
    it recorded none (``--flops`` off).
    """
    return op_frame(op_sums(trace, group_by_shapes, group_by_source))


def op_frame(sums: OpSums) -> pd.DataFrame:
    """The op table (``OP_COLUMNS``) of summed op calls: ``flops_per_s`` added,
    sorted by total CPU time (largest first; ties in order of first call).
    ``%%torchprof``'s ``result.ops()`` and a loaded run's ``ops()`` are this
    table, so they have the same columns and figures."""
    import pandas as pd

    if not sums.name:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in OP_COLUMNS})
    table = pd.DataFrame({
        "name": np.asarray(sums.name, dtype=object),
        "calls": np.asarray(sums.calls, dtype=np.int64),
        "self_cpu_us": np.asarray(sums.self_cpu_us, dtype=float),
        "total_cpu_us": np.asarray(sums.total_cpu_us, dtype=float),
        "device_us": np.asarray(sums.device_us, dtype=float),
        "kernels": np.asarray(sums.kernels, dtype=np.int64),
        "input_shapes": np.asarray(sums.input_shapes, dtype=object),
        "input_types": np.asarray(sums.input_types or [""] * len(sums.name), dtype=object),
        "flops": np.asarray(sums.flops, dtype=float),
        "stack": np.asarray(sums.stack, dtype=object),
    })
    seconds = table[sums.flops_basis].to_numpy(dtype=float) / 1e6
    with np.errstate(divide="ignore", invalid="ignore"):
        table["flops_per_s"] = np.where(seconds > 0, table["flops"] / seconds, np.nan)
    table = table.sort_values("total_cpu_us", ascending=False, kind="stable")
    return table[OP_COLUMNS].reset_index(drop=True)


def bounded(sums: OpSums, top: int = TOP_OPS) -> OpSums:
    """``sums`` with at most ``top`` groups, those with the most total CPU time
    (ties: the first called), in their order; the others summed into one
    ``OTHER_OPS`` row at the end."""
    if len(sums.name) <= top:
        return sums
    order = sorted(range(len(sums.name)), key=lambda g: -sums.total_cpu_us[g])
    keep = sorted(order[:top])
    group = np.full(len(sums.name), top, np.int64)
    group[keep] = np.arange(top)
    picked = msgspec.structs.replace(
        sums, **{field: [(getattr(sums, field) or [""] * len(sums.name))[g] for g in keep]
                 + [other]
                 for field, other in (("name", OTHER_OPS), ("input_shapes", ""),
                                      ("input_types", ""), ("stack", ""))})
    return _regrouped(picked, [sums], group, top + 1)


def merged(parts: list[OpSums]) -> OpSums:
    """The op sums of several traces (one rank's) as one: groups with the same
    name, input shapes and source line summed, in order of first call; FLOP/s
    over device time when any part ran GPU work; steps added up."""
    if len(parts) == 1:
        return parts[0]
    keys = [(n, s, t, k) for p in parts
            for n, s, t, k in zip(p.name, p.input_shapes, p.input_types or [""] * len(p.name),
                                  p.stack, strict=True)]
    index: dict[tuple[str, str, str, str], int] = {}
    group = np.asarray([index.setdefault(key, len(index)) for key in keys], np.int64)
    basis = ("device_us" if any(p.flops_basis == "device_us" for p in parts)
             else "total_cpu_us")
    named = OpSums(name=[k[0] for k in index], input_shapes=[k[1] for k in index],
                   input_types=[k[2] for k in index],
                   stack=[k[3] for k in index], calls=[], self_cpu_us=[],
                   total_cpu_us=[], device_us=[], kernels=[], flops=[],
                   flops_basis=basis, steps=sum(p.steps for p in parts))
    return _regrouped(named, parts, group, len(index))


def _regrouped(named: OpSums, parts: list[OpSums], group: np.ndarray, n: int) -> OpSums:
    """``named`` (its names, shapes, stacks, basis and steps) with the figures
    of ``parts``' rows, concatenated, summed into ``n`` groups by ``group``."""
    def column(field: str) -> np.ndarray:
        return np.concatenate([np.asarray(getattr(p, field), dtype=float) for p in parts])

    counts = {field: np.bincount(group, weights=column(field), minlength=n).astype(np.int64)
              .tolist() for field in ("calls", "kernels")}
    return msgspec.structs.replace(
        named, **counts,
        **dict(zip(_SUMMED, _group_fsum([column(f) for f in _SUMMED], group, n), strict=True)),
        flops=_group_nansum(column("flops"), group, n).tolist())


def flops_basis(trace: Trace) -> str:
    """The op-table column FLOP/s divide by: ``device_us`` on a GPU trace,
    else ``total_cpu_us`` (see the module docstring)."""
    return "device_us" if category_mask(trace, *DEVICE_CATEGORIES).any() else "total_cpu_us"


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes numbered in order of first appearance, and the distinct values in
    that order (``pandas.factorize`` without pandas)."""
    if len(values) == 0:
        return np.zeros(0, np.int64), values[:0]
    uniques, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    number = np.empty(len(order), np.int64)
    number[order] = np.arange(len(order))
    return number[inverse.reshape(-1)], uniques[order]


def _groups(keys: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """One group number per distinct tuple of key codes, in order of first
    appearance, and each group's first row."""
    group = np.zeros(n, np.int64)
    if n == 0:
        return group, group
    for key in keys:  # one int per distinct tuple of key codes, kept below n
        codes = key.astype(np.int64)
        codes = codes - codes.min()
        group = _factorize(group * (int(codes.max()) + 1) + codes)[0]
    first = np.unique(group, return_index=True)[1]
    return group, first


def _group_fsum(columns: list[np.ndarray], group: np.ndarray, n_groups: int,
                ) -> list[list[float]]:
    """Per column and group, the correctly rounded sum of the column's values
    in that group (``math.fsum``)."""
    order = np.argsort(group, kind="stable")
    ends = np.cumsum(np.bincount(group, minlength=n_groups)).tolist()
    spans = list(zip([0, *ends][:-1], ends, strict=True))
    out = []
    for values in columns:
        flat = values[order].tolist()
        out.append([math.fsum(flat[start:end]) for start, end in spans])
    return out


def _group_nansum(values: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group, the sum of ``values`` that are not NaN in row order
    (``Series.sum(min_count=1)``): NaN where a group has none."""
    out = np.full(n_groups, np.nan)
    present = ~np.isnan(values)
    if not present.any():
        return out
    order = np.argsort(group, kind="stable")
    bounds = np.cumsum(np.bincount(group, minlength=n_groups))[:-1]
    for g, (part, seen) in enumerate(zip(np.split(values[order], bounds),
                                         np.split(present[order], bounds), strict=True)):
        if seen.any():
            out[g] = np.where(seen, part, 0.0).sum()
    return out


def _text_codes(trace: Trace, column: str, rows: np.ndarray) -> np.ndarray:
    """Codes of a text column at ``rows``, one code per distinct text.

    Missing values (-1) read as "", and a label repeated in the category list
    maps to its first code, exactly as if the decoded texts were compared.
    """
    labels = list(trace.events.categories[column]) + [""]
    first: dict[str, int] = {}
    lut = np.asarray([first.setdefault(lab, i) for i, lab in enumerate(labels)], np.int64)
    codes = trace.events[column][rows]
    return lut[np.where(codes < 0, len(labels) - 1, codes)]


def _decode(trace: Trace, column: str, codes: np.ndarray) -> list[str]:
    labels = list(trace.events.categories[column]) + [""]
    return [labels[c] for c in codes.tolist()]


def kernel_table(trace: Trace) -> pd.DataFrame:
    """One row per GPU kernel name: calls, time, streams, and whether it is NCCL.

    ``streams`` lists the streams the kernel ran on (``"7,40"``), because a
    compute kernel on the communication stream, or the reverse, is a finding.
    """
    import pandas as pd

    ev = trace.events
    rows = np.flatnonzero(category_mask(trace, "kernel"))
    if len(rows) == 0:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in KERNEL_COLUMNS})
    frame = pd.DataFrame({"name": ev.text("name")[rows], "dur": ev["dur"][rows],
                          "stream": ev["stream"][rows]})
    table = frame.groupby("name", sort=False).agg(
        calls=("dur", "size"), total_us=("dur", "sum"), mean_us=("dur", "mean"),
        max_us=("dur", "max"),
        streams=("stream", lambda s: ",".join(str(x) for x in sorted(set(s)))),
    ).reset_index()
    table["is_comm"] = table["name"].str.match(COMM_KERNEL.pattern)
    table = table.sort_values("total_us", ascending=False, kind="stable")
    return table[KERNEL_COLUMNS].reset_index(drop=True)
