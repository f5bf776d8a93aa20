"""Where a line of Python lives, as a user reads it.

IPython names the code of a cell after a temp file or a pseudo-file: a kernel
compiles cell ``In[N]`` as ``/tmp/ipykernel_<pid>/<hash>.py`` (the hash is of
the code, not N), a terminal shell as ``<ipython-input-N-<hash>>``. Both are
shown as ``cell [N] line L``; the kernel's names need the shell's own table
of file name -> N (``shell.compile._filename_map``), which only the kernel
has, so whoever labels a location in another process (a ``%ddp_check`` rank)
is handed that table. Library code (torch, site-packages, torchlens, the
standard library, IPython) is never the user's line.

Used by allocation sites and op sources (``analysis.frames``) and by DDP
collectives (``capture.ddp``, ``analysis.collectives``): one way to name a
place in the user's code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_NOT_USER = (
    "/torch/", "site-packages/", "dist-packages/", "/torchlens/", "<frozen",
    "/IPython/", "/ipykernel/", "/lib/python3", "<built-in", "/_pytest/",
    "typing_extensions.py",
)
_IPY_INPUT = re.compile(r"^<ipython-input-(\d+)-[0-9a-f]+>$")
_IPYKERNEL = re.compile(r"/ipykernel_\d+/\d+\.py$")

#: file name -> execution count of the cell compiled under that name
CellNames = Mapping[str, int]


def is_cell(filename: str) -> bool:
    """Whether ``filename`` is IPython's name for a cell's code."""
    return bool(_IPY_INPUT.match(filename) or _IPYKERNEL.search(filename))


def is_user_file(filename: str) -> bool:
    """Whether code compiled under ``filename`` is the user's own (a cell or their files)."""
    if not filename or filename == "??":
        return False
    if not (filename.endswith(".py") or filename.startswith("<")):
        return False  # a C++ frame ("RegisterCUDA.cpp", "")
    if is_cell(filename):
        return True
    return not any(part in filename for part in _NOT_USER)


def cell_number(filename: str, cells: CellNames | None = None) -> int | None:
    """The ``In[N]`` a cell's file name stands for, or None when unknown."""
    if cells and filename in cells:
        return int(cells[filename])
    m = _IPY_INPUT.match(filename)
    return int(m.group(1)) if m else None


def location_label(filename: str, line: int | str | None,
                   cells: CellNames | None = None) -> str:
    """``file:line``, with a notebook cell's code shown as ``cell [N] line L``.

    ``cells`` is the shell's table of cell file names (see the module
    docstring); without it a kernel's cell whose number is unknown reads
    ``cell line L`` rather than a temp file's path.
    """
    fn = str(filename or "")
    n = cell_number(fn, cells)
    if n is not None:
        return f"cell [{n}] line {line}"
    if _IPYKERNEL.search(fn):
        return f"cell line {line}"
    return f"{fn}:{line}"


_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def label_cells_in(text: str, cells: CellNames | None = None) -> str:
    """A traceback or faulthandler dump with each cell's ``File "<temp>", line L``
    written ``cell [N] line L``; other files are left as they are."""
    def label(m: re.Match[str]) -> str:
        fn = m.group(1)
        return location_label(fn, m.group(2), cells) if is_cell(fn) else m.group(0)

    return _FILE_LINE.sub(label, text or "")
