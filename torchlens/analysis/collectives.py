"""Where the collective sequences of ranks diverge (read by the DDP checklist).

A fingerprint is what a worker records per collective (see
``torchlens.formats.fingerprints``, which also words one and compares one
index across ranks, as ``--strict`` does while the job runs);
``sequence_divergence`` reads every rank's whole sequence afterwards. Plain
dicts in, plain dicts out: no torch here.
"""

from __future__ import annotations

from typing import Any

from ..formats.fingerprints import first_difference
from ..formats.locations import split_location


def _signature(fp: dict[str, Any]) -> tuple[Any, ...]:
    return (fp.get("op"), [list(s) for s in fp.get("shapes", [])], list(fp.get("dtypes", [])))


def _skipped(a: list[dict[str, Any]], b: list[dict[str, Any]], i: int) -> bool:
    """Does ``b`` look like ``a`` with collective ``i`` left out?"""
    rest_a, rest_b = a[i + 1: i + 4], b[i: i + 3]
    return bool(rest_b) and len(rest_a) >= len(rest_b) and all(
        _signature(x) == _signature(y) for x, y in zip(rest_a, rest_b, strict=False))


def _went_ahead(mine: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """Did this rank issue its collective from a later line of the same file (or cell)?

    When a rank skips a collective, its next one comes from further down the
    code than the peer's, which is all a --strict run (stopped at the first
    divergence) can show.
    """
    fa, la = split_location(str(mine.get("line") or ""))
    fb, lb = split_location(str(theirs.get("line") or ""))
    return bool(fa) and fa == fb and la is not None and lb is not None and la > lb


def sequence_divergence(fingerprints: list[list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The first collective index where ranks' sequences (one list per rank, in
    issue order) differ, or None if they agree."""
    seqs = [list(s or []) for s in fingerprints]
    if len(seqs) < 2:
        return None
    longest = max(len(s) for s in seqs)
    for i in range(longest):
        have = {r: s[i] for r, s in enumerate(seqs) if i < len(s)}
        missing = [r for r, s in enumerate(seqs) if i >= len(s)]
        diff = first_difference(have)
        if diff is None and not missing:
            continue
        skipped = []
        if diff is not None:
            ranks = sorted(have)
            for r in ranks:
                for q in ranks:
                    if q != r and r not in skipped and (
                            _skipped(seqs[q], seqs[r], i) or _went_ahead(have[r], have[q])):
                        skipped.append(r)
        return {"index": i, "fingerprints": have, "missing": missing,
                "difference": diff, "skipped": skipped}
    return None
