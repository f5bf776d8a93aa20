"""The saved, re-renderable result. Imports nothing else of torchlens."""

from torchlens.model.errors import FormatVersionError, InputError, TorchlensError
from torchlens.model.payloads import (
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
from torchlens.model.profile import Profile, Trace, error_record
from torchlens.model.store import FORMAT_VERSION, load_profile, save_profile
from torchlens.model.table import Table, encode_text

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
