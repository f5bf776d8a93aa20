"""``%%torchprof`` on compiled code, as a user runs it: a model whose forward
has a ``.item()`` (a graph break) called with changing batch sizes (recompiles).

The report names the break with its reason and line, each recompile with the
guard that failed, the time per compiled region and what compiling cost,
from torch's own compile records and the profiler's region ranges. The
``aot_eager`` backend keeps the compile to seconds on a CPU: dynamo (graphs,
breaks, guards, regions) is the same as under inductor.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from ipython_shell import torchlens_shell

MODEL = '''\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.sum().item() > 0:  # BREAK
            h = h * 2
        return self.b(h)
'''
BREAK_LINE = MODEL.splitlines().index("        if h.sum().item() > 0:  # BREAK") + 1
FORWARD_LINE = MODEL.splitlines().index("    def forward(self, x):") + 1


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("compiled")
    (folder / "compiled_net.py").write_text(MODEL)
    sys.path.insert(0, str(folder))
    with torchlens_shell(
            "import torch, torchlens\nimport torch._dynamo\nfrom compiled_net import Net\n"
            "torch._dynamo.reset()\nnet = torch.compile(Net(), backend='aot_eager')") as ip:
        yield ip
    sys.path.remove(str(folder))
    sys.modules.pop("compiled_net", None)


def test_breaks_recompiles_and_regions_of_a_compiled_cell(shell, tmp_path: Path) -> None:
    res = shell.run_cell("%%torchprof --quiet -o r\n"
                         "for n in (4, 8):\n    net(torch.randn(n, 16)).sum().backward()")
    assert res.success, res.error_in_exec
    r = shell.user_ns["r"]
    c = r.compiled()
    assert c is not None
    # the break: its reason and the user's line, from torch's records
    (brk,) = c.breaks
    assert "Tensor.item()" in brk.reason and brk.where == f"compiled_net.py:{BREAK_LINE}"
    assert brk.function == "forward" and "capture_scalar_outputs" in brk.hint
    # the second batch size failed a guard on x's size: forward recompiled
    forward = [rc for rc in c.recompiles if rc.function == "forward"]
    assert forward and forward[0].where == f"compiled_net.py:{FORWARD_LINE}"
    assert "size mismatch" in forward[0].guard and "expected 4, actual 8" in forward[0].guard
    # measured: each compiled region's calls and time, the eager time between
    regions = {rg.compile_id: rg for rg in c.regions}
    assert {"0/0", "0/1", "1/0", "1/1"} <= set(regions)
    assert regions["0/0"].calls == 1 and regions["0/0"].function == "forward"
    assert regions["1/0"].function == "forward, after a graph break"
    assert c.region_us > 0 and c.eager_us > 0 and c.graphs >= 4
    # the first calls compile: the cell is mostly compile time, and says so
    assert 0 < c.compile_s <= c.wall_s
    codes = [f.code for f in c.findings]
    assert codes.count("graph_break") == 1 and "recompile" in codes
    assert "compile_time" in codes

    bundle = r._repr_mimebundle_()
    html = bundle["text/html"]
    assert "Compiled code (torch.compile)" in html
    assert f"compiled_net.py:{BREAK_LINE}" in html and "size mismatch" in html
    # the text a terminal or a log sees says the same
    assert f"the graph breaks in forward at compiled_net.py:{BREAK_LINE}" in bundle["text/plain"]
    # the first line says what was found, and the empty hints point to it
    first = bundle["text/plain"].splitlines()[0]
    assert f"; 1 graph break, {len(c.recompiles)} recompile" in first, first
    assert "No known problem found in this trace. Above: 1 graph break" in html

    # a saved result keeps what torch compiled
    saved = r.save(str(tmp_path / "c.tlprof"))
    import torchlens

    again = torchlens.load(saved)
    assert again.compiled().breaks == c.breaks
    assert [rc.guard for rc in again.compiled().recompiles] == [rc.guard for rc in c.recompiles]


def test_a_cell_that_only_runs_compiled_code_has_no_compile_findings(shell) -> None:
    shell.run_cell("for n in (4, 8, 16):\n    net(torch.randn(n, 16))")  # compiled before
    res = shell.run_cell("%%torchprof --quiet -o r2\nnet(torch.randn(16, 16))")
    assert res.success, res.error_in_exec
    c = shell.user_ns["r2"].compiled()
    assert c is not None and c.compiles == 0 and not c.recompiles
    assert c.regions and all(rg.calls == 1 for rg in c.regions)
    # compiled in an earlier cell, the regions are still named by torch's records
    assert {rg.function for rg in c.regions} == {"forward", "forward, after a graph break"}
    assert not [f for f in c.findings if f.code == "compile_time"]


def test_a_cell_without_compiled_code_has_no_section(shell) -> None:
    res = shell.run_cell("%%torchprof --quiet -o r3\ntorch.randn(8, 8) @ torch.randn(8, 8)")
    assert res.success, res.error_in_exec
    r3 = shell.user_ns["r3"]
    assert r3.compiled() is None
    assert "Compiled code (torch.compile)" not in r3._repr_mimebundle_()["text/html"]


def test_a_break_in_a_cells_own_code_is_named_by_its_cell(shell) -> None:
    res = shell.run_cell("def cell_fn(x):\n    y = x * 2\n    print(float(y.sum()) > 0)\n"
                         "    return y + 1\n"
                         "cell_fc = torch.compile(cell_fn, backend='aot_eager')")
    assert res.success, res.error_in_exec
    res = shell.run_cell("%%torchprof --quiet -o rc\ncell_fc(torch.randn(4))")
    assert res.success, res.error_in_exec
    breaks = shell.user_ns["rc"].compiled().breaks
    # the temp file IPython compiled the cell under, named as the notebook names it
    assert breaks and all(re.fullmatch(r"cell \[\d+\] line 3", b.where) for b in breaks), breaks
