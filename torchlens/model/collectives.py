"""The collective fingerprint: what a %ddp_check rank records per collective.

A worker builds one before the collective runs (``capture.ddp.recorder``),
sets it on the store, and keeps it with the call's duration for its result;
the kernel reads every rank's fingerprints back and saves them in the
``DdpRun`` payload. ``formats.fingerprints`` words one and compares one index
across ranks, ``analysis.ddp.sequence`` compares whole sequences.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType


class Fingerprint(msgspec.Struct):
    """One collective of one rank: its number in the rank's issue order, the
    public op name, each tensor's shape and dtype, the user's line that issued
    it, the step and when (epoch s).

    ``module``: under FSDP, the module whose parameters it moves (left out of
    the JSON otherwise); ``call_s``: how long the call took, once known (left
    out of the JSON until then, as the fingerprint set before the call is)."""

    index: int = 0
    op: str = ""
    shapes: list[list[int]] = []
    dtypes: list[str] = []
    line: str = ""
    step: int = -1
    t: float | None = None
    module: str | None | UnsetType = UNSET
    call_s: float | None | UnsetType = UNSET

    @property
    def module_name(self) -> str | None:
        """The FSDP module, None when there is none."""
        return self.module if isinstance(self.module, str) else None

    @property
    def call_time(self) -> float | None:
        """The call's duration in seconds, None when not measured."""
        return self.call_s if isinstance(self.call_s, (int, float)) else None


class Difference(msgspec.Struct, frozen=True):
    """How one collective index differs across ranks: the first field that
    differs (``op``, ``shapes``, ``dtypes`` or ``module``), each rank's value of
    it, the rank compared against and the index."""

    what: str
    values: dict[int, str | list[list[int]] | list[str] | None]
    reference_rank: int
    index: int


def fingerprints_from(value: object) -> list[Fingerprint]:
    """The fingerprints in a decoded JSON list; entries that are not one are left out."""
    out = []
    for item in value if isinstance(value, list) else []:
        try:
            out.append(msgspec.convert(item, Fingerprint))
        except msgspec.ValidationError:
            continue
    return out
