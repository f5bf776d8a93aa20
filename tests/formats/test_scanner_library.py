"""The compiled scanner is used only when it is the one this source describes.

A library whose column layout differs from ``schema.SCANNER_COLUMNS`` would
fill the wrong columns silently, so the loader refuses it (one warning naming
the file and what to do) and every trace takes the Python reader.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from torchlens.formats.kineto import ingest_bytes, native, schema
from torchlens.formats.native_library import SCANNER

CC = shutil.which("cc")


def _read_with(lib, data: bytes, monkeypatch: pytest.MonkeyPatch):
    """``ingest_bytes`` with ``lib`` as the loaded scanner (None: none loaded)."""
    with monkeypatch.context() as m:
        m.setattr(native, "_LIB", lib)
        m.delenv("TORCHLENS_NO_NATIVE", raising=False)
        return native.native_columns(data), ingest_bytes(data, "t")


def _compile(tmp_path: Path, c_source: str) -> Path:
    src, lib = tmp_path / "foreign.c", tmp_path / "foreign.so"
    src.write_text(c_source)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def test_layouts_agree():
    lib = native._load()
    assert lib is not None, "scanner not built (pip install -e . compiles it)"
    assert native._layout(lib) == schema.scanner_layout()


def test_library_name_follows_the_c_source():
    a = SCANNER.library_name(b"int x;")
    assert a != SCANNER.library_name(b"int y;")
    assert Path(a).match(SCANNER.pattern)
    assert SCANNER.library_path().name == SCANNER.library_name(
        SCANNER.source.read_bytes())


def test_mismatching_layout_is_refused_and_python_reader_used(traces_dir, monkeypatch):
    expected = schema.scanner_layout()
    expected[1] = expected[1].replace("\tname\tcat", "\tcat\tname")  # two columns swapped
    with pytest.warns(RuntimeWarning, match=r"not using the C trace scanner .*"
                      r"column layout differs.*reinstall torchlens"):
        lib = native._load(expected=expected)
    assert lib is None
    data = gzip.decompress((traces_dir / "a100_simple_add.json.gz").read_bytes())
    columns, trace = _read_with(lib, data, monkeypatch)
    assert columns is None  # the Python reader read it
    monkeypatch.setenv("TORCHLENS_NO_NATIVE", "1")
    reference = ingest_bytes(data, "t")
    for name, want in reference.events.columns.items():
        assert np.array_equal(trace.events.columns[name], want,
                              equal_nan=want.dtype.kind == "f"), name


def test_not_a_shared_library_is_refused(tmp_path):
    bogus = tmp_path / SCANNER.library_name(b"whatever")
    bogus.write_bytes(b"this is not an ELF file\n")
    with pytest.warns(RuntimeWarning, match=r"not a loadable shared library"):
        assert native._load(bogus) is None


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_foreign_library_without_layout_is_refused(tmp_path):
    lib = _compile(tmp_path, "int tl_scan(void) { return 0; }\n")
    with pytest.warns(RuntimeWarning, match=r"does not report a layout"):
        assert native._load(lib) is None


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_foreign_library_with_other_layout_is_refused(tmp_path):
    lib = _compile(tmp_path, (
        "#include <stdint.h>\n#include <string.h>\n"
        "int64_t tl_layout(char *out, int64_t cap) {\n"
        '  const char *s = "abi\\t1\\ntext\\tph\\n";\n'
        "  if ((int64_t)strlen(s) < cap) strcpy(out, s);\n"
        "  return (int64_t)strlen(s);\n}\n"))
    with pytest.warns(RuntimeWarning, match=rf"{lib.name}: its column layout differs"):
        assert native._load(lib) is None


def test_library_from_older_source_is_not_loaded(tmp_path, monkeypatch):
    """Only a stale build beside scan.c: warned about, not loaded."""
    source = tmp_path / "scan.c"
    source.write_bytes(b"/* edited */\n")
    (tmp_path / SCANNER.library_name(b"/* before */\n")).write_bytes(b"")
    monkeypatch.setattr(SCANNER, "source", source)
    with pytest.warns(RuntimeWarning, match=r"built from another version of scan.c"):
        assert native._load() is None
