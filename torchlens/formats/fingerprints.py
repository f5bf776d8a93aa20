"""The collective fingerprint as a user reads it, and how one index differs
across ranks.

The fingerprint itself (``model.collectives.Fingerprint``: ``index``, ``op``,
``shapes``, ``dtypes``, the issuing ``line``) is what workers exchange while
the job runs and save with the result. Its wording and comparison live here,
beside the other formats torchlens reads, because both sides use them:
``capture.ddp`` compares one index across ranks before the collective runs
(``--strict``), ``analysis.ddp.sequence`` compares whole sequences
afterwards, and both word one the same way.
"""

from __future__ import annotations

from torchlens.model.collectives import Difference, Fingerprint
from torchlens.model.messages import LastCollective


def describe_collective(fp: Fingerprint | LastCollective | None) -> str:
    """One collective as a user reads it: ``#3 all_reduce float32[4] at cell [2] line 7``.

    A heartbeat's ``LastCollective`` has no tensors: it reads without them."""
    if fp is None:
        return "nothing"
    shapes, dtypes = (fp.shapes, fp.dtypes) if isinstance(fp, Fingerprint) else ([], [])
    tensors = ", ".join(
        f"{d}[{'x'.join(str(s) for s in shape)}]"
        for shape, d in zip(shapes, dtypes, strict=False)
    )
    text = f"#{fp.index} {fp.op}"
    if tensors:
        text += f" {tensors}"
    module = fp.module_name if isinstance(fp, Fingerprint) else fp.module
    if module:
        text += f" of FSDP module {module}"
    if fp.line:
        text += f" at {fp.line}"
    return text


def first_difference(fps: dict[int, Fingerprint]) -> Difference | None:
    """How the fingerprints of one collective index differ across ranks, or None.

    Compares op, shapes and dtypes (what must match for the collective to be
    valid) and the FSDP module it moves (equal layers give equal shapes: a
    different module is a skipped or extra layer); the issuing line may
    legitimately differ between ranks.
    """
    ranks = sorted(fps)
    if not ranks:
        return None
    ref = fps[ranks[0]]
    for what in ("op", "shapes", "dtypes", "module"):
        values = {r: (fps[r].module_name if what == "module" else getattr(fps[r], what))
                  for r in ranks}
        if any(v != values[ranks[0]] for v in values.values()):
            return Difference(what=what, values=values, reference_rank=ranks[0],
                              index=ref.index)
    return None
