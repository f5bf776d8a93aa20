"""An allocator snapshot as columns: what the peak reads, without a dict per entry.

``native.read`` walks the pickle's opcodes in C (``read.c``) and declines (None)
whatever it does not take; ``python_reader.from_snapshot`` makes the same columns
from the snapshot the Python loader normalized. Tests hold the two equal.
"""

from torchlens.formats.snapshot_columns.columns import ACTIONS, STATES, SnapshotColumns

__all__ = ["ACTIONS", "STATES", "SnapshotColumns"]
