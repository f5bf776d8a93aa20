"""%%torchprof through a real IPython shell, as a user types it."""

from __future__ import annotations

from pathlib import Path

import pytest
from ipython_shell import torchlens_shell

SETUP = """
import torch
from torch import nn
import torchlens
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 64), torch.randint(0, 4, (16,))
def train_step():
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    torchlens.step()
    return loss
"""


@pytest.fixture(scope="module")
def shell():
    with torchlens_shell(SETUP) as ip:
        yield ip


def test_cell_is_profiled_and_result_stored(shell, capsys):
    res = shell.run_cell("%%torchprof --top 5 -o r\nfor _ in range(3):\n    train_step()")
    assert res.success, res.error_in_exec
    r = shell.user_ns["r"]
    ops = r.ops()
    names = set(ops["name"])
    assert {"aten::addmm", "aten::relu"} <= names
    # three marked steps -> three rows in the step breakdown
    assert len(r.steps()) == 3
    printed = capsys.readouterr().out
    assert "aten::" in printed  # the text/plain fallback shows the top ops
    bundle = r._repr_mimebundle_()
    assert "<iframe" in bundle["text/html"] and "aten::addmm" in bundle["text/html"]


def test_cell_sees_and_changes_user_namespace(shell):
    shell.user_ns["counter"] = 1
    assert shell.run_cell("%%torchprof --quiet\ncounter += 41\nz = torch.ones(3)").success
    assert shell.user_ns["counter"] == 42 and shell.user_ns["z"].sum() == 3


@pytest.mark.parametrize(
    "line, needle",
    [
        ("--top x", "--top"),
        ("--top 0", "--top"),
        ("--sort bogus", "--sort"),
        ("--schedule 1,2", "--schedule"),
        ("--export out.txt", "unknown file type"),
        ("--no-such-option", "unrecognized"),
        ("--tpo 5", "unrecognized arguments: --tpo 5; did you mean --top?"),
    ],
)
def test_bad_option_is_a_usage_error_and_nothing_runs(shell, capsys, line, needle):
    shell.user_ns["ran"] = False
    res = shell.run_cell(f"%%torchprof {line}\nran = True")
    err = capsys.readouterr()
    assert not res.success
    assert shell.user_ns["ran"] is False
    assert needle in (err.out + err.err + str(res.error_in_exec))


def test_help_lists_every_option(shell, capsys):
    shell.run_cell("%%torchprof?")
    out = capsys.readouterr().out
    for opt in ("-o", "--sort", "--top", "--shapes", "--stack", "--memory",
                "--flops", "--schedule", "--export", "--quiet"):
        assert opt in out, opt


def test_failing_cell_shows_capture_then_reraises(shell, capsys):
    cell = "%%torchprof -o failed\ntrain_step()\nraise KeyError('boom in cell')"
    res = shell.run_cell(cell)
    out = capsys.readouterr()
    assert isinstance(res.error_in_exec, KeyError)
    failed = shell.user_ns["failed"]
    assert failed.profile.error["type"] == "KeyError"
    assert "aten::addmm" in set(failed.ops()["name"])  # the step before the error
    text = out.out + out.err
    assert "boom in cell" in text
    assert text.index("aten::") < text.index("KeyError")  # result shown first


def test_interrupted_cell_keeps_capture(shell):
    res = shell.run_cell(
        "%%torchprof -o intr --quiet\ntrain_step()\nraise KeyboardInterrupt"
    )
    assert isinstance(res.error_in_exec, KeyboardInterrupt)
    assert shell.user_ns["intr"].profile.error["type"] == "KeyboardInterrupt"


def test_schedule_records_only_active_steps(shell):
    res = shell.run_cell(
        "%%torchprof --schedule 1,1,2 -o s --quiet\nfor _ in range(5):\n    train_step()"
    )
    assert res.success
    assert len(shell.user_ns["s"].steps()) == 2


