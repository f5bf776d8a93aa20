"""The collective fingerprint: what a DDP worker records per collective.

A fingerprint is a plain dict (``index``, ``op``, ``shapes``, ``dtypes``, the
issuing ``line``) that workers exchange while the job runs and save with the
result. It lives here, beside the other formats torchlens reads, because both
sides use it: ``capture.ddp`` compares one index across ranks before the
collective runs (``--strict``), ``analysis.ddp.sequence`` compares whole
sequences afterwards, and both word one the same way.
"""

from __future__ import annotations

from typing import Any


def describe_collective(fp: dict[str, Any] | None) -> str:
    """One collective as a user reads it: ``#3 all_reduce float32[4] at cell [2] line 7``."""
    if not fp:
        return "nothing"
    tensors = ", ".join(
        f"{d}[{'x'.join(str(s) for s in shape)}]"
        for shape, d in zip(fp.get("shapes", []), fp.get("dtypes", []), strict=False)
    )
    text = f"#{fp.get('index')} {fp.get('op')}"
    if tensors:
        text += f" {tensors}"
    if fp.get("module"):
        text += f" of FSDP module {fp['module']}"
    if fp.get("line"):
        text += f" at {fp['line']}"
    return text


def first_difference(fps: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
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
        values = {r: fps[r].get(what) for r in ranks}
        if any(v != values[ranks[0]] for v in values.values()):
            return {"what": what, "values": values, "reference_rank": ranks[0],
                    "index": ref.get("index")}
    return None
