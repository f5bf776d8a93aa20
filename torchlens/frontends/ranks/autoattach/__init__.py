"""The directory ``torchlens run`` puts first on its command's ``PYTHONPATH``:
its ``sitecustomize`` attaches each rank when it starts, with no import of
torchlens in the training script (docs/MULTINODE.md, "No code change")."""

from __future__ import annotations

import os
from collections.abc import Mapping

DIR = os.path.dirname(os.path.abspath(__file__))


def pythonpath(environ: Mapping[str, str]) -> dict[str, str]:
    """The command's ``PYTHONPATH``: ``DIR`` first, then what it was."""
    before = environ.get("PYTHONPATH", "")
    rest = [p for p in before.split(os.pathsep) if p != DIR] if before else []
    return {"PYTHONPATH": os.pathsep.join([DIR, *rest])}
