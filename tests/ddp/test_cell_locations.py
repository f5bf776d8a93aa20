"""A function defined in a notebook cell is located as ``cell [N] line L`` by
%ddp_check, as %%gpumem names its sites: never as the kernel's temp file.

The shell compiles cells the way ipykernel does (``XCachingCompiler``:
``/tmp/ipykernel_<pid>/<hash>.py``, a name that does not say which cell), so
the ranks, which have no IPython of their own, must be told the cell numbers.
"""

from __future__ import annotations

import pytest
from ipykernel.compiler import XCachingCompiler
from IPython.core.interactiveshell import InteractiveShell

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


@pytest.fixture
def kernel_like_shell():
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance(compiler_class=XCachingCompiler)
    assert ip.run_cell("%load_ext torchlens", store_history=True).success
    yield ip
    InteractiveShell.clear_instance()


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
        assert f"cell [{n}] line" in r.records.ranks[rank]["error"]["message"]
    everything = (" ".join(i.evidence for i in r.checklist) + " ".join(coll["line"])
                  + r._repr_mimebundle_()["text/plain"])
    assert "ipykernel_" not in everything
