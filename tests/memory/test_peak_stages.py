"""Memory at the peak by annotation stage: the innermost ``record_function`` range open
when each block was allocated (a CPU ``%%gpumem`` capture; a snapshot's
``external_annotations``), and one line saying so when none was recorded."""

from __future__ import annotations

import pickle

from torchlens.frontends.kinds import report_html, text
from torchlens.frontends.memory.api import load_gpumem

STAGED = """%%gpumem -o staged_r
st_keep = []
with torch.profiler.record_function("forward"):
    st_keep.append(torch.empty(25_000))  # 100,000 bytes, kept
    st_tmp = torch.empty(100_000)  # freed before the peak: no bytes at it
    del st_tmp
with torch.profiler.record_function("backward"):
    st_keep.append(torch.empty(50_000))
with torch.profiler.record_function("optimizer"):
    with torch.profiler.record_function("inner"):
        st_keep.append(torch.empty(75_000))
    st_keep.append(torch.empty(5_000))
st_outside = torch.empty(2_500)
"""


def test_cpu_capture_bytes_by_record_function_stage(shell):
    assert shell.run_cell("import torch").success
    res = shell.run_cell(STAGED)
    assert res.success, res.error_in_exec
    r = shell.user_ns["staged_r"]
    pk = r.analysis().peak
    assert pk.peak == 630_000  # everything kept, at the last allocation
    got = r.stages().set_index("stage")["bytes"].to_dict()
    assert got == {"forward": 100_000, "backward": 200_000, "inner": 300_000,
                   "optimizer": 20_000, "(no annotation open)": 10_000}
    assert not any("record_function" in m for m in pk.missing)
    out = text(r.profile, r.analysis())
    assert "alive at the peak by stage" in out and "inner" in out
    assert "peak-stages" in report_html(r.profile, r.analysis())


TRAIN = """%%gpumem -o train_r
for _ in range(2):
    tr_opt.zero_grad()
    with torch.profiler.record_function("forward"):
        tr_loss = tr_model(tr_x).square().mean()
    with torch.profiler.record_function("backward"):
        tr_loss.backward()
    with torch.profiler.record_function("optimizer"):
        tr_opt.step()
"""


def test_training_step_adam_state_in_the_step_gradients_in_backward(shell):
    assert shell.run_cell(
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
        "tr_model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 64))\n"
        "tr_opt = torch.optim.Adam(tr_model.parameters(), lr=1e-3)\n"
        "tr_x = torch.randn(256, 64)").success
    res = shell.run_cell(TRAIN)
    assert res.success, res.error_in_exec
    r = shell.user_ns["train_r"]
    params = list(shell.user_ns["tr_model"].parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    pk = r.analysis().peak
    by_stage: dict[tuple[str, str], int] = {}
    for b in pk.blocks:
        by_stage[b.stage, b.category] = by_stage.get((b.stage, b.category), 0) + b.size
    # Adam's exp_avg / exp_avg_sq (and its step counts) are made inside torch's own
    # range, nested in the user's "optimizer": the innermost one names them
    assert by_stage["Optimizer.step#Adam.step", "optimizer state"] == \
        2 * param_bytes + 4 * len(params)
    # the peak is in the second backward pass: what it holds was made where it says
    stages_of = {c: {s for s, c2 in by_stage if c2 == c} for _s, c in by_stage}
    assert stages_of["gradient"] == {"backward"}
    assert stages_of["activation"] == {"forward"}
    assert stages_of["optimizer state"] == {"Optimizer.step#Adam.step"}
    assert r.stages()["bytes"].sum() == pk.peak


def test_no_annotations_is_one_line_and_no_table(shell, tmp_path):
    assert shell.run_cell("import torch").success
    assert shell.run_cell("%%gpumem -o plain_r\npl = [torch.empty(1000) for _ in range(3)]\n"
                          ).success
    r = shell.user_ns["plain_r"]
    assert r.stages().empty
    lines = [m for m in r.analysis().peak.missing if "record_function" in m]
    assert len(lines) == 1 and "memory by stage" in lines[0]
    assert "missing: No record_function annotations recorded" in text(r.profile, r.analysis())


def test_snapshot_annotations_nested_and_unclosed(tmp_path):
    """A snapshot's external_annotations: an allocation goes to the innermost open range;
    a range still open at the dump runs to the end; a malformed entry is skipped and said."""
    def alloc(addr, size, t):
        return {"action": "alloc", "addr": addr, "size": size, "time_us": t,
                "frames": [{"filename": "/home/me/t.py", "name": "f", "line": t}]}
    trace = [alloc(1 << 20, 512, 10), alloc(2 << 20, 1024, 20), alloc(3 << 20, 2048, 30),
             alloc(4 << 20, 4096, 40)]
    ann = [{"stage": "START", "name": "ProfilerStep#1", "device": 0, "time_us": 5},
           {"stage": "START", "name": "forward", "device": 0, "time_us": 15},
           {"stage": "END", "name": "forward", "device": 0, "time_us": 25},
           {"stage": "END", "name": "ProfilerStep#1", "device": 0, "time_us": 35},
           {"stage": "START", "name": "step", "device": 0, "time_us": 38},
           {"stage": "BEGIN", "name": 3}]
    seg = {"address": 1 << 20, "total_size": 4 << 20, "blocks": [
        {"address": e["addr"], "size": e["size"], "state": "active_allocated"} for e in trace]}
    path = tmp_path / "ann.pickle"
    path.write_bytes(pickle.dumps({"segments": [seg], "device_traces": [trace],
                                   "external_annotations": ann}))
    r = load_gpumem(str(path))
    assert r.stages().set_index("stage")["bytes"].to_dict() == {
        "ProfilerStep#1": 512 + 2048, "forward": 1024, "step": 4096}
    assert any("1 of the snapshot's external_annotations were malformed" in m
               for m in r.analysis().peak.missing)
