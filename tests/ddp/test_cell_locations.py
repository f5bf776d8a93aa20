"""A function defined in a notebook cell is located as ``cell [N] line L`` by
%ddp_check, as %%gpumem names its sites: never as the kernel's temp file.

The shell compiles cells the way ipykernel does (``XCachingCompiler``:
``/tmp/ipykernel_<pid>/<hash>.py``, a name that does not say which cell), so
the ranks, which have no IPython of their own, must be told the cell numbers.
"""

from __future__ import annotations

import pytest

from .conftest import assert_clean

pytestmark = pytest.mark.usefixtures("no_leftovers")

CELL = """import torch
import torch.distributed as dist

def mismatch(rank, world_size):
    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)
"""


def test_ddp_check_of_a_cell_function_names_the_cell(kernel_like_shell):
    ip = kernel_like_shell
    n = ip.execution_count
    assert ip.run_cell(CELL, store_history=True).success
    code = ip.user_ns["mismatch"].__code__
    assert "ipykernel_" in code.co_filename  # compiled as a kernel compiles it
    res = ip.run_cell("%ddp_check mismatch --world-size 2 --steps 1 --timeout 20 --strict "
                      "--no-live --quiet -o r", store_history=True)
    assert res.success, res.error_in_exec
    r = ip.user_ns["r"]
    assert_clean(r)
    item = r.item("collective sequence")
    assert item.status == "failed"
    assert f"rank 0: #0 all_reduce float32[4] at cell [{n}] line 7" in item.evidence
    assert f"rank 1: #0 broadcast float32[4] at cell [{n}] line 9" in item.evidence
    coll = r.collectives()
    assert set(coll["line"]) == {f"cell [{n}] line 7", f"cell [{n}] line 9"}
    for rank in (0, 1):  # the ranks' own --strict messages say it the same way
        assert f"cell [{n}] line" in r.records.ranks[rank].error.message
    everything = (" ".join(i.evidence for i in r.checklist) + " ".join(coll["line"])
                  + r._repr_mimebundle_()["text/plain"])
    assert "ipykernel_" not in everything


RAISES = """import torch
import torch.distributed as dist

def raises(rank, world_size):
    if rank == 1:
        raise ValueError("bad batch on rank 1")
    dist.all_reduce(torch.ones(4))
"""


def test_a_crash_in_a_cell_function_shows_the_cell_in_its_traceback(kernel_like_shell):
    ip = kernel_like_shell
    n = ip.execution_count
    assert ip.run_cell(RAISES, store_history=True).success
    res = ip.run_cell("%ddp_check raises --world-size 2 --steps 1 --timeout 20 --no-live "
                      "--quiet -o r", store_history=True)
    assert res.success, res.error_in_exec
    r = ip.user_ns["r"]
    assert_clean(r)
    crash = r.item("crashed worker")
    assert crash.status == "failed"
    assert f"cell [{n}] line 6, in raises" in crash.details["traceback"]
    assert "ipykernel_" not in crash.details["traceback"]


def test_hang_stacks_name_cells_with_the_kernels_numbers():
    from torchlens.analysis.ddp.checks import checklist
    from torchlens.model.payloads import DdpRun, HangInfo

    cell = "/tmp/ipykernel_4242/665467772.py"
    stack = (f'Thread 0x1 (most recent call first):\n  File "/usr/lib/python3.11/time.py", '
             f'line 1 in sleep\n  File "{cell}", line 4 in load\n')
    hang = {"after_s": 3.0, "stacks": ["", stack], "status": [
        {"phase": "step 0", "collectives": 1,
         "last": {"index": 0, "op": "all_reduce", "line": "cell [7] line 9"}},
        {"phase": "step 0", "collectives": 0, "last": None}]}
    run = DdpRun(world_size=2, backend="gloo", outcome="hang", ranks=[None, None],
                 hang=HangInfo(**hang), cells={cell: 7}, fingerprints=[[], []])
    item = next(i for i in checklist(run) if i.name == "hang")
    assert "rank 1 has issued no collective (phase step 0), now at cell [7] line 4 in load" \
        in item.evidence
    assert 'cell [7] line 4 in load' in item.details["stacks"][1]
    assert "ipykernel_" not in item.evidence + "".join(item.details["stacks"])
