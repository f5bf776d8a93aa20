"""A snapshot file as a result's parts: its columns for the peak, its Profile.

``api.load_gpumem`` reads a file with the compiled reader when it takes it
(``columns_of``): ``result.peak()`` and ``result.categories()`` then come from the
columns, and the Profile (``profile_of``, by the Python loader) is made from the
same bytes only when something else of the result is asked for.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torchlens.formats.gpumem_record import RECORD_KEY, restore
from torchlens.formats.snapshot_columns import SnapshotColumns, native
from torchlens.model import GpumemPayload, Profile
from torchlens.model.snapshot import normalize_snapshot


def columns_of(path: str) -> tuple[bytes, SnapshotColumns] | None:
    """(the file's bytes, their columns) when the compiled reader takes the file; None
    otherwise (not built, TORCHLENS_NO_NATIVE, a torchlens export, any file it declines:
    the Python loader then reads it and says what is wrong). The settings are checked
    here as the Python loader checks them, so a file fails to load the same either way."""
    if not native.available():
        return None
    try:
        data = Path(path).read_bytes()
    except (OSError, TypeError):
        return None
    cols = native.read(data, RECORD_KEY)
    if cols is None:
        return None
    normalize_snapshot({"segments": [], "allocator_settings": cols.allocator_settings},
                       name=str(path))
    return data, cols


def profile_of(snap: dict[str, Any], path: str, name: str,
               display: GpumemPayload) -> Profile:
    """The Profile of a loaded snapshot (a %%gpumem export: the capture itself)."""
    capture, damaged = restore(snap, display)
    if capture is not None:
        return Profile(kind="gpumem", title=name, source=str(path),
                       snapshots={"file": capture.snapshot}, payload=capture.payload,
                       unmeasured=capture.unmeasured, error=capture.error)
    snap.pop(RECORD_KEY, None)
    return Profile(kind="gpumem", title=name, source=str(path), snapshots={"file": snap},
                   unmeasured=[damaged] if damaged else [],
                   payload=dataclasses.replace(display, measured_on="snapshot"))
