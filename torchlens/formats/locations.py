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
collectives (``capture.ddp``, ``analysis.ddp.sequence``): one way to name a
place in the user's code.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sysconfig
from collections.abc import Mapping


def _library_dirs() -> tuple[str, ...]:
    """Where library code really lives on this machine: this package, torch,
    IPython and friends (found without importing them), the interpreter's
    standard library and its site-packages. Decided by location rather than by
    a folder's name, so a user's clone named ``torchlens`` (what ``git clone``
    gives) or a project folder named ``torch`` stays the user's own code."""
    dirs = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    for name in ("torch", "IPython", "ipykernel", "_pytest", "pytest", "pluggy"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            dirs.add(os.path.abspath(loc))
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(os.path.abspath(path))
    return tuple(sorted(d.rstrip(os.sep) + os.sep for d in dirs))


_LIBRARY_DIRS = _library_dirs()
#: what only an installed library's path looks like, for frames recorded on
#: another machine (a snapshot or trace from someone else's GPU run), whose
#: files are not here to be located
_INSTALLED = re.compile(
    r"site-packages/|dist-packages/|/lib/python3(\.\d+)?/|^<frozen|^<built-in"
    r"|typing_extensions\.py$")
#: names of torch's own source tree, for frames recorded on another machine
#: from a source build of torch (``/opt/pytorch/torch/nn/modules/linear.py``)
_TORCH_SOURCE = re.compile(r"/torch/(nn|autograd|utils|optim|distributed|cuda|_\w+|amp|"
                           r"profiler|functional\.py|overrides\.py|serialization\.py)")

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
    if _INSTALLED.search(filename):
        return False
    if os.path.isabs(filename) and os.path.exists(filename):
        return not os.path.abspath(filename).startswith(_LIBRARY_DIRS)
    return not _TORCH_SOURCE.search(filename)  # recorded elsewhere: judged by its name


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
