"""Every phase a rank's heartbeat can report has a colour of its own in the
state lanes: a --profile run drew its whole loop as grey "other phase"."""

from __future__ import annotations

import re
from pathlib import Path

from torchlens.render.ddp.heartbeats import OTHER_PHASE_COLOR, _phase_color

WORKER = Path(__file__).resolve().parents[2] / "torchlens" / "capture" / "ddp" / "worker.py"


def test_every_phase_the_worker_reports_has_its_colour() -> None:
    said = set(re.findall(r'self\.phase = f?"(\w+)', WORKER.read_text(encoding="utf-8")))
    assert {"training", "step", "init"} <= said
    assert {p: _phase_color(p) for p in said if _phase_color(p) == OTHER_PHASE_COLOR} == {}
