"""Where the compiled scanner lives: a file name carrying a hash of ``scan.c``.

``hatch_build.py`` loads this module by path (it needs only the standard
library) to name what it compiles, and ``native`` to find it, so a library
built from another version of ``scan.c`` is never picked up: after editing the
C source, an editable install must be rebuilt (``pip install -e .``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: The C source, shipped in the package next to this file.
SOURCE = Path(__file__).with_name("scan.c")
#: Names the build gives the library (any source version).
PATTERN = "_scan_*.so"


def library_name(source: bytes) -> str:
    """The library file name for this C source."""
    return f"_scan_{hashlib.sha256(source).hexdigest()[:16]}.so"


def library_path() -> Path | None:
    """Where the library built from the installed ``scan.c`` would be."""
    try:
        return SOURCE.with_name(library_name(SOURCE.read_bytes()))
    except OSError:
        return None
