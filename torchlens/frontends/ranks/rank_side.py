"""The rank side of per-rank profiling: a profiled rank summarises its own
steps, for ``%ddp_check --profile`` and ``torchlens run`` alike.

Why a front end: the summariser is analysis (``analysis.ranks.summary``) and
the rank's capture (``capture.ddp.worker``, ``capture.ranks.attach``) may not
import analysis; this module wires the two, once for both ways a rank starts.

``python -m torchlens.frontends.ranks.rank_side HOST PORT RANK WORLD`` is the
entry point of a ``%ddp_check --profile`` rank; ``attach()`` is what
``torchlens.step()`` calls in a ``torchlens run`` rank.
"""

from __future__ import annotations

import sys
from typing import Any


def summarize_file(path: str, **where: Any) -> dict[str, Any]:
    """Read one exported Kineto trace (C scanner) and summarise it (<= 64 KB)."""
    from torchlens.analysis.ranks.summary import summarize
    from torchlens.formats.kineto import load_trace

    return summarize(load_trace(path), **where)


def attach() -> Any:
    """Attach this process to its ``torchlens run`` collector
    (``capture.ranks.attach``); None when it cannot."""
    from torchlens.capture.ranks.attach import attach as _attach

    return _attach(summarize=summarize_file)


if __name__ == "__main__":
    # Imported before the user's code runs: the summariser's imports (numpy,
    # pandas) would otherwise take a second of CPU from the first steps.
    from torchlens.capture.ddp.worker import main
    from torchlens.formats import kineto  # noqa: F401

    main(sys.argv[1:], summarize=summarize_file)
