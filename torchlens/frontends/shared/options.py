"""Words for an option a command or a magic did not take, with the one meant."""

from __future__ import annotations

import argparse
import difflib


def unrecognized(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's words for arguments no parser took, with the option each
    mistyped one was likely meant to be (``--josn``: ``--json``)."""
    known = [s for action in parser._actions for s in action.option_strings
             if s.startswith("--")]
    meant = []
    for word in extras:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.6)
            meant += [(word, close[0])] if close else []
    said = f"unrecognized arguments: {' '.join(extras)}"
    if len(meant) == 1:
        return f"{said}; did you mean {meant[0][1]}?"
    if meant:
        return f"{said}; did you mean {', '.join(f'{m} for {w}' for w, m in meant)}?"
    return said
