"""A real 2-rank gloo job under ``torchlens run`` where both ranks keep 4 MiB a
step: the manifest's memory creep and the terminal's verdict name both ranks."""

from __future__ import annotations

import json
from pathlib import Path

from tests.ranks.helpers import REPO, Collector, free_port, torchrun_args


def test_a_leak_on_both_ranks_names_both(tmp_path: Path) -> None:
    out = tmp_path / "run"
    script = REPO / "tests" / "ranks" / "leak_script.py"
    c = Collector(out, torchrun_args(1, 2, free_port(), script), TL_STEPS="150", TL_KEEP_MIB="4")
    try:
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    manifest = json.loads((out / "manifest.json").read_text())
    creep = {c["rank"]: c for c in manifest["memory_creep"]}
    assert sorted(creep) == [0, 1], manifest["memory_creep"]
    for r in (0, 1):
        assert 3.5 * (1 << 20) < creep[r]["bytes_per_step"] < 4.5 * (1 << 20), creep[r]
    verdict = next(line for line in c.lines if line.startswith("verdict:"))
    assert "ranks 0-1's memory creeps" in verdict, c.output
    assert "no slow rank" not in verdict
