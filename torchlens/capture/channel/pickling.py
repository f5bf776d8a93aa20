"""The job the kernel sends its ranks, pickled with the code's own file names.

Notebook functions travel by value (cloudpickle). From cloudpickle 3.1.3 on,
every code object sent by value says ``co_filename = "<dynamic-code>"`` (a
payload that does not depend on where a function was defined). The ranks
name the user's file or notebook cell from it: the call site of every
collective, the traceback of a rank that raised, the stacks of a hung rank.
So the real name is put back into what cloudpickle would send; with an
older cloudpickle there is nothing to put back.
"""

from __future__ import annotations

import io
import pickle
import types
from collections import ChainMap
from typing import Any

import cloudpickle

_CLOUDPICKLE_NAME = "<dynamic-code>"
_cloudpickle_code = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _code_with_its_file(code: types.CodeType) -> tuple[Any, tuple[Any, ...]]:
    make, args = _cloudpickle_code(code)
    return make, tuple(code.co_filename if a == _CLOUDPICKLE_NAME else a for a in args)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _code_with_its_file},
                              cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, the code objects keeping their file names."""
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()
