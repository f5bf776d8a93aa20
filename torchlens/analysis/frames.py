"""Which Python frames are the user's own code, and how to name them.

Shared by allocation sites (``%%gpumem``) and op sources (``%%torchprof
--stack``): frames in torch, site-packages, torchlens, the standard library,
IPython/ipykernel and C++ are skipped, because "aten::addmm in linear.py" is
the same for every model and says nothing about which line to change.
Notebook cells are named as cells, not as temp files.
"""

from __future__ import annotations

import re
from typing import Any

_NOT_USER = (
    "/torch/", "site-packages/", "dist-packages/", "/torchlens/", "<frozen",
    "/IPython/", "/ipykernel/", "/lib/python3", "<built-in", "/_pytest/",
)
_IPY_INPUT = re.compile(r"^<ipython-input-(\d+)-[0-9a-f]+>$")
_IPYKERNEL = re.compile(r"/ipykernel_\d+/\d+\.py$")


def is_user_frame(frame: dict[str, Any]) -> bool:
    """Whether a frame is the user's own code (a notebook cell or their files)."""
    fn = str(frame.get("filename", ""))
    if not fn or fn == "??":
        return False
    if not (fn.endswith(".py") or fn.startswith("<")):
        return False  # a C++ frame ("RegisterCUDA.cpp", "")
    if _IPYKERNEL.search(fn):
        return True
    return not any(part in fn for part in _NOT_USER)


def frame_label(frame: dict[str, Any]) -> str:
    """``file:line`` with notebook cells shown as ``cell [N] line L``."""
    fn = str(frame.get("filename", ""))
    line = frame.get("line", 0)
    m = _IPY_INPUT.match(fn)
    if m:
        return f"cell [{m.group(1)}] line {line}"
    if _IPYKERNEL.search(fn):
        return f"cell line {line}"
    return f"{fn}:{line}"


def site_of(frames: list[dict[str, Any]]) -> tuple[str, str]:
    """(site label, function name) of an allocation: innermost user frame."""
    for f in frames:
        if is_user_frame(f):
            return frame_label(f), str(f.get("name", ""))
    if frames:
        return "(no user frame) " + frame_label(frames[0]), str(frames[0].get("name", ""))
    return "(no Python stack)", ""
