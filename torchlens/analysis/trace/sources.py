"""Which function of the user's code issued each op (``%%torchprof --stack``).

With ``with_stack`` the profiler records Python calls as ``python_function``
events (``"file.py(12): train_step"``) that enclose the ops they called on the
same thread. An op's source is the innermost enclosing frame that is user code
(``frames.is_user_frame``): the notebook's function, not
``torch/nn/modules/linear.py``. The profiler gives the line where a function
starts, not the line of each call inside it, so a source names a function
(``train_step · cell [3] line 2``), or the cell itself for top-level code.
"""

from __future__ import annotations

import re

import numpy as np

from torchlens.analysis.frames import frame_label, is_user_frame
from torchlens.analysis.trace.events import (
    category_mask,
    enclosing,
    phase_mask,
    sweep_order,
)
from torchlens.model import Trace
from torchlens.model.snapshot import Frame

_KINETO_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<func>.*)$")


def frame_of(name: str) -> Frame | None:
    """A Kineto python_function name as a frame, None for built-ins."""
    m = _KINETO_FRAME.match(name)
    if m is None:
        return None
    # Kineto shortens library paths to "torch/nn/..."; anchor them like absolute
    # paths so the library rules in frames.py apply.
    filename = m["file"] if m["file"].startswith(("/", "<")) else "/" + m["file"]
    return Frame(filename, m["func"], int(m["line"]))


def _label(frame: Frame) -> str:
    where = frame_label(frame)
    if frame.line == 0 or frame.name == "<module>":  # top-level code of a cell/file
        return where.rsplit(" line ", 1)[0].rsplit(":", 1)[0]
    return f"{frame.name} · {where}"


def op_sources(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Label (``cell line 3 (train_step)``) of each op row's user frame, or ""."""
    ev = trace.events
    out = np.full(len(rows), "", dtype=object)
    py = np.flatnonzero(category_mask(trace, "python_function") & phase_mask(trace, "X"))
    if len(py) == 0 or len(rows) == 0:
        return out
    both = np.concatenate([py, rows])
    group = ev["pid"][both] * 1_000_003 + ev["tid"][both]
    ts, dur = ev["ts"][both], ev["dur"][both]
    container = np.arange(len(both)) < len(py)
    parent = enclosing(ts, dur, group, container)

    labels = ev.categories["name"]
    user_label: dict[int, str] = {}
    for code in np.unique(ev["name"][py]).tolist():
        frame = frame_of(labels[code])
        if frame is not None and is_user_frame(frame):
            user_label[code] = _label(frame)
    codes = ev["name"][py].tolist()
    nearest = np.full(len(py), -1, np.int64)  # nearest user frame, self included
    par = parent.tolist()
    for i in sweep_order(ts[: len(py)], dur[: len(py)], group[: len(py)]).tolist():
        if codes[i] in user_label:
            nearest[i] = i
        elif par[i] >= 0:
            nearest[i] = nearest[par[i]]  # parents come first in sweep order
    op_parent = parent[len(py):]
    for j, p in enumerate(op_parent.tolist()):
        if p >= 0 and nearest[p] >= 0:
            out[j] = user_label[codes[nearest[p]]]
    return out
