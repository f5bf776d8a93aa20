"""The columns of an allocator snapshot (``SnapshotColumns``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchlens.model.snapshot import Frame

#: action codes (``e_action``; -1: an action not listed), as ``read.c``'s ACTIONS
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom", "user_defined", "free")
#: block state codes (``b_state``), as ``model.snapshot.BLOCK_STATES``
STATES = ("active_allocated", "active_pending_free", "inactive")


@dataclass
class SnapshotColumns:
    """Trace entries (``e_*``, every device's, in order), segments (``s_*``), their
    blocks (``b_*``; segment k's are ``s_first[k]`` on, ``s_count[k]`` of them) and
    ``stack_items``: each distinct stack once
    (``*_stack`` index it), as indices into ``frames``, each distinct frame dict once
    (numbered by first appearance; ``stack(k)`` gives the list of dicts). An entry's absent ``time_us`` is 0, its absent ``frames``
    the empty stack."""

    e_device: np.ndarray
    e_action: np.ndarray
    e_addr: np.ndarray  # uint64
    e_size: np.ndarray
    e_time: np.ndarray
    e_stack: np.ndarray
    s_addr: np.ndarray
    s_total: np.ndarray
    s_device: np.ndarray
    s_first: np.ndarray
    s_count: np.ndarray
    s_stack: np.ndarray
    b_addr: np.ndarray
    b_size: np.ndarray
    b_state: np.ndarray
    b_stack: np.ndarray
    n_devices: int  # len(device_traces)
    #: each distinct frame once, and each stack as indices into it
    frames: list[Frame] = field(default_factory=list)
    stack_items: list[list[int]] = field(default_factory=list)
    allocator_settings: dict[str, Any] = field(default_factory=dict)
    external_annotations: list[Any] = field(default_factory=list)

    _stacks: dict[int, list[Frame]] = field(default_factory=dict, repr=False, compare=False)

    def stack(self, k: int) -> list[Frame]:
        """Stack ``k`` as the list of frames the loader gives (made on first use:
        the peak reads the frames of a few dozen of a few hundred stacks)."""
        s = self._stacks.get(k)
        if s is None:
            s = self._stacks[k] = [self.frames[i] for i in self.stack_items[k]]
        return s

    def stack_contents(self) -> list[tuple[Frame, ...]]:
        """Each stack by its frames' values (comparing two readers' stacks by content)."""
        return [tuple(self.frames[i] for i in s) for s in self.stack_items]
