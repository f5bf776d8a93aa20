"""Counted nouns for sentences the user reads: "1 sync", "3 syncs"."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word``, in the plural (``many``, else ``word + "s"``) unless
    ``n`` is 1; ``n`` is written with thousands separators."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"
