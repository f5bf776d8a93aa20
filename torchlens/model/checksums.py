"""Parameter sync's checksums: every parameter and buffer of a module a
%ddp_check rank built or returned, as the worker sends them in its step
records (``capture.ddp.checksums``) and the checklist compares them across
ranks (``analysis.ddp.checks``)."""

from __future__ import annotations

from typing import TypeVar

import msgspec
from msgspec import UNSET, UnsetType

T = TypeVar("T")


class ParamChecksum(msgspec.Struct):
    """One parameter or buffer: its shape, dtype, sum, |sum|, sha1 and first
    values; a sharded (FSDP) one also which shard this rank holds, how it is
    sharded and its global shape."""

    kind: str
    name: str
    shape: list[int]
    dtype: str
    sum: float
    abs_sum: float
    sha1: str
    head: list[float]
    shard: str | None | UnsetType = UNSET
    layout: str | None | UnsetType = UNSET
    global_shape: list[int] | None | UnsetType = UNSET

    @property
    def shard_key(self) -> tuple[str | None, str | None, list[int] | None]:
        """(which shard, how sharded, global shape): all None when not sharded."""
        return (_set(self.shard), _set(self.layout), _set(self.global_shape))


class ShardBytes(msgspec.Struct):
    """A module's FSDP shards against the same parameters gathered (bytes)."""

    sharded_bytes: int
    unsharded_bytes: int


class ModuleChecksums(msgspec.Struct):
    """Every parameter and buffer of one module, and its FSDP bytes when sharded."""

    name: str
    params: list[ParamChecksum]
    fsdp: ShardBytes | UnsetType = UNSET


def _set(value: T | UnsetType) -> T | None:
    return None if isinstance(value, UnsetType) else value
