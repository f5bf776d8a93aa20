"""What the magics share, through a real IPython shell: the cell runs as IPython
runs a cell, a failing cell's traceback names its In[N], one option parser."""

from __future__ import annotations

import asyncio
import os
import re

import pytest
from IPython.core.error import UsageError
from ipython_shell import torchlens_shell

import torchlens
from torchlens.model import InputError

ANSI = re.compile(r"\x1b\[[0-9;]*m")
PACKAGE = os.path.dirname(os.path.abspath(torchlens.__file__))
MAGICS = ["%%torchprof", "%%gpumem"]


@pytest.fixture(scope="module")
def shell():
    with torchlens_shell("import asyncio\nimport torch") as ip:
        yield ip


def _captured_work(magic: str, r) -> bool:
    if magic == "%%torchprof":
        return "aten::mul" in set(r.ops()["name"])
    return any(s.bytes >= 200_000 for s in r.sites())


# IPython syntax a plain exec cannot run: a line magic, a shell command, top-level await
IPYTHON_CELL = """\
%time t = torch.ones(50_000)
!echo hi from the shell
await asyncio.sleep(0)
u = t * 2
"""


@pytest.mark.parametrize("magic", MAGICS)
def test_cell_is_transformed_and_may_await(shell, capfd, magic):
    shell.user_ns.pop("u", None)
    res = shell.run_cell(f"{magic} -o r --quiet\n{IPYTHON_CELL}")
    assert res.success, res.error_in_exec
    out = capfd.readouterr().out
    assert "Wall time" in out  # %time ran
    assert "hi from the shell" in out  # !echo ran and its output appeared
    assert shell.user_ns["u"].sum() == 100_000  # the lines after the await ran
    r = shell.user_ns["r"]
    assert r.profile.error is None and _captured_work(magic, r)


@pytest.mark.parametrize("magic", MAGICS)
def test_await_inside_a_running_event_loop_as_in_a_kernel(shell, magic):
    """ipykernel calls the shell from inside its own running loop."""

    async def kernel():
        res = shell.run_cell(f"{magic} -o r --quiet\nawait asyncio.sleep(0.01)\n"
                             "t = torch.ones(50_000) * 2")
        return res, asyncio.get_running_loop()

    loop = asyncio.new_event_loop()
    try:
        res, running = loop.run_until_complete(kernel())
    finally:
        loop.close()
    assert res.success, res.error_in_exec
    assert running is loop  # the kernel's loop is back in place after the cell
    assert _captured_work(magic, shell.user_ns["r"])  # recorded on the kernel's thread


@pytest.mark.parametrize("magic", MAGICS)
def test_error_after_await_is_reraised_with_capture(shell, magic):
    res = shell.run_cell(f"{magic} -o r --quiet\nt = torch.ones(50_000) * 2\n"
                         "await asyncio.sleep(0)\nraise KeyError('after await')")
    assert isinstance(res.error_in_exec, KeyError)
    r = shell.user_ns["r"]
    assert r.profile.error["type"] == "KeyError" and _captured_work(magic, r)


@pytest.mark.parametrize("magic", MAGICS)
def test_traceback_names_the_cell_and_shows_no_torchlens_frame(shell, capsys, magic):
    for _ in range(3):  # so the failing cell's In[N] is not 0 or 1
        assert shell.run_cell("pass", store_history=True).success
    n = shell.execution_count
    assert n > 3
    res = shell.run_cell(f"{magic} --quiet\nv = torch.ones(3)\nraise KeyError('boom in cell')",
                         store_history=True)
    assert isinstance(res.error_in_exec, KeyError)
    text = ANSI.sub("", capsys.readouterr().out)
    tb = text[text.index("Traceback"):]
    assert f"Cell In[{n}], line 2" in tb  # the body's line 2, named after the real cell
    assert "raise KeyError('boom in cell')" in tb
    assert "In[0]" not in tb
    assert PACKAGE not in tb, tb  # no frame from the magic's own code
    assert "KeyError: 'boom in cell'" in tb