def test_schedule_longer_than_cell_says_why(shell):
    res = shell.run_cell("%%torchprof --schedule 2,1,3 -o s2 --quiet\ntrain_step()")
    assert res.success
    p = shell.user_ns["s2"].profile
    assert p.traces == {}
    assert any("marked 1 step" in u for u in p.unmeasured)


def test_export_formats(shell, tmp_path):
    for suffix in ("json", "json.gz", "html", "tlprof"):
        path = tmp_path / f"out.{suffix}"
        res = shell.run_cell(f"%%torchprof --quiet --export {path}\ntrain_step()")
        assert res.success and path.stat().st_size > 0, suffix
    from torchlens.formats.kineto import load_trace
    from torchlens.model import load_profile

    assert len(load_trace(tmp_path / "out.json").events) > 0
    assert len(load_trace(tmp_path / "out.json.gz").events) > 0
    assert load_profile(tmp_path / "out.tlprof").kind == "torchprof"
    assert "aten::addmm" in (tmp_path / "out.html").read_text()


def test_a_saved_result_loads_back_with_the_same_op_table(shell, tmp_path):
    """``torchlens.load("x.tlprof").ops()`` is the cell's own ``res.ops()``: the
    saved result comes back as the result the cell gave, not a bare Profile."""
    import torchlens

    path = tmp_path / "cell.tlprof"
    assert shell.run_cell(f"%%torchprof -o r --quiet --export {path}\ntrain_step()").success
    ops = torchlens.load(path).ops()
    assert "aten::addmm" in set(ops["name"])
    assert list(ops.columns) == list(shell.user_ns["r"].ops().columns)
    assert ops.equals(shell.user_ns["r"].ops())


def test_a_saved_memory_or_ddp_result_loads_as_its_kind(tmp_path):
    import torchlens
    from torchlens.frontends.ddp.api import DdpResult
    from torchlens.frontends.memory.api import MemoryResult

    data = Path(__file__).parents[1] / "data" / "v1"
    assert isinstance(torchlens.load(data / "gpumem.tlprof"), MemoryResult)
    assert isinstance(torchlens.load(data / "ddp_check.tlprof"), DdpResult)
    assert torchlens.load(data / "torchprof.tlprof").profile.kind == "torchprof"


def test_environment_recorded(shell):
    shell.run_cell("%%torchprof -o e --quiet\ntrain_step()")
    env = shell.user_ns["e"].profile.environment
    import torch

    assert env["torch"] == torch.__version__ and env["cpu_count"] >= 1
    assert any("no CUDA device" in u for u in shell.user_ns["e"].profile.unmeasured)


def test_python_api_context_manager(shell):
    import torchlens

    with torchlens.torchprof(top=3) as r:
        shell.user_ns["train_step"]()
    assert "aten::addmm" in set(r.ops()["name"])
    assert "aten::" in repr(r)


def test_gpumonitor_magic_is_registered_and_rejects_bad_options(shell, capsys):
    res = shell.run_cell("%gpumonitor --interval fast")
    assert not res.success
    assert "gpumonitor" in str(res.error_in_exec)
    res = shell.run_cell("mon = %gpumonitor --interval 0.1 --duration 0.5")
    assert res.success, res.error_in_exec
    import time

    time.sleep(1.0)
    mon = shell.user_ns["mon"]
    assert len(mon.source.data["t"]) >= 2  # it kept sampling after the cell returned
    assert mon.last.host.cpu_percent is not None
    assert "no NVIDIA GPU found" in (mon.last.gpu.status or "") or mon.last.gpu.gpus


def test_stack_names_the_function_of_the_cell_that_issued_each_op(shell):
    cell = ("%%torchprof --stack -o st --quiet\n"
            "def make():\n"
            "    return torch.randn(32, 32)\n"
            "def square(a):\n"
            "    return a @ a\n"
            "c = torch.relu(square(make()))\n")
    assert shell.run_cell(cell).success
    ops = shell.user_ns["st"].ops()
    by_name = {r["name"]: r["stack"] for r in ops.to_dict("records")}
    assert by_name["aten::mm"].startswith("square · cell") and "line 3" in by_name["aten::mm"]
    assert by_name["aten::randn"].startswith("make · cell")
    assert by_name["aten::relu"].startswith("cell")  # top-level code of the cell
    html = shell.user_ns["st"]._repr_mimebundle_()["text/html"]
    assert "source (your code)" in html


