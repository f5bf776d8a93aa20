"""What a file holds, by its name and first bytes: a saved result, an allocator
snapshot or a Kineto trace. ``torchlens.load``, the command line and a memory
result's ``diff`` all ask it, so a file is read as the same thing everywhere.
"""

from __future__ import annotations

from pathlib import Path

from torchlens.formats.input_files import open_guarded
from torchlens.model import InputError

#: the ``format`` a run folder's ``manifest.json`` names (``run_folder.manifest``);
#: here so a trace reader can tell a manifest given as a trace without importing it
RUN_FORMAT = "torchlens-run"

_ZIP = b"PK\x03\x04"
_PICKLE = b"\x80"  # protocol 2 and later start with PROTO


def file_kind(path: Path) -> str:
    """What a file holds: ``tlprof``, ``snapshot`` or ``trace`` (see the module doc)."""
    name = path.name.lower()
    if name.endswith(".tlprof"):
        return "tlprof"
    if name.endswith((".pickle", ".pkl")):
        return "snapshot"
    if name.endswith((".json", ".json.gz")):
        return "trace"
    try:
        with open_guarded(path) as fh:  # a FIFO or a device is refused, not read
            head = fh.read(4)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc}).") from None
    if head.startswith(_ZIP):
        return "tlprof"
    if head.startswith(_PICKLE):
        return "snapshot"
    if head.lstrip()[:1] in (b"{", b"") or head.startswith(b"\x1f\x8b"):  # JSON, gzip
        return "trace"
    raise InputError(f"{path}: not a file torchlens reads (by its name and first bytes): "
                     "give a saved result (.tlprof), a Kineto trace (.json, .json.gz), an "
                     "allocator snapshot (.pickle) or a run folder.")
