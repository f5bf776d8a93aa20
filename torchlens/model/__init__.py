"""The saved, re-renderable result. Imports nothing else of torchlens."""

from .errors import FormatVersionError, InputError, TorchlensError
from .payloads import (
    PAYLOADS,
    DdpRun,
    GpumemPayload,
    MemoryOptions,
    OpDisplay,
    Payload,
    ProfilerOptions,
    TorchprofPayload,
    TracePayload,
)
from .profile import Profile, Trace, error_record
from .store import FORMAT_VERSION, load_profile, save_profile
from .table import Table, encode_text

__all__ = [
    "PAYLOADS",
    "DdpRun",
    "GpumemPayload",
    "MemoryOptions",
    "OpDisplay",
    "Payload",
    "ProfilerOptions",
    "TorchprofPayload",
    "TracePayload",
    "FORMAT_VERSION",
    "FormatVersionError",
    "InputError",
    "Profile",
    "Table",
    "TorchlensError",
    "Trace",
    "encode_text",
    "error_record",
    "load_profile",
    "save_profile",
]
