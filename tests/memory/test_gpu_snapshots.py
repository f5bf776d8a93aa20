"""Snapshots recorded on a real GPU by ``scripts/gpu-check`` (tests/data/cuda):
torchlens' figures of each, loaded as a user loads one, equal torch's own
``memory_stats()`` read in the same process right after the cell
(``<name>.stats.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchlens.analysis.memory.allocator.fidelity import check_fidelity
from torchlens.frontends.memory.api import load_gpumem
from torchlens.model.snapshot import load_snapshot

DATA = Path(__file__).resolve().parents[1] / "data" / "cuda"
RECORDED = ["cuda_gpumem_train", "cuda_gpumem_side_stream", "cuda_gpumem_expandable"]


def _stats(name: str) -> dict:
    return json.loads((DATA / f"{name}.stats.json").read_text())


@pytest.mark.parametrize("name", RECORDED)
def test_loaded_snapshot_figures_are_torchs(name: str) -> None:
    after = _stats(name)["after"]
    a = load_gpumem(str(DATA / f"{name}.pickle")).analysis()
    assert a.timeline.end_allocated == after["allocated_bytes.all.current"]
    assert a.timeline.peak_allocated == after["allocated_bytes.all.peak"]
    assert a.frag.reserved == after["reserved_bytes.all.current"]
    assert a.frag.inactive_split == after["inactive_split_bytes.all.current"]


def test_allocator_model_replays_the_gpu_snapshot_address_for_address() -> None:
    report = check_fidelity(load_snapshot(str(DATA / "cuda_gpumem_train.pickle")), "train")
    assert report is not None
    assert report.address_match == 1.0 and report.layout_equal and report.final_bytes_equal
