"""The run report's timeline says one thing about clocks, in its caption and on
its axis (the caption said "no clock offset applied" while the axis
said "clocks aligned", for two ranks on one host, where no offset is applied).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchlens.frontends.runs.api import load_run
from torchlens.render.runs.timeline import timeline_figure

A100 = "a100_ddp_resnet_rank0_nccl.json.gz"


def _run(out: Path, doc: dict[str, Any], ranks: list[tuple[str, float]]) -> Path:
    """One trace written again per rank, on ``host`` with every ``ts`` moved by ``shift``."""
    out.mkdir()
    for rank, (host, shift) in enumerate(ranks):
        copy = {**doc, "host_name": host,
                "distributedInfo": {**(doc.get("distributedInfo") or {}), "rank": rank,
                                    "world_size": len(ranks)},
                "traceEvents": [{**e, "ts": e["ts"] + shift} if "ts" in e else e
                                for e in doc["traceEvents"]]}
        (out / f"rank{rank}.json").write_text(json.dumps(copy))
    return out


def _words(folder: Path) -> tuple[str, str]:
    run = load_run(str(folder), workers=1)
    fig, note = timeline_figure(run.profile, run.analysis())
    return fig.xaxis[0].axis_label, note


def test_ranks_on_one_host_are_not_said_to_be_aligned(tmp_path, traces_dir, plain) -> None:
    axis, note = _words(_run(tmp_path / "one", plain(traces_dir / A100),
                             [("node-a", 0.0), ("node-a", 5000.0)]))
    assert "aligned" not in axis and "moved" not in axis
    assert "no clock offset applied" in axis and "no clock offset applied" in note
    assert "one host" in axis and "one host" in note


def test_ranks_on_two_hosts_moved_by_their_offsets_say_so_twice(tmp_path, traces_dir,
                                                                plain) -> None:
    axis, note = _words(_run(tmp_path / "two", plain(traces_dir / A100),
                             [("node-a", 0.0), ("node-b", 5000.0)]))
    assert "no clock offset" not in axis and "no clock offset" not in note
    assert "1 rank's clock moved by its offset" in axis
    assert "1 rank's clock moved by its offset" in note
