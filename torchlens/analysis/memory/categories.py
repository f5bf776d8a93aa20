"""What kind of memory a block is, inferred from the stack that allocated it.

A snapshot (or the CPU stand-in's trace) does not say "this is a gradient":
it has the frames of the call that allocated the block. The kind is inferred
from them, one rule after another (``RULES``, first match wins), so every
view must say the categories are *inferred*. The user's own categories come
first: an ordered ``{name: regex}`` matched against each frame's
``file:function`` (Meta's Mosaic calls it a custom profile).

Frames are innermost first, as torch records them. A rule matches when any
frame of the stack matches, except ``activation``, which also needs no
backward frame (a recomputed checkpoint runs forward inside backward).

Optimizer and backward allocations are split by lifetime, not by name
(``by_lifetime``): Adam makes ``exp_avg`` in ``_init_group`` but SGD makes its
momentum buffer in ``_single_tensor_sgd`` next to its temporaries, and a
gradient is a backward node's output like any scratch tensor, so no name rule
can tell them apart; what a step keeps past the step is state, what a backward
pass keeps past the pass is gradients.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

from torchlens.model import InputError
from torchlens.model.snapshot import Frame, TraceEntry

OPTIMIZER = "optimizer state"
OPTIMIZER_TEMP = "optimizer temporary"
GRADIENT = "gradient"
BACKWARD = "backward temporary"
PARAMETER = "parameter"
ACTIVATION = "activation"
INPUT = "input"
UNKNOWN = "unknown"
NO_STACK = "unknown (no stack recorded)"
#: torch's memory profiler's own (``--categories torch``); the rest share the names above
TEMPORARY = "temporary"
AUTOGRAD_DETAIL = "autograd detail"

#: The order a table lists categories in (custom ones come first).
ORDER = (PARAMETER, GRADIENT, OPTIMIZER, ACTIVATION, BACKWARD, OPTIMIZER_TEMP, TEMPORARY,
         AUTOGRAD_DETAIL, INPUT, UNKNOWN, NO_STACK)

#: where a block's category came from
FROM_TORCH, FROM_RULES, FROM_USER = "torch", "inferred", "yours"

Frames = list[Frame]


def _file(f: Frame) -> str:
    return f.filename.replace("\\", "/")


def _name(f: Frame) -> str:
    return f.name


def _any(test: Callable[[Frame], bool]) -> Callable[[Frames], bool]:
    return lambda frames: any(test(f) for f in frames)


_MODULE_CALL = ("_call_impl", "_wrapped_call_impl")
_MOVE = ("_apply", "to", "cuda", "to_empty", "load_state_dict", "_load_from_state_dict")
_is_backward = _any(lambda f: "torch/autograd/" in _file(f) or _name(f) in (
    "backward", "_engine_run_backward") and "torch/" in _file(f)
    or "autograd::engine" in _name(f) or "torch::autograd::Engine" in _name(f))

#: (category, test on the stack, why): first match wins.
RULES: tuple[tuple[str, Callable[[Frames], bool], str], ...] = (
    (OPTIMIZER, _any(lambda f: "torch/optim/" in _file(f)),
     "torch.optim code made it (Adam's _init_group makes exp_avg / exp_avg_sq) and the "
     "step kept it; what the step frees before it ends is an optimizer temporary"),
    (GRADIENT, _any(lambda f: "AccumulateGrad" in _name(f)),
     "the autograd engine's AccumulateGrad node writes .grad (C++ frames, stacks='all')"),
    (BACKWARD, _is_backward,
     "made under loss.backward() / the autograd engine and freed before the backward pass "
     "ended; what the pass keeps past its end is a gradient"),
    (PARAMETER, _any(lambda f: "torch/nn/init.py" in _file(f)
                     or "torch/nn/" in _file(f) and _name(f) in ("__init__", "reset_parameters")
                     or "torch/nn/modules/module.py" in _file(f) and _name(f) in _MOVE),
     "module construction, nn.init or Module.to/_apply made it: parameters and buffers"),
    (INPUT, _any(lambda f: "torch/utils/data/" in _file(f)),
     "the DataLoader / collate made it: a batch of inputs"),
    (ACTIVATION, _any(lambda f: "torch/nn/modules/module.py" in _file(f)
                      and _name(f) in _MODULE_CALL),
     "made inside a module's forward, outside backward: activations (kept for backward "
     "or not)"),
)

#: Said wherever categories are shown.
INFERRED = ("Categories are inferred from the stack that allocated each block (torchlens "
            "rules, first match wins), not recorded by torch.")


#: Said where every category came from torch's memory profiler.
FROM_TORCH_NOTE = ("Categories are torch's memory profiler's (torch.profiler with "
                   "record_shapes, profile_memory and with_stack; torch names each tensor "
                   "version by how the ops used it).")


def source_label(sources: set[str]) -> str:
    """Where the categories of a table came from, in a few words."""
    parts = ["your regexes"] if FROM_USER in sources else []
    if FROM_TORCH in sources:
        parts.append("torch's memory profiler")
    if not parts:
        return "inferred from stacks"
    return "from " + ", then ".join(parts) + (
        ", the rest inferred from stacks" if FROM_RULES in sources else "")


def _torch_versions(entry: TraceEntry) -> list[tuple[float, Any]] | None:
    """An ``alloc`` entry's ``torch_category`` versions; None when absent or not what the
    capture writes (ignored rather than guessed at)."""
    versions = entry.torch_category
    if not isinstance(versions, list) or not versions:
        return None
    if not all(isinstance(v, (list, tuple)) and len(v) == 2 for v in versions):
        return None
    return [(v[0], v[1]) for v in versions]


def torch_category_at(entry: TraceEntry, t_us: float) -> str | None:
    """The category torch's memory profiler gave the tensor of an ``alloc`` entry at
    ``t_us`` (the version current then); None when torch named none."""
    versions = _torch_versions(entry)
    if versions is None:
        return None
    name = None
    for i, (t, item) in enumerate(versions):
        if i and t > t_us:
            break
        name = item
    return name if isinstance(name, str) and name else None


def torch_category_longest(entry: TraceEntry, t_end: float) -> str | None:
    """The category torch's memory profiler gave the tensor of an ``alloc`` entry for the
    longest time up to ``t_end`` (its free, or the window's end); None when torch named
    none. Ties go to the earlier version."""
    versions = _torch_versions(entry)
    if versions is None:
        return None
    held: dict[str, float] = {}
    for (t, name), (t_next, _n) in zip(versions, [*versions[1:], (t_end, None)],
                                       strict=True):
        if isinstance(name, str) and name:
            held[name] = held.get(name, 0) + max(0, t_next - t)
    return max(held, key=held.__getitem__) if held else None


def custom_match(frames: Frames, custom: list[tuple[str, re.Pattern[str]]] | None) -> str | None:
    """The first of the user's categories whose regex matches a frame's ``file:function``."""
    for name, rx in custom or ():
        if any(rx.search(f"{_file(f)}:{_name(f)}") for f in frames):
            return name
    return None


def compile_custom(custom: Mapping[str, str] | None) -> list[tuple[str, re.Pattern[str]]]:
    """The user's ordered ``{name: regex}``; InputError names a bad pattern."""
    out = []
    for name, pattern in (custom or {}).items():
        if not isinstance(name, str) or not name or not isinstance(pattern, str):
            raise InputError(f"custom categories map a name to a regex, got {name!r}: "
                             f"{pattern!r}")
        try:
            out.append((name, re.compile(pattern)))
        except re.error as err:
            raise InputError(f"custom category {name!r}: bad regex {pattern!r} ({err})") from None
    return out


def categorize(frames: Frames, custom: list[tuple[str, re.Pattern[str]]] | None = None) -> str:
    """The category of a block allocated with ``frames`` (innermost first)."""
    # a snapshot repeats a few thousand stacks over its allocations: each is judged once
    # (the rules read only each frame's file and function)
    return categorize_key(tuple(map(frame_key, frames)), custom)


def frame_key(f: Frame) -> str:
    """What the rules read of a frame: its file (forward slashes) and function, as one
    string (a stack's key hashes its strings once each: a tuple of pairs re-hashed every
    pair at every lookup)."""
    return f"{_file(f)}\0{_name(f)}"


def categorize_key(key: tuple[str, ...],
                   custom: list[tuple[str, re.Pattern[str]]] | None = None) -> str:
    """``categorize`` of a stack given as its frames' ``frame_key``s (for a caller that
    holds each distinct frame once: the key costs no second reading of every frame)."""
    if not key:
        return NO_STACK
    return _categorize_stack(key, tuple((n, rx.pattern, rx.flags) for n, rx in custom or ()))


class Categorizer:
    """``categorize`` for the many stacks of one trace: a stack whose frames are the
    same objects as an earlier one's (a loaded snapshot shares them) is not read
    again. Keyed by the frames' ids, each key keeping its frames alive (so no id is
    reused) for as long as the memo lives: one analysis."""

    def __init__(self, custom: list[tuple[str, re.Pattern[str]]] | None = None) -> None:
        self.custom = custom
        self._memo: dict[tuple[int, ...], tuple[str, Frames]] = {}
        self._lists: dict[int, tuple[str, Frames]] = {}  # as ``frames.SiteMemo``'s

    def __call__(self, frames: Frames) -> str:
        hit = self._lists.get(id(frames))
        if hit is None:
            key = tuple(map(id, frames))
            hit = self._memo.get(key)
            if hit is None:
                hit = self._memo[key] = (categorize(frames, self.custom), frames)
            self._lists[id(frames)] = (hit[0], frames)
        return hit[0]


@functools.lru_cache(maxsize=1 << 16)
def _categorize_stack(key: tuple[str, ...], custom: tuple[tuple[str, str, int], ...]) -> str:
    stack = [k.split("\0", 1) for k in key]
    frames = [Frame(file, name) for file, name in stack]
    for name, pattern, flags in custom:
        rx = re.compile(pattern, flags)
        if any(rx.search(f"{file}:{fn}") for file, fn in stack):
            return name
    return _by_rules(frames)


def _by_rules(frames: Frames) -> str:
    for category, test, _why in RULES:
        if category == ACTIVATION and _is_backward(frames):
            continue
        if test(frames):
            return category
    return UNKNOWN


#: (category of a run, what it keeps past the run, what it frees within it)
LIFETIME = {OPTIMIZER: (OPTIMIZER, OPTIMIZER_TEMP), BACKWARD: (GRADIENT, BACKWARD)}


def by_lifetime(allocs: list[tuple[int, int | None, str]]) -> dict[int, str]:
    """Split optimizer and backward allocations by what outlives their pass.

    ``allocs``: (trace index, free index or None, category) in trace order. A run is
    consecutive allocations of one of those categories (one optimizer step, one
    backward pass; it ends at the next allocation of another category). What a run
    frees before it ends is scratch space; what it keeps is optimizer state, or the
    gradients (a backward node's output becomes ``.grad``; only C++ frames would show
    AccumulateGrad, and a snapshot without them still shows the gradients this way)."""
    out: dict[int, str] = {}
    run: list[tuple[int, int | None]] = []
    run_cat = ""

    def close(end: int | None) -> None:
        kept, temp = LIFETIME[run_cat]
        for idx, free in run:
            out[idx] = temp if free is not None and (end is None or free < end) else kept
        run.clear()

    for idx, free, c in allocs:
        if run and c != run_cat:
            close(idx)
        if c in LIFETIME:
            run_cat = c
            run.append((idx, free))
    if run:
        close(None)
    return out
