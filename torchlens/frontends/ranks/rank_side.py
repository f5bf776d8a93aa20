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


class _Summarizer:
    """Read one exported Kineto trace (C scanner) and summarise it (<= 64 KB)."""

    def __call__(self, path: str, **where: Any) -> dict[str, Any]:
        from torchlens.analysis.ranks.summary import summarize
        from torchlens.formats.kineto import load_trace

        return summarize(load_trace(path), **where)

    def warm(self) -> None:
        """Import what the first summary needs (numpy and the analysis code,
        0.15-0.3 s of CPU): the rank's summary thread does it as soon as it
        starts, during the job's set-up, where it took the interpreter from the
        step after the first profiled one (docs/RANK_PROFILE.md)."""
        from torchlens.analysis.ranks import summary  # noqa: F401
        from torchlens.formats import kineto  # noqa: F401


summarize_file = _Summarizer()


def attach() -> Any:
    """Attach this process to its ``torchlens run`` collector
    (``capture.ranks.attach``); None when it cannot."""
    from torchlens.capture.ranks.attach import attach as _attach

    return _attach(summarize=summarize_file)


if __name__ == "__main__":
    # Imported before the user's code runs: the summariser's imports (numpy,
    # pandas) would otherwise take a second of CPU from the first steps.
    from torchlens.capture.ddp.worker import main

    summarize_file.warm()

    main(sys.argv[1:], summarize=summarize_file)
