"""Allocator constants and settings (PYTORCH_CUDA_ALLOC_CONF), and the size rules.

The numbers and the two size functions mirror c10/cuda/CUDACachingAllocator.cpp
(``round_size``, ``get_allocation_size``) and c10/core/AllocatorConfig.cpp
(parsing, ``roundup_power2_divisions`` intervals). They are kept apart from the
allocator so that tests and "what if" frontends can reason about sizes without
building an allocator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchlens.model.errors import InputError

KB = 1024
MB = 1024 * 1024

MIN_BLOCK_SIZE = 512  # kMinBlockSize: every size rounds up to a multiple of this
SMALL_SIZE = 1 * MB  # kSmallSize: requests up to this use the small pool
SMALL_BUFFER = 2 * MB  # kSmallBuffer: small-pool segment size
LARGE_BUFFER = 20 * MB  # kLargeBuffer: segment size for 1-10 MiB requests
MIN_LARGE_ALLOC = 10 * MB  # kMinLargeAlloc: from here segments fit the request
ROUND_LARGE = 2 * MB  # kRoundLarge: large segments round up to this
#: ``max_split_size`` when unset (SIZE_MAX in C++); memory_stats reports -1.
NO_MAX_SPLIT = (1 << 64) - 1
#: Address space reserved per expandable segment when no capacity is given.
DEFAULT_DEVICE_TOTAL = 80 * 1024**3
#: roundup_power2_divisions has one entry per power-of-two interval 1 MiB..64 GiB.
ROUNDUP_INTERVALS = 16


@dataclass
class AllocatorConfig:
    """The settings that change the caching allocator's decisions.

    ``max_split_size`` in bytes (``NO_MAX_SPLIT`` = unlimited);
    ``roundup_power2_divisions``: 16 entries, index 0 for sizes < 2 MiB, index
    i for [2**i MiB, 2**(i+1) MiB), the last for everything above;
    ``garbage_collection_threshold`` in (0, 1) or 0 (off; it only acts when a
    memory fraction is set, as in C++); ``max_non_split_rounding_size``: how much
    larger than an oversize request a cached oversize block may be.
    """

    max_split_size: int = NO_MAX_SPLIT
    roundup_power2_divisions: list[int] = field(
        default_factory=lambda: [0] * ROUNDUP_INTERVALS
    )
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    max_non_split_rounding_size: int = LARGE_BUFFER
    conf_string: str = ""

    @classmethod
    def parse(cls, conf: str) -> AllocatorConfig:
        """Parse a PYTORCH_CUDA_ALLOC_CONF string with torch's rules and limits.

        Unknown keys and out-of-range values raise ``InputError`` (torch raises
        at startup for the same strings), so a "what if" never silently runs
        with a setting torch would have refused.
        """
        cfg = cls(conf_string=conf)
        tokens = _lex(conf)
        i = 0
        while i < len(tokens):
            key = tokens[i]
            _expect(tokens, i + 1, ":", key)
            i += 2
            if i >= len(tokens):
                raise InputError(f"alloc conf: expected a value after '{key}:'")
            if key == "max_split_size_mb":
                mb = _int(tokens[i], key)
                if mb < LARGE_BUFFER // MB:
                    raise InputError(
                        f"alloc conf: max_split_size_mb too small, must be >= {LARGE_BUFFER // MB}"
                    )
                cfg.max_split_size = min(mb * MB, NO_MAX_SPLIT)
            elif key == "max_non_split_rounding_mb":
                mb = _int(tokens[i], key)
                if mb < LARGE_BUFFER // MB:
                    raise InputError(
                        f"alloc conf: max_non_split_rounding_mb too small, must be >= {LARGE_BUFFER // MB}"
                    )
                cfg.max_non_split_rounding_size = mb * MB
            elif key == "garbage_collection_threshold":
                try:
                    val = float(tokens[i])
                except ValueError:
                    raise InputError(
                        f"alloc conf: {key} needs a number, got {tokens[i]!r}"
                    ) from None
                if not 0.0 < val < 1.0:
                    raise InputError(
                        "alloc conf: garbage_collection_threshold must be in (0.0, 1.0)"
                    )
                cfg.garbage_collection_threshold = val
            elif key == "roundup_power2_divisions":
                i = _parse_roundup(tokens, i, cfg.roundup_power2_divisions)
            elif key == "expandable_segments":
                if tokens[i] not in ("True", "False"):
                    raise InputError(
                        "alloc conf: expandable_segments needs True or False"
                    )
                cfg.expandable_segments = tokens[i] == "True"
            elif key in (
                "backend",
                "release_lock_on_cudamalloc",
                "pinned_use_cuda_host_register",
                "pinned_num_register_threads",
                "pinned_use_background_threads",
                "pinned_reserve_segment_size_mb",
                "graph_capture_record_stream_reuse",
            ):
                pass  # accepted by torch; no effect on the device allocator's layout
            else:
                raise InputError(f"alloc conf: unrecognized option {key!r}")
            i += 1
            if i < len(tokens):
                _expect(tokens, i, ",", key)
                i += 1
        return cfg

    @classmethod
    def from_settings(cls, settings: dict[str, Any] | None) -> AllocatorConfig:
        """Build from a snapshot's ``allocator_settings`` (empty dict: defaults)."""
        cfg = cls()
        if not settings:
            return cfg
        mss = settings.get("max_split_size", -1)
        if isinstance(mss, int) and mss > 0 and mss != NO_MAX_SPLIT:
            cfg.max_split_size = mss
        gc = settings.get("garbage_collection_threshold", 0.0)
        if isinstance(gc, (int, float)):
            cfg.garbage_collection_threshold = float(gc)
        cfg.expandable_segments = bool(settings.get("expandable_segments", False))
        rp = settings.get("roundup_power2_divisions")
        if isinstance(rp, dict):
            # keys are the interval starts in MiB: "1", "2", ... "32768"
            for k, v in rp.items():
                idx = max(0, min(ROUNDUP_INTERVALS - 1, int(k).bit_length() - 1))
                cfg.roundup_power2_divisions[idx] = int(v)
        elif isinstance(rp, list) and len(rp) == ROUNDUP_INTERVALS:
            cfg.roundup_power2_divisions = [int(v) for v in rp]
        cfg.conf_string = str(settings.get("PYTORCH_CUDA_ALLOC_CONF", "") or "")
        return cfg

    def to_settings(self) -> dict[str, Any]:
        """The ``allocator_settings`` dict torch writes into snapshots."""
        return {
            "PYTORCH_CUDA_ALLOC_CONF": self.conf_string,
            "max_split_size": -1
            if self.max_split_size == NO_MAX_SPLIT
            else self.max_split_size,
            "garbage_collection_threshold": self.garbage_collection_threshold,
            "expandable_segments": self.expandable_segments,
            "roundup_power2_divisions": {
                str(1 << i): d for i, d in enumerate(self.roundup_power2_divisions)
            },
        }

    def divisions_for(self, size: int) -> int:
        """roundup_power2_divisions entry for ``size`` (interval of log2(size) - 20)."""
        idx = size.bit_length() - 1 - 20
        if idx < 0:
            idx = 0
        elif idx >= ROUNDUP_INTERVALS:
            idx = ROUNDUP_INTERVALS - 1
        return self.roundup_power2_divisions[idx]


