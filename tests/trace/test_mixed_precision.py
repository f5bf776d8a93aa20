"""``%%torchprof --shapes`` on a cell under autocast: each op's input dtypes are
in the op table, so an op autocast ran in bfloat16 is told from its float32
twin (its own row), in the table a user reads and in ``result.ops()``."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    assert ip.run_cell("%load_ext torchlens").success
    assert ip.run_cell(
        "import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),"
        " torch.nn.Linear(32, 4))").success
    yield ip
    InteractiveShell.clear_instance()


def test_autocast_ops_show_their_dtype(shell) -> None:
    res = shell.run_cell(
        "%%torchprof --shapes --quiet -o r\n"
        "model(torch.randn(8, 16))  # float32\n"
        "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "    model(torch.randn(8, 16)).sum().backward()")
    assert res.success, res.error_in_exec
    r = shell.user_ns["r"]
    ops = r.ops()
    addmm = ops[ops["name"] == "aten::addmm"]
    kinds = set(addmm["input_types"])
    assert any("BFloat16" in k for k in kinds) and any("float" in k and "BFloat16" not in k
                                                     for k in kinds), kinds
    html = r._repr_mimebundle_()["text/html"]
    assert "input dtypes" in html and "c10::BFloat16" in html


def test_without_shapes_the_table_has_no_dtype_column(shell) -> None:
    res = shell.run_cell("%%torchprof --quiet -o r2\nmodel(torch.randn(8, 16))")
    assert res.success, res.error_in_exec
    assert "input dtypes" not in shell.user_ns["r2"]._repr_mimebundle_()["text/html"]