def test_cpu_item_calls_give_no_gpu_sync_hint(shell):
    """On a CPU-only machine .item() waits for no GPU: the report must not say so
    (a demo said "1 syncs ... stall the CPU until the GPU catches up")."""
    res = shell.run_cell("%%torchprof --quiet -o r\nfor _ in range(3):\n"
                         "    train_step().item()")
    assert res.success, res.error_in_exec
    r = shell.user_ns["r"]
    assert "aten::_local_scalar_dense" in set(r.ops()["name"])  # .item() was traced
    assert not [h for h in r.hints() if "synchroniz" in h.title.lower()]
    html = r._repr_mimebundle_()["text/html"]
    assert "GPU catches up" not in html and "syncs" not in html


def test_flops_of_a_known_matmul_reach_the_tables(shell):
    """--flops showed NaN everywhere on torch 2.13 (the exported trace
    has no FLOPs). A (M x K) @ (K x N) product is 2*M*N*K FLOPs per call."""
    m, k, n = 64, 96, 32
    res = shell.run_cell(
        f"%%torchprof --flops --quiet -o r\na, b = torch.randn({m}, {k}), torch.randn({k}, {n})\n"
        f"lin = nn.Linear({k}, {n})\nfor _ in range(3):\n    torch.mm(a, b)\n    lin(a)")
    assert res.success, res.error_in_exec
    r = shell.user_ns["r"]
    ops = r.ops().set_index("name")
    for op in ("aten::mm", "aten::addmm"):
        assert ops.loc[op, "calls"] == 3
        assert ops.loc[op, "flops"] == 3 * 2 * m * n * k
        # achieved FLOP/s: over the op's total CPU time on a machine without a GPU
        assert ops.loc[op, "flops_per_s"] == pytest.approx(
            ops.loc[op, "flops"] / (ops.loc[op, "total_cpu_us"] / 1e6))
    assert not any("FLOPs" in u for u in r.profile.unmeasured)
    html = r._repr_mimebundle_()["text/html"]
    assert "FLOP/s (total CPU)" in html and f"{3 * 2 * m * n * k / 1e6:,.2f} MFLOP" in html
    rate = ops.loc["aten::mm", "flops_per_s"]
    assert f"{rate / 1e9:,.2f} GFLOP/s" in html or f"{rate / 1e6:,.2f} MFLOP/s" in html
    text = repr(r) + r._repr_mimebundle_()["text/plain"]
    assert "nan" not in text.lower() and "FLOP/s" in text


def test_flops_asked_but_none_counted_is_said(shell):
    res = shell.run_cell("%%torchprof --flops --quiet -o r\ntorch.relu(torch.randn(8))")
    assert res.success, res.error_in_exec
    r = shell.user_ns["r"]
    assert any(u.startswith("FLOPs:") for u in r.profile.unmeasured)
    assert "FLOPs: torch estimated none" in r._repr_mimebundle_()["text/html"]


def test_profiler_start_stop_time_with_a_schedule_is_not_negative(shell):
    """With --schedule the trace is exported inside a step() call, and
    its export time was taken off the stop time: "profiler start/stop -1.67 ms"."""
    res = shell.run_cell("%%torchprof --schedule 1,1,2 --flops --quiet -o r\n"
                         "for _ in range(6):\n    train_step()")
    assert res.success, res.error_in_exec
    r = shell.user_ns["r"]
    timings = r.profile.payload.timings
    assert all(v >= 0 for v in timings.values()), timings
    assert r.profile.payload.profiler_overhead_s > 0
    assert "start/stop -" not in repr(r) and "start/stop n/a" not in repr(r)
    assert r.ops().flops.notna().any()  # FLOPs read under a schedule too
