"""torchlens: profile and debug PyTorch training from inside Jupyter.

``%load_ext torchlens`` registers the magics. The same captures are available
from Python as context managers, e.g. ``with torchlens.torchprof() as result:``.
"""

from __future__ import annotations

from typing import Any

from ._version import __version__
from .model import InputError, Profile, TorchlensError, load_profile

__all__ = [
    "InputError",
    "Profile",
    "TorchlensError",
    "__version__",
    "load",
    "load_ipython_extension",
    "torchprof",
]


def load(path: str) -> Profile:
    """Load a saved ``.tlprof`` result."""
    return load_profile(path)


def torchprof(**options: Any) -> Any:
    """Context manager that profiles its body; see ``capture.profiler``."""
    from .capture.profiler import torchprof as _torchprof

    return _torchprof(**options)


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext torchlens``: registers the magics."""
    from .frontends.magics import register

    register(ipython)
