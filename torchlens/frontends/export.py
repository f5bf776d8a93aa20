"""Writing a result to a file: the one place that maps a suffix to a format.

Magics (``--export``), the Python API (``result.export``) and the CLI all go
through ``export_profile`` so the formats stay the same everywhere.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import Any

from ..model import InputError, Profile

#: Suffix -> what it writes. Checked before a cell runs, so a typo costs nothing.
FORMATS = {
    ".json": "Chrome/Perfetto trace (Kineto JSON as the profiler wrote it)",
    ".json.gz": "Chrome/Perfetto trace, gzipped",
    ".html": "self-contained HTML report (opens with no network)",
    ".tlprof": "saved torchlens result (re-render later with `torchlens report`)",
    ".pickle": "allocator snapshot in torch's format (memory_viz, torch.cuda._memory_viz)",
}


def export_format(path: str | Path) -> str:
    """The suffix key of ``path`` in FORMATS, or an InputError naming the choices."""
    name = str(path).lower()
    for suffix in sorted(FORMATS, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix
    raise InputError(
        f"cannot export to {path!s}: unknown file type; use one of "
        + ", ".join(FORMATS)
    )


def check_export_path(path: str | Path) -> None:
    """Fail early (before any capture) on a bad suffix or a missing folder."""
    export_format(path)
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise InputError(f"cannot export to {path!s}: folder {parent} does not exist")


def export_profile(profile: Profile, path: str | Path) -> str:
    """Write ``profile`` to ``path`` in the format its suffix names."""
    fmt = export_format(path)
    path = Path(path).expanduser()
    if fmt == ".tlprof":
        return profile.save(str(path))
    if fmt == ".html":
        from ..render.report import render_report

        path.write_text(render_report(profile), encoding="utf-8")
        return str(path)
    if fmt == ".pickle":
        return _write_snapshot(profile, path)
    raw = profile.attachments.get("trace.json")
    if raw is None:
        raise InputError(
            f"cannot export {path!s}: this result holds no profiler trace "
            "(export .html or .tlprof instead)"
        )
    path.write_bytes(gzip.compress(raw) if fmt == ".json.gz" else raw)
    return str(path)


def _builtins_only(obj: Any) -> Any:
    """A copy made of dicts, lists, tuples, str, int, float, bool and None only,
    so the file loads with an unpickler that refuses every global."""
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, (int, str)) else k: _builtins_only(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_builtins_only(v) for v in obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def _write_snapshot(profile: Profile, path: Path) -> str:
    """The profile's snapshot as torch writes it (``_dump_snapshot``: a pickled dict).

    A CPU capture has no CUDA segments: its file holds the CPU allocator's
    trace and, as ``segments``, what the allocator model would hold after it
    (``allocator_settings`` says which setting), so memory_viz draws both.
    """
    if not profile.snapshots:
        raise InputError(f"cannot export {path!s}: this result holds no allocator snapshot")
    snap = dict(next(iter(profile.snapshots.values())))
    if profile.kind == "gpumem" and profile.extra.get("measured_on") == "cpu":
        from ..render.memory import analysis_of

        model = analysis_of(profile).model
        if model is not None:
            snap["segments"] = model.snapshot["segments"]
            snap["allocator_settings"] = model.snapshot["allocator_settings"]
    path.write_bytes(pickle.dumps(_builtins_only(snap), protocol=4))
    return str(path)
