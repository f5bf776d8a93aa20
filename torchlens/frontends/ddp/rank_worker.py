"""The entry point of a ``%ddp_check --profile`` rank: ``python -m torchlens.frontends.ddp.rank_worker``.

Why here and not in ``capture.ddp.worker``: a profiled rank summarises its own
traces (``analysis.rank_summary``), and capture may not import analysis; this
front end wires the two, the way the notebook's front ends do.
"""

from __future__ import annotations

import sys
from typing import Any


def summarize_file(path: str, **where: Any) -> dict[str, Any]:
    """Read one exported Kineto trace (C scanner) and summarise it (<= 64 KB)."""
    from torchlens.analysis.ranks.summary import summarize
    from torchlens.formats.kineto import load_trace

    return summarize(load_trace(path), **where)


if __name__ == "__main__":
    # Imported before the user's code runs: the summariser's imports (numpy,
    # pandas) would otherwise take a second of CPU from the first steps.
    from torchlens.capture.ddp.worker import main
    from torchlens.formats import kineto  # noqa: F401

    main(sys.argv[1:], summarize=summarize_file)
