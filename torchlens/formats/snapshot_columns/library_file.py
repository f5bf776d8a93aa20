"""Where the compiled snapshot reader lives: a file name carrying a hash of ``read.c``.

``hatch_build.py`` loads this module by path (standard library only) to name what it
compiles, and ``native`` to find it, so a library built from another version of
``read.c`` is never loaded (as ``formats/kineto/scanner_file.py`` for ``scan.c``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: The C source, shipped in the package next to this file.
SOURCE = Path(__file__).with_name("read.c")
#: Names the build gives the library (any source version).
PATTERN = "_snapread_*.so"


def library_name(source: bytes) -> str:
    """The library file name for this C source."""
    return f"_snapread_{hashlib.sha256(source).hexdigest()[:16]}.so"


def library_path() -> Path | None:
    """Where the library built from the installed ``read.c`` would be."""
    try:
        return SOURCE.with_name(library_name(SOURCE.read_bytes()))
    except OSError:
        return None
