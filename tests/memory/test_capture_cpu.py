"""The CPU path end to end: profiler [memory] events with exact cell lines, through IPython."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys

import pytest
import torch
from gpumem_fixtures import CLEAN, LEAKY

from torchlens.capture.memory.capture import MemoryCapture
from torchlens.model import MemoryOptions
from torchlens.model.snapshot import load_snapshot


def test_capture_makes_a_torch_format_trace():
    keep = []
    with MemoryCapture(MemoryOptions(stacks=16)) as cap:
        for _ in range(3):
            keep.append(torch.ones(1000) * 2)  # line A
    p = cap.profile
    assert p.kind == "gpumem" and p.payload.measured_on == "cpu"
    assert any("allocator model" in u for u in p.unmeasured)
    trace = p.snapshots["device0"].device_traces[0]
    allocs = [e for e in trace if e.action == "alloc"]
    assert {e.size for e in allocs} >= {4000}
    here = [f for e in allocs for f in e.frames if f.filename == __file__]
    assert here and all(f.name == "test_capture_makes_a_torch_format_trace" for f in here)
    for e in trace:
        assert e.time_us is not None  # every field of torch's entries, the time included
        assert len(e.frames) <= 16


def test_stacks_zero_records_no_frames():
    with MemoryCapture(MemoryOptions(stacks=0)) as cap:
        torch.ones(100)
    trace = cap.profile.snapshots["device0"].device_traces[0]
    assert trace and all(e.frames == [] for e in trace)


def test_leaky_cell_is_flagged_at_the_right_lines(shell, capsys):
    res = shell.run_cell(LEAKY.format(opts=""))
    assert res.success, res.error_in_exec
    r = shell.user_ns["r"]
    flagged = {row.site for row in r.leaks()}
    # line 2: out = model(x) (activations kept by the graph), line 3: the loss
    assert any(s.endswith("line 2") for s in flagged), flagged
    assert any(s.endswith("line 3") for s in flagged), flagged
    assert not any(s.endswith("line 4") for s in flagged)
    out = capsys.readouterr().out
    assert "possible leaks" in out and "allocator model" in out


def test_clean_cell_is_not_flagged(shell):
    res = shell.run_cell(CLEAN.format(opts=""))
    assert res.success, res.error_in_exec
    assert shell.user_ns["r"].leaks() == []


def test_repeat_reports_growth_per_run(shell):
    shell.run_cell("history.clear()")
    res = shell.run_cell(LEAKY.format(opts="--repeat 3 --quiet"))
    assert res.success, res.error_in_exec
    a = shell.user_ns["r"].analysis()
    assert len(a.growth) == 3
    assert all(g.growth > 4 * 64 * 256 * 4 for g in a.growth[1:])  # activations of 4 steps
    shell.run_cell("history.clear()")
    assert shell.run_cell(CLEAN.format(opts="--repeat 3 --quiet")).success
    growth = shell.user_ns["r"].analysis().growth
    assert all(abs(g.growth) < 4096 for g in growth[1:]), growth


def test_simulate_on_cpu_compares_with_the_model(shell, capsys):
    res = shell.run_cell(LEAKY.format(
        opts='--simulate --capacity 24GiB --alloc-conf "expandable_segments:True"'))
    assert res.success
    a = shell.user_ns["r"].analysis()
    labels = [row[0] for row in a.comparison]
    assert labels[:2] == ["reserved at end", "allocated at end"]
    assert a.model is not None and a.model.config.expandable_segments
    assert "simulated" in capsys.readouterr().out


def test_simulated_oom_on_a_small_card_is_diagnosed(shell):
    shell.run_cell("history.clear()")
    res = shell.run_cell(LEAKY.format(opts="--simulate --capacity 1MiB --quiet"))
    assert res.success  # the CPU run itself does not fail
    d = shell.user_ns["r"].diagnosis()
    assert d is not None and d.source.startswith("allocator model")
    assert d.cause in ("exhaustion", "fragmentation") and d.advice
    html = shell.user_ns["r"]._repr_mimebundle_()["text/html"]
    assert "Out-of-memory diagnosis" in html


def test_export_pickle_is_accepted_by_memory_viz(shell, tmp_path):
    out = tmp_path / "cell.pickle"
    assert shell.run_cell(LEAKY.format(opts=f"--quiet --export {out}")).success
    snap = load_snapshot(out)  # builtins only: the safe loader accepts it
    assert snap.device_traces[0] and snap.segments
    with open(out, "rb") as fh:
        assert pickle.load(fh)["device_traces"]
    proc = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "segment" in proc.stdout.lower() or "total" in proc.stdout.lower()


@pytest.mark.parametrize("suffix", [".html", ".tlprof"])
def test_export_html_and_tlprof(shell, tmp_path, suffix):
    out = tmp_path / f"cell{suffix}"
    assert shell.run_cell(CLEAN.format(opts=f"--quiet --export {out}")).success
    assert out.stat().st_size > 1000
    if suffix == ".tlprof":
        import torchlens
        from torchlens.frontends.kinds import report_html as render_report

        html = render_report(torchlens.load(str(out)).profile)
        assert "Top allocation sites" in html


def test_backward_and_optimizer_step_allocations_get_their_lines():
    # SiteRecorder skips metadata-only torch calls; backward() and the optimizer's
    # in-place ops return None but allocate, and must keep their user lines.
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 128)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(32, 128)
    lines = {}
    with MemoryCapture(MemoryOptions(stacks=32)) as cap:
        opt.zero_grad()
        loss = model(x).square().sum()
        lines["backward"] = sys._getframe().f_lineno + 1
        loss.backward()  # allocates the grads
        lines["step"] = sys._getframe().f_lineno + 1
        opt.step()  # first step: allocates the momentum buffers
    trace = cap.profile.snapshots["device0"].device_traces[0]
    weight = 128 * 128 * 4

    def at(line):
        return [e for e in trace if e.action == "alloc" and any(
            f.filename == __file__ and f.line == line for f in e.frames)]

    assert any(e.size >= weight for e in at(lines["backward"])), lines
    assert any(e.size >= weight for e in at(lines["step"])), lines
    unattributed = [e for e in trace if e.action == "alloc" and not e.frames]
    assert not [e for e in unattributed if e.size >= weight], unattributed


def test_calls_skipped_by_the_recorder_do_not_allocate():
    # If one of these allocated, its allocation would get no frames: check on a
    # leaf with a grad, a non-leaf and a view that none allocates.
    import warnings

    from torchlens.capture.memory.cpu import (
        _NO_ALLOC_ATTRS,
        _NO_ALLOC_METHODS,
        NO_ALLOC,
    )

    leaf = torch.nn.Parameter(torch.randn(64, 64))
    leaf.grad = torch.randn(64, 64)
    nonleaf = leaf * 2
    view = leaf.detach()[:, :8]
    assert torch.Tensor.backward not in NO_ALLOC and torch.Tensor.add_ not in NO_ALLOC
    with warnings.catch_warnings(), MemoryCapture(MemoryOptions(stacks=0)) as cap:
        warnings.simplefilter("ignore")
        for t in (leaf, nonleaf, view):
            for name in _NO_ALLOC_ATTRS:
                try:
                    getattr(t, name)
                except (AttributeError, RuntimeError):
                    pass
            for name in _NO_ALLOC_METHODS:
                if name in ("requires_grad_", "retain_grad") and t is not leaf:
                    continue
                getattr(t, name)()
        leaf.grad = leaf.grad
        leaf.data = leaf.data
        leaf.requires_grad = True
        leaf.grad = None
    trace = cap.profile.snapshots["device0"].device_traces[0]
    assert [e for e in trace if e.action == "alloc"] == []


def _sizes(text: str) -> list[float]:
    """Every byte figure in ``text`` ("1.53 MiB", "-4 B"), in bytes, sign kept."""
    mult = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    return [float(n) * mult[u] for n, u in re.findall(r"(-?[\d.]+) (B|KiB|MiB|GiB)\b", text)]


def test_cell_that_frees_tensors_made_before_it_is_never_negative(shell):
    """Frees of memory allocated before the cell made its peak and
    end negative ("peak -4 B allocated") and the chart dip below zero."""
    from torchlens.render.memory.report import summary_rows, timeline_figure

    # Made under a capture, as in the tutorial: torch's CPU allocator reports the
    # free of a block only if it saw the block's size while profiling.
    assert shell.run_cell("%%gpumem -o r0\npre = [torch.randn(256, 256) for _ in range(4)]").success
    res = shell.run_cell("%%gpumem -o r\npre.clear()\nsmall = torch.randn(16, 16)\n")
    assert res.success, res.error_in_exec
    r = shell.user_ns["r"]
    a = r.analysis()
    before = 4 * 256 * 256 * 4
    line = repr(r)
    peak, end = _sizes(line.split("peak ", 1)[1])[:2]
    assert peak >= before and end >= 0, line
    assert "alive at the start (inferred from frees)" in line
    rows = dict(summary_rows(a))
    assert _sizes(rows["alive at the start (inferred from frees)"])[0] >= before
    assert _sizes(rows["peak allocated"])[0] >= before
    assert _sizes(rows["allocated at end"])[0] >= 0
    assert any("alive at the start" in n for n in a.notes)
    fig = timeline_figure(a)
    ys = [y for rr in fig.renderers for y in rr.data_source.data.get("y", [])]
    assert ys and min(ys) >= 0 and max(ys) >= before / 2**20
