"""%%gpumem names a cell's allocation sites ``cell [N] line L`` in a kernel too.

The shell compiles cells the way ipykernel does (``XCachingCompiler``:
``/tmp/ipykernel_<pid>/<hash>.py``, a name that does not say which cell);
the capture keeps the shell's table of those names (as %ddp_check does), so
a function defined in an earlier cell reads ``cell [N] line L``, not
``cell line L`` nor the temp file.
"""

from __future__ import annotations

DEFS = """import torch

def make(n):
    big = torch.ones(n)
    return big
"""


def test_sites_in_an_earlier_cell_are_named_by_its_number(kernel_like_shell, tmp_path):
    ip = kernel_like_shell
    n = ip.execution_count
    assert ip.run_cell(DEFS, store_history=True).success
    assert "ipykernel_" in ip.user_ns["make"].__code__.co_filename
    res = ip.run_cell("%%gpumem -o r --quiet\nkeep = make(300_000)", store_history=True)
    assert res.success, res.error_in_exec
    r = ip.user_ns["r"]
    where = f"cell [{n}] line 4"
    sites = r.sites()
    assert sites and sites[0].site == where
    assert sites[0].bytes >= 1_200_000
    bundle = r._repr_mimebundle_()
    text, page = bundle["text/plain"], bundle.get("text/html", "")
    assert where in text
    assert where in page
    assert "ipykernel_" not in text + page + " ".join(s.site for s in sites)
    assert r.profile.payload.cells  # kept with the profile: a saved file names them too
    path = tmp_path / "cells.tlprof"
    r.export(str(path))
    from torchlens import load
    from torchlens.analysis.memory.analyze import analyze

    assert analyze(load(str(path)).profile).sites[0].site == where
