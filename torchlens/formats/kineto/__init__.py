"""Kineto (``torch.profiler``) trace JSON, plain or gzip, to a columnar ``Trace``.

``load_trace(path)`` reads a file, ``ingest_bytes(data, source)`` bytes already
in memory; ``native_available()`` says whether the compiled scanner
(``scan.c``) is loaded or every trace takes the Python path.
"""

from torchlens.formats.kineto.native import available as native_available
from torchlens.formats.kineto.reader import ingest_bytes, load_trace

__all__ = ["ingest_bytes", "load_trace", "native_available"]
