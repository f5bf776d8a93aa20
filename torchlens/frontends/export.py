"""Writing a result to a file: the one place that maps a suffix to a format.

Magics (``--export``), the Python API (``result.export``) and the CLI all go
through ``export_profile`` so the formats stay the same everywhere.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from ..model import InputError, Profile

#: Suffix -> what it writes. Checked before a cell runs, so a typo costs nothing.
FORMATS = {
    ".json": "Chrome/Perfetto trace (Kineto JSON as the profiler wrote it)",
    ".json.gz": "Chrome/Perfetto trace, gzipped",
    ".html": "self-contained HTML report (opens with no network)",
    ".tlprof": "saved torchlens result (re-render later with `torchlens report`)",
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
    raw = profile.attachments.get("trace.json")
    if raw is None:
        raise InputError(
            f"cannot export {path!s}: this result holds no profiler trace "
            "(export .html or .tlprof instead)"
        )
    path.write_bytes(gzip.compress(raw) if fmt == ".json.gz" else raw)
    return str(path)