def _lex(conf: str) -> list[str]:
    tokens: list[str] = []
    buf = ""
    for ch in conf:
        if ch in ",:[]":
            if buf:
                tokens.append(buf)
                buf = ""
            tokens.append(ch)
        elif ch != " ":
            buf += ch
    if buf:
        tokens.append(buf)
    return tokens


def _expect(tokens: list[str], i: int, tok: str, key: str) -> None:
    if i >= len(tokens) or tokens[i] != tok:
        raise InputError(f"alloc conf: expected '{tok}' after {key!r}")


def _int(text: str, key: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError(f"alloc conf: {key} needs an integer, got {text!r}") from None


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _parse_roundup(tokens: list[str], i: int, out: list[int]) -> int:
    """roundup_power2_divisions:N or :[1:4,256:8,>:1] (interval starts in MiB)."""
    if tokens[i] != "[":
        val = _int(tokens[i], "roundup_power2_divisions")
        if not _is_pow2(val):
            raise InputError(
                "alloc conf: roundup_power2_divisions must be a power of 2"
            )
        out[:] = [val] * ROUNDUP_INTERVALS
        return i
    first = True
    last_index = 0
    i += 1
    while i < len(tokens) and tokens[i] != "]":
        interval = tokens[i]
        _expect(tokens, i + 1, ":", "roundup_power2_divisions")
        val = (
            _int(tokens[i + 2], "roundup_power2_divisions")
            if i + 2 < len(tokens)
            else -1
        )
        if val != 0 and not _is_pow2(val):
            raise InputError(
                "alloc conf: roundup_power2_divisions must be 0 or a power of 2"
            )
        if interval == ">":
            for j in range(last_index, ROUNDUP_INTERVALS):
                out[j] = val
        else:
            start = _int(interval, "roundup_power2_divisions interval")
            if not _is_pow2(start):
                raise InputError(
                    "alloc conf: roundup_power2_divisions intervals must be powers of 2"
                )
            idx = min(start.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                for j in range(idx):
                    out[j] = val
                first = False
            out[idx] = val
            last_index = idx
        i += 3
        if i < len(tokens) and tokens[i] == ",":
            i += 1
    if i >= len(tokens):
        raise InputError("alloc conf: roundup_power2_divisions list is missing ']'")
    return i


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round ``size`` up to the next of ``divisions`` steps between powers of two."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(size: int, cfg: AllocatorConfig) -> int:
    """Block size for a request of ``size`` bytes (C++ ``round_size``)."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    div = cfg.divisions_for(size)
    if div > 1 and size > MIN_BLOCK_SIZE * div:
        return roundup_power2_next_division(size, div)
    return MIN_BLOCK_SIZE * ((size + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """Segment size cudaMalloc'd for a rounded ``size`` (C++ ``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)
