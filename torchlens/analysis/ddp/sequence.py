"""Where the collective sequences of ranks diverge (read by the DDP checklist).

A fingerprint is what a worker records per collective (see
``torchlens.formats.fingerprints``, which also words one and compares one
index across ranks, as ``--strict`` does while the job runs);
``sequence_divergence`` reads every rank's whole sequence afterwards and
answers a ``Divergence``: no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchlens.formats.fingerprints import first_difference
from torchlens.model.collectives import Difference, Fingerprint


@dataclass
class Skip:
    """A rank left out a peer's collective: the peer, the index in the peer's
    sequence, and that collective's fingerprint."""

    peer: int
    index: int
    fingerprint: Fingerprint


@dataclass
class Divergence:
    """The first collective index where the ranks' sequences differ: each rank's
    fingerprint there (rank -> fingerprint), the ranks that issued none, how the
    fingerprints differ (``first_difference``'s answer, None when they agree),
    and the ranks that skipped a peer's collective (``skips``: which one)."""

    index: int
    fingerprints: dict[int, Fingerprint]
    missing: list[int]
    difference: Difference | None
    skipped: list[int]
    skips: dict[int, Skip]


def _signature(fp: Fingerprint) -> tuple[str, list[list[int]], list[str], str | None]:
    return (fp.op, [list(s) for s in fp.shapes], list(fp.dtypes), fp.module_name)


def _where(fp: Fingerprint) -> tuple[str, str | None] | None:
    """Where a collective came from: its line, and under FSDP its module (one
    forward line issues every layer's all_gather)."""
    if not fp.line and not fp.module_name:
        return None
    return (fp.line, fp.module_name)


def _skipped(a: list[Fingerprint], b: list[Fingerprint], i: int) -> bool:
    """Does ``b`` look like ``a`` with collective ``i`` left out?"""
    rest_a, rest_b = a[i + 1: i + 4], b[i: i + 3]
    return bool(rest_b) and len(rest_a) >= len(rest_b) and all(
        _signature(x) == _signature(y) for x, y in zip(rest_a, rest_b, strict=False))


def _left_out(mine: list[Fingerprint], theirs: list[Fingerprint], upto: int) -> int | None:
    """The index ``j <= upto`` of ``theirs`` that ``mine`` left out, or None.

    The evidence of a skip is in the next collectives: at ``j`` the two ranks
    issue from different lines (or FSDP modules), and my ``#j`` is the peer's
    ``#j+1`` (same op, tensors, line and module). That survives --strict,
    which stops the run at the first *signature* difference: a skipped collective that looked like the
    next one (gloo paired them) shows up there one index late. Without it, a
    mismatch is only a mismatch: the ops (or shapes) differ.
    """
    for j in range(min(upto + 1, len(mine), len(theirs) - 1)):
        a, b, after = mine[j], theirs[j], theirs[j + 1]
        where = _where(a)
        if (where and where != _where(b) and where == _where(after)
                and _signature(a) == _signature(after)):
            return j
    return None


def sequence_divergence(fingerprints: list[list[Fingerprint]]) -> Divergence | None:
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
        skipped: list[int] = []
        skips: dict[int, Skip] = {}  # rank -> which peer's collective it left out
        for r in sorted(have):
            for q in range(len(seqs)):
                if q == r or r in skips:
                    continue
                j = _left_out(seqs[r], seqs[q], i)
                if j is None and diff is not None and q in have and _skipped(seqs[q], seqs[r], i):
                    j = i
                if j is not None:
                    skips[r] = Skip(peer=q, index=j, fingerprint=seqs[q][j])
                    skipped.append(r)
        return Divergence(index=i, fingerprints=have, missing=missing, difference=diff,
                          skipped=skipped, skips=skips)
    return None
