"""The typed shape of a Kineto JSON trace, as far as torchlens reads it.

Decoding straight into these ``msgspec`` Structs (instead of into dicts) is what
makes ingest fast and small: msgspec skips every key not named here without
building a Python object for it, and an event costs one small object instead
of a dict of dicts. Argument values are typed loosely (``_Val``) because real
traces disagree about them (AMD writes ``"stream": "0x0"``, some tools write
ids as strings); ``values`` coerces them and counts what it could not use.
An event whose top-level fields have other types sends the whole file to the
slower event-by-event path, which drops (and counts) only that event.

``gc=False``: these records never form reference cycles, and untracked objects
spare the garbage collector tens of thousands of scans per trace.
"""

from __future__ import annotations

from typing import Any

import msgspec

#: An argument value as it appears in real traces.
_Val = int | float | str | None


class Args(msgspec.Struct, gc=False, omit_defaults=True):
    """The ``args`` keys that become columns (see docs/TRACE_TABLE.md)."""

    external_id: _Val = msgspec.field(default=None, name="External id")
    external_id_lc: _Val = msgspec.field(default=None, name="external id")
    correlation: _Val = None
    device: _Val = None
    stream: _Val = None
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(
        default=msgspec.Raw(), name="Input type"
    )
    call_stack: _Val = msgspec.field(default=None, name="Call stack")
    flops: _Val = None
    flops_uc: _Val = msgspec.field(default=None, name="FLOPs")
    bytes: _Val = None
    collective: _Val = msgspec.field(default=None, name="Collective name")
    dtype: _Val = None
    pg_name: _Val = msgspec.field(default=None, name="Process Group Name")
    pg_id: _Val = msgspec.field(default=None, name="Process Group ID")
    in_nelems: _Val = msgspec.field(default=None, name="In msg nelems")
    out_nelems: _Val = msgspec.field(default=None, name="Out msg nelems")
    group_size: _Val = msgspec.field(default=None, name="Group size")
    addr: _Val = msgspec.field(default=None, name="Addr")
    mem_bytes: _Val = msgspec.field(default=None, name="Bytes")
    total_allocated: _Val = msgspec.field(default=None, name="Total Allocated")
    total_reserved: _Val = msgspec.field(default=None, name="Total Reserved")
    device_type: _Val = msgspec.field(default=None, name="Device Type")
    device_id: _Val = msgspec.field(default=None, name="Device Id")
    # only read from ``M`` metadata events
    meta_name: _Val = msgspec.field(default=None, name="name")
    labels: _Val = None


class Event(msgspec.Struct, gc=False):
    """One entry of ``traceEvents``."""

    ph: str | None = None
    name: str | None = None
    cat: str | None = None
    ts: float | str | None = None
    dur: float | str | None = None
    pid: _Val = None
    tid: _Val = None
    id: _Val = None
    # A fresh empty record (made in C) rather than None, so that ingest pulls
    # args fields without a per-event None check.
    args: Args = msgspec.field(default_factory=Args)


class KinetoTrace(msgspec.Struct):
    """The top-level object of a Kineto trace file."""

    traceEvents: list[Event] | None = None
    schemaVersion: Any = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    displayTimeUnit: Any = None
    traceName: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None
    INFO: Any = None
    WARNING: Any = None
    ERROR: Any = None


#: The columns the C scanner (``scan.c``) fills, by kind, in the order of its
#: arrays. Each is named after the ``Event``/``Args`` field that fills it.
SCANNER_COLUMNS = {
    "text": ("ph name cat pid tid input_dims input_types call_stack collective "
             "dtype pg_name pg_id meta_name labels").split(),
    "int": ("pid tid id external_id external_id_lc correlation device stream bytes "
            "in_nelems out_nelems group_size addr mem_bytes total_allocated "
            "total_reserved device_type device_id").split(),
    "float": "ts dur flops flops_uc".split(),
}
#: Version of the scanner's function signatures (``TL_ABI`` in ``scan.c``).
SCANNER_ABI = "1"


def scanner_layout() -> list[str]:
    """The layout the scanner must report (``tl_layout`` in ``scan.c``), as lines.

    Columns in array order, then one line per JSON key of ``Event`` and
    ``Args`` with the columns it fills; key lines are sorted, since only the
    column order is positional.
    """
    head = [f"abi\t{SCANNER_ABI}"]
    head += ["\t".join((kind, *names)) for kind, names in SCANNER_COLUMNS.items()]
    keys = []
    for where, struct in (("event", Event), ("arg", Args)):
        for f in msgspec.structs.fields(struct):
            filled = ["args"] if f.name == "args" else sorted(
                f"{kind}:{f.name}" for kind, names in SCANNER_COLUMNS.items()
                if f.name in names)
            keys.append("\t".join((where, f.encode_name, *filled)))
    return head + sorted(keys)
