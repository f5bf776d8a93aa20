"""Wires a ``torchlens run`` rank's summariser into its capture.

Why a front end: the rank summarises its own profiled steps
(``analysis.rank_summary``, through ``rank_worker.summarize_file``), and
capture may not import analysis.
"""

from __future__ import annotations

from typing import Any


def attach() -> Any:
    """Attach this process to its collector (``capture.ddp.attach``); None when it cannot."""
    from torchlens.capture.ranks.attach import attach as _attach
    from torchlens.frontends.ddp.rank_worker import summarize_file

    return _attach(summarize=summarize_file)
