"""``torchlens diff`` of two run folders with step records: the step
time is the median of every recorded step, not of the few profiled ones.

Two real ``%ddp_check --profile`` runs of 2 gloo ranks: B multiplies a larger
matrix each step. The expected figures are read back from each rank's
``steps.jsonl`` with the run folder's reader.
"""

from __future__ import annotations

import statistics
import sys

import cloudpickle
import pytest

import torchlens
from torchlens.formats.run_folder.records import read_steps
from torchlens.frontends.cli.main import main
from torchlens.frontends.ddp.api import ddp_check

STEPS = 12


def _loop(rank: int, world_size: int, n: int, steps: int) -> None:
    import torch
    import torch.distributed as dist

    x = torch.randn(n, n)
    for _ in range(steps):
        y = torch.mm(x, x)
        dist.all_reduce(y[:1, :1].contiguous())
        torchlens.step()


def small(rank, world_size, steps=STEPS):
    _loop(rank, world_size, 32, steps)


def large(rank, world_size, steps=STEPS):
    _loop(rank, world_size, 256, steps)


cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff_steps")
    out = []
    for name, fn in (("a", small), ("b", large)):
        res = ddp_check(fn, world_size=2, backend="gloo", live=False, profile=True,
                        run_dir=str(root / name), steps=STEPS, profile_every=4)
        assert res.records.outcome == "finished"
        out.append(root / name)
    return out


def _recorded_us(run_dir, rank) -> list[float]:
    return [(r.t1 - r.t0) * 1e6 for r in read_steps(str(run_dir), rank) if not r.window]


def test_step_time_is_the_median_of_every_recorded_step(folders, capsys) -> None:
    a, b = folders
    d = torchlens.load(str(a)).diff(str(b))
    st = d.diff.step_time
    every_a = _recorded_us(a, 0) + _recorded_us(a, 1)
    every_b = _recorded_us(b, 0) + _recorded_us(b, 1)
    assert len(every_a) >= 2 * STEPS - 2  # every step, not the profiled few
    assert st.source == "step records"
    assert (st.a_steps, st.b_steps) == (len(every_a), len(every_b))
    assert st.a_median_us == pytest.approx(statistics.median(every_a))
    assert st.b_median_us == pytest.approx(statistics.median(every_b))
    # per rank: that rank's median
    for row in d.diff.rank_steps:
        assert row.a_median_us == pytest.approx(statistics.median(_recorded_us(a, row.rank_a)))
        assert row.b_median_us == pytest.approx(statistics.median(_recorded_us(b, row.rank_b)))
    # the verdict and the report say where the step time comes from
    assert f"median of {len(every_a)} recorded steps of A and {len(every_b)} of B" in d.verdict
    html = d._repr_mimebundle_()["text/html"]
    assert "recorded steps" in html and "steps.jsonl" in html
    assert main(["diff", str(a), str(b), "--json"]) == 0
    assert '"source": "step records"' in capsys.readouterr().out


def test_traces_alone_keep_the_profiled_steps_and_say_so(folders) -> None:
    a, b = folders
    # one rank's traces, without the folder's step records
    ta = sorted((a / "rank0").glob("*.json*"))
    tb = sorted((b / "rank0").glob("*.json*"))
    assert ta and tb
    d = torchlens.load([str(p) for p in ta]).diff([str(p) for p in tb])
    st = d.diff.step_time
    assert st.source == "profiled steps"
    assert st.a_steps < STEPS  # the profiled few
    assert f"of {st.a_steps} profiled steps of A" in d.verdict