@pytest.mark.parametrize("magic", MAGICS)
def test_error_from_a_function_of_the_cell_keeps_its_frames(shell, capsys, magic):
    n = shell.execution_count
    res = shell.run_cell(f"{magic} --quiet\ndef inner():\n    return 1 / 0\ninner()",
                         store_history=True)
    assert isinstance(res.error_in_exec, ZeroDivisionError)
    tb = ANSI.sub("", capsys.readouterr().out)
    assert f"Cell In[{n}], line 3" in tb and f"Cell In[{n}], line 2, in inner" in tb
    assert PACKAGE not in tb


@pytest.mark.parametrize("magic", MAGICS)
@pytest.mark.parametrize("quote", ['"', "'"])
def test_quoted_export_path_with_spaces(shell, tmp_path, magic, quote):
    path = tmp_path / "my report.html"
    res = shell.run_cell(f"{magic} --quiet --export {quote}{path}{quote}\nt = torch.ones(1000)")
    assert res.success, res.error_in_exec
    assert path.stat().st_size > 0


@pytest.mark.parametrize(
    "line, kwargs",
    [
        ("--top 0", {"top": 0}),
        ("--sort bogus", {"sort": "bogus"}),
        ("--schedule 1,2", {"schedule": (1, 2)}),
        ("--schedule 1,1,0", {"schedule": (1, 1, 0)}),
    ],
)
def test_torchprof_option_errors_are_the_apis(shell, line, kwargs):
    """One check: the magic's usage error is the API's InputError, spelled as the option."""
    with pytest.raises(InputError) as api:
        torchlens.torchprof(**kwargs)
    res = shell.run_cell(f"%%torchprof {line}\npass")
    assert isinstance(res.error_in_exec, UsageError)
    option = line.split()[0]
    name = option[2:]
    assert str(api.value).startswith(name)
    assert str(res.error_in_exec) == f"%%torchprof: {option}{str(api.value)[len(name):]}"


@pytest.mark.parametrize(
    "line, needle",
    [
        ("--bogus 1", "--bogus"),
        ("--interval fast", "--interval 'fast'"),
        ("--minutes 0", "--minutes"),
        ("--duration -1", "--duration"),
    ],
)
def test_gpumonitor_bad_option_is_a_usage_error(shell, line, needle):
    res = shell.run_cell(f"%gpumonitor {line}")
    assert isinstance(res.error_in_exec, UsageError)
    message = str(res.error_in_exec)
    assert message.startswith("%gpumonitor: ") and needle in message


def test_gpumonitor_help_lists_its_options(shell, capsys):
    shell.run_cell("%gpumonitor?")
    out = ANSI.sub("", capsys.readouterr().out)
    assert "%gpumonitor [--interval S] [--minutes M] [--duration S]" in out
    for opt, text in (("--interval", "seconds between samples"), ("--minutes", "history"),
                      ("--duration", "Stop is pressed")):
        assert opt in out and text in out, opt


def test_export_help_lists_only_the_kinds_own_formats():
    """--export's help comes from the kinds registry: a format a kind cannot
    write is never offered."""
    from torchlens.frontends.notebook.magics import TorchlensMagics

    def export_help(doc: str) -> str:
        return doc.rsplit("--export PATH", 1)[1].split("--quiet", 1)[0]

    ddp = export_help(TorchlensMagics.ddp_check.__doc__)
    mem = export_help(TorchlensMagics.gpumem.__doc__)
    prof = export_help(TorchlensMagics.torchprof.__doc__)
    assert ".html" in ddp and ".tlprof" in ddp and ".json" not in ddp and ".pickle" not in ddp
    assert ".pickle" in mem and ".json" not in mem
    assert ".json.gz" in prof and ".pickle" not in prof
