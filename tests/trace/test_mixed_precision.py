"""Mixed precision in ``%%torchprof``: with ``--shapes`` each op's input dtypes
are in the op table, so an op autocast ran in bfloat16 is told from its
float32 twin (its own row), in the table a user reads and in ``result.ops()``;
``torch.amp.GradScaler``'s skipped optimizer steps and its scale are said."""

from __future__ import annotations

import pytest
from ipython_shell import torchlens_shell


@pytest.fixture(scope="module")
def shell():
    with torchlens_shell(
            "import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),"
            " torch.nn.Linear(32, 4))") as ip:
        yield ip


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


def _page(r) -> str:
    """The report's text as the browser shows it (the page sits in an iframe's
    escaped ``srcdoc``)."""
    import html

    return html.unescape(html.unescape(r._repr_mimebundle_()["text/html"]))


SCALED_CELL = """%%torchprof --quiet -o {name}
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu")
for i in range(10):
    loss = model(torch.randn(8, 16)).sum()
    if i in {blow_up}:
        loss = loss * float("inf")  # an overflow: this step's gradients are inf
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
"""


def test_a_scaler_that_skips_steps_is_said_with_its_counts_and_scale(shell) -> None:
    from torch.amp.grad_scaler import GradScaler

    step = GradScaler.step
    res = shell.run_cell(SCALED_CELL.format(name="amp", blow_up="(2, 5, 6)"))
    assert res.success, res.error_in_exec
    r = shell.user_ns["amp"]
    s = r.scaler()
    # each skip halves the scale (GradScaler's backoff_factor 0.5), from 65,536
    assert (s.total_steps, s.total_skipped, s.first_scale, s.scale) == (10, 3, 65536.0, 8192.0)
    html = _page(r)
    assert "skipped 3 of the cell's 10 optimizer steps for inf/nan gradients" in html
    assert "65,536 -> 8,192" in html
    text = r._repr_mimebundle_()["text/plain"]
    assert "GradScaler: 10 optimizer steps, 3 skipped, scale 65,536 -> 8,192" in text
    assert "[warning] skipped optimizer steps" in text
    assert GradScaler.step is step  # the cell's wrapper is gone


def test_a_scaler_that_skips_nothing_says_so(shell, tmp_path) -> None:
    res = shell.run_cell(SCALED_CELL.format(name="amp_ok", blow_up="()"))
    assert res.success, res.error_in_exec
    r = shell.user_ns["amp_ok"]
    html = _page(r)
    assert "No optimizer step skipped." in html and "none skipped, scale 65,536" in html
    saved = r.save(str(tmp_path / "amp.tlprof"))
    from torchlens.model import Profile

    again = Profile.load(saved).payload.scaler
    assert (again.total_steps, again.total_skipped) == (10, 0)


def test_a_cell_without_a_scaler_has_no_scaler_section(shell) -> None:
    res = shell.run_cell("%%torchprof --quiet -o plain\nmodel(torch.randn(8, 16))")
    assert res.success, res.error_in_exec
    assert shell.user_ns["plain"].scaler() is None
    assert "GradScaler" not in shell.user_ns["plain"]._repr_mimebundle_()["text/html"]


def test_the_scale_said_is_the_one_the_scaler_holds_after_a_last_skip(shell) -> None:
    res = shell.run_cell(SCALED_CELL.format(name="amp_last", blow_up="(2, 5, 9)"))
    assert res.success, res.error_in_exec
    s = shell.user_ns["amp_last"].scaler()
    held = shell.user_ns["scaler"].get_scale()
    # step 9 used 16,384 and skipped: update() halved it
    assert (s.scale, s.next_scale, held) == (16384.0, 8192.0, 8192.0)
    assert "65,536 -> 8,192" in _page(shell.user_ns["amp_last"])
