"""Which Python frames are the user's own code, and how to name them.

Shared by allocation sites (``%%gpumem``) and op sources (``%%torchprof
--stack``): frames in torch, site-packages, torchlens, the standard library,
IPython/ipykernel and C++ are skipped, because "aten::addmm in linear.py" is
the same for every model and says nothing about which line to change.
Notebook cells are named as cells, not as temp files
(``formats.locations``: the same names DDP collectives get).
"""

from __future__ import annotations

from torchlens.formats.locations import CellNames, is_user_file, location_label
from torchlens.model.snapshot import Frame


def is_user_frame(frame: Frame) -> bool:
    """Whether a frame is the user's own code (a notebook cell or their files)."""
    return is_user_file(frame.filename)


def frame_label(frame: Frame, cells: CellNames | None = None) -> str:
    """``file:line`` with notebook cells shown as ``cell [N] line L``
    (``formats.locations.location_label``, which DDP collectives use too)."""
    return location_label(frame.filename, frame.line, cells)


def site_of(frames: list[Frame], cells: CellNames | None = None) -> tuple[str, str]:
    """(site label, function name) of an allocation: innermost user frame.

    ``cells``: the shell's cell file names -> In[N] (``GpumemPayload.cells``)."""
    for f in frames:
        if is_user_frame(f):
            return frame_label(f, cells), f.name
    # the innermost Python frame (torch's own, say): C++ frames name no line a user
    # can change ("??:0", "memory_snapshot.cpp:0"), so a stack of those alone, as
    # the autograd engine's threads and a snapshot's segment blocks record, has
    # no Python stack, in the words every view uses for an empty one
    for f in frames:
        if f.filename.endswith(".py"):
            return "(no user frame) " + frame_label(f, cells), f.name
    return "(no Python stack)", frames[0].name if frames else ""


class SiteMemo:
    """``site_of`` for the many stacks of one trace, each distinct stack judged once.

    A snapshot shares one ``Frame`` per distinct frame between all the stacks
    that hold it (417k frames walked for 6.8k allocations, a few hundred distinct
    stacks), so a stack is keyed by its frames' ids. Each key keeps its frames
    alive, so an id is never reused while the memo lives; the memo lives for one
    analysis (files may appear on disk between two, and ``is_user_file`` looks)."""

    def __init__(self, cells: CellNames | None = None) -> None:
        self.cells = cells
        self._memo: dict[tuple[int, ...], tuple[tuple[str, str], list[Frame]]] = {}
        #: by the list's own id first: a loaded snapshot has one list per distinct stack
        #: (``model.snapshot._frames``), so most lookups build no key
        self._lists: dict[int, tuple[tuple[str, str], list[Frame]]] = {}

    def __call__(self, frames: list[Frame]) -> tuple[str, str]:
        hit = self._lists.get(id(frames))
        if hit is None:
            key = tuple(map(id, frames))
            hit = self._memo.get(key)
            if hit is None:
                hit = self._memo[key] = (site_of(frames, self.cells), frames)
            self._lists[id(frames)] = (hit[0], frames)
        return hit[0]
