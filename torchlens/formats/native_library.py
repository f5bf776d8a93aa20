"""Where torchlens' compiled C readers live: a file name carrying a hash of its source.

Two plain-C libraries loaded with ctypes: the trace scanner (``kineto/scan.c``)
and the allocator snapshot reader (``snapshot_columns/read.c``). ``hatch_build.py``
loads this module by path (it needs only the standard library) to name what it
compiles, and each reader's ``native`` module to find it, so a library built
from another version of its source is never picked up: after editing the C
source, an editable install must be rebuilt (``pip install -e .``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

_HERE = Path(__file__).parent


@dataclass
class NativeLibrary:
    """One C reader: its source, shipped in the package, and the prefix of the
    names the build gives its library."""

    source: Path
    prefix: str

    @property
    def pattern(self) -> str:
        """The names of its libraries built from any version of the source."""
        return f"{self.prefix}*.so"

    def library_name(self, source: bytes) -> str:
        """The library file name for this C source."""
        return f"{self.prefix}{hashlib.sha256(source).hexdigest()[:16]}.so"

    def library_path(self) -> Path | None:
        """Where the library built from the installed source would be."""
        try:
            return self.source.with_name(self.library_name(self.source.read_bytes()))
        except OSError:
            return None


SCANNER = NativeLibrary(_HERE / "kineto" / "scan.c", "_scan_")
SNAPSHOT_READER = NativeLibrary(_HERE / "snapshot_columns" / "read.c", "_snapread_")
#: what ``hatch_build.py`` compiles
LIBRARIES = (SCANNER, SNAPSHOT_READER)
