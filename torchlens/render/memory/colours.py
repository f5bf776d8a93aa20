"""One colour per memory category, the same in every memory view (the stacked timeline,
the peak section's bar and tables, the diff and per-rank tables): one word, one colour.

Okabe-Ito hues (told apart with colour-blindness) for what a user acts on; a lighter
shade of the same hue for a pass's scratch space (an optimizer or backward temporary
next to its state or gradients); greys for what torchlens could not name. The user's
own regex categories take hues no built-in one uses, in the order the user gave them
(``custom``), or by a hash of the name where a view does not know that order.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from torchlens.analysis.memory import categories as cat
from torchlens.analysis.memory.peak import BEFORE_NO_STACK, UNATTRIBUTED

COLOURS = {
    cat.PARAMETER: "#0072B2",
    cat.GRADIENT: "#56B4E9",
    cat.OPTIMIZER: "#E69F00",
    cat.OPTIMIZER_TEMP: "#F6D48F",
    cat.ACTIVATION: "#009E73",
    cat.BACKWARD: "#9FDCC3",
    cat.INPUT: "#F0E442",
    # torch's memory profiler's own two (``--categories torch``)
    cat.TEMPORARY: "#C7E9C0",
    cat.AUTOGRAD_DETAIL: "#D6EFE6",
    cat.UNKNOWN: "#A8A8A8",
    cat.NO_STACK: "#C8C8C8",
    BEFORE_NO_STACK: "#7A7A7A",
    UNATTRIBUTED: "#E3E3E3",
}
#: the user's categories (none of them a built-in's hue, none a grey)
CUSTOM = ("#CC79A7", "#882255", "#332288", "#AA4499", "#117733", "#999933", "#661100",
          "#6699CC")


def colour_of(name: str, custom: Iterable[str] = ()) -> str:
    """The colour of category ``name``; ``custom``: the user's category names in order."""
    if name in COLOURS:
        return COLOURS[name]
    order = [n for n in custom if n not in COLOURS]
    if name in order:
        return CUSTOM[order.index(name) % len(CUSTOM)]
    return CUSTOM[zlib.crc32(name.encode()) % len(CUSTOM)]


def custom_names(rules: Iterable[tuple[str, str]]) -> list[str]:
    """The user's category names, in their order, from a ``PeakAnalysis.rules``."""
    builtin = {c for c, _t, _w in cat.RULES}
    return [n for n, _why in rules if n not in builtin]
