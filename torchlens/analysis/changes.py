"""What counts as a change between two figures, for every diff (traces and memory).

One notion of "same" and "small" for ``torchlens diff`` whatever it compares:
a change within ``same_pct`` % of A's figure is ``same``; one beyond that but
within ``small`` (an absolute amount: 10 µs per step for time, a share of the
peak for memory) is ``small``, too little to matter (20 -> 12 µs is -40%, yet
nothing a user would chase); only a change beyond both counts, with the
caller's word for its direction (slower / faster, grew / shrank). A figure
present on one side only is ``added`` or ``removed``.
"""

from __future__ import annotations

SAME, SMALL, ADDED, REMOVED = "same", "small", "added", "removed"


def change_status(a: float, b: float, *, in_a: bool, in_b: bool, same_pct: float,
                  small: float, up: str, down: str) -> str:
    """The status of A's figure ``a`` becoming B's ``b`` (``in_a`` / ``in_b``:
    whether each side has it at all); ``up`` / ``down``: the words for a real
    change upwards and downwards."""
    if in_b and not in_a:
        return ADDED
    if in_a and not in_b:
        return REMOVED
    delta = b - a
    if not delta or (a and abs(100.0 * delta / a) <= same_pct):
        return SAME
    if abs(delta) <= small:
        return SMALL
    return up if delta > 0 else down
