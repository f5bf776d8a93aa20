"""Memory creep on the CPU is judged on memory that falls when freed.

Two gloo ranks train 12 steps; in one run rank 1 keeps 1 MiB more every step.
RSS grows on both ranks alike (the C allocator keeps pages), so it cannot tell
them apart; the C heap's bytes in use (glibc's mallinfo2, sent in each step's
memory record) can. Linux glibc only: elsewhere there is no such figure and
creep stays judged on RSS.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest

from torchlens.capture.ranks.heap import heap_in_use
from torchlens.frontends.ddp.api import ddp_check

from . import profiled
from .conftest import assert_clean

pytestmark = [pytest.mark.usefixtures("no_leftovers"),
              pytest.mark.skipif(heap_in_use() is None,
                                 reason="no glibc mallinfo2 here: creep is judged on RSS")]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MiB = 1 << 20


def keeps_one_mib(rank, world_size, steps=12):
    """Rank 1 keeps 1 MiB more every step."""
    return profiled._loop(rank, steps, grow_bytes=MiB if rank == 1 else 0)


def even(rank, world_size, steps=12):
    return profiled._loop(rank, steps)


def _run(fn, tmp_path):
    return ddp_check(fn, world_size=2, backend="gloo", live=False, profile=True, steps=12,
                     profile_every=4, run_dir=str(tmp_path / "run"))


def test_a_rank_keeping_one_mib_per_step_is_named(tmp_path):
    res = _run(keeps_one_mib, tmp_path)
    assert res.records.outcome == "finished"
    heap = [[rec.mem.heap for rec in s] for s in res.records.profiling.steps]
    assert all(h is not None for rank in heap for h in rank)
    item = res.item("rank memory")
    assert item.status == "warning", item
    assert "rank 1: memory creep, +1." in item.evidence, item.evidence
    (creep,) = item.details["creep"]
    assert creep["rank"] == 1 and creep["source"] == "heap"
    assert 0.8 * MiB < creep["bytes_per_step"] < 1.5 * MiB  # what it kept, give or take
    assert "C heap in use" in item.evidence and "RSS" in item.evidence
    assert "rank 0: memory creep" not in item.evidence
    assert_clean(res)


def test_an_even_run_has_no_creep(tmp_path):
    res = _run(even, tmp_path)
    item = res.item("rank memory")
    assert item.status == "passed", item
    assert "creep" not in item.evidence
    assert_clean(res)
