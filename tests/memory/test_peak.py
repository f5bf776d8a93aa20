"""What was alive at the peak: the peak agrees with the timeline,
its rows add up to it, categories come from the allocating stack, and a snapshot that
cannot answer says which answers are missing."""

from __future__ import annotations

import json
import pickle

import pytest
from gpumem_fixtures import SNAPSHOT_FILES

from torchlens.frontends.kinds import report_html, text
from torchlens.frontends.memory.api import load_gpumem
from torchlens.model import InputError

ADAM_SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
adam_model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 64))
adam = torch.optim.Adam(adam_model.parameters(), lr=1e-3)
xa = torch.randn(256, 64)
"""

ADAM_STEPS = """%%gpumem -o adam_r
for _ in range(2):
    adam.zero_grad()
    adam_model(xa).square().mean().backward()
    adam.step()
"""


def test_adam_state_at_the_peak_is_twice_the_parameters(shell):
    assert shell.run_cell(ADAM_SETUP).success
    res = shell.run_cell(ADAM_STEPS)
    assert res.success, res.error_in_exec
    r = shell.user_ns["adam_r"]
    params = list(shell.user_ns["adam_model"].parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    pk = r.analysis().peak
    assert pk.peak == r.analysis().timeline.peak_allocated
    cats = r.categories().set_index("category")["bytes"]
    # exp_avg and exp_avg_sq per parameter, plus Adam's float32 step count per parameter
    assert cats["optimizer state"] == 2 * param_bytes + 4 * len(params)
    assert cats.sum() == pk.peak
    sites = r.peak()
    state_site = sites[sites.categories.str.contains("optimizer state")]
    assert list(state_site.site.str.rsplit(" ", n=1).str[-1]) == ["4"]  # adam.step()
    assert "adam.py" in state_site["stack"].iloc[0]
    assert "optimizer state" in text(r.profile, r.analysis())


@pytest.mark.parametrize("path", [p for p in SNAPSHOT_FILES], ids=lambda p: p.name)
def test_shared_snapshot_peak_is_the_timelines_and_its_rows_add_up(path):
    r = load_gpumem(str(path))
    a = r.analysis()
    pk = a.peak
    assert pk.peak == a.timeline.peak_allocated
    if not a.trace:
        assert pk.missing and "No allocation history" in pk.missing[0]
        assert r.categories().empty
        return
    assert sum(b.size for b in pk.blocks) + pk.unattributed == pk.peak
    assert sum(r.bytes for r in pk.by_category) == pk.peak
    assert sum(r.bytes for r in pk.by_site) == pk.peak
    # the allocation that made the peak is an alloc entry of the trace, at the peak
    e = a.trace[pk.entry]
    assert e.action == "alloc" and pk.trigger is not None and pk.trigger.index == pk.entry
    assert json.loads(json.dumps(r.to_json()))["peak"]["peak_allocated"] == pk.peak


def test_fullstep_peak_is_adam_state_twice_the_gradients(snapshots_dir):
    r = load_gpumem(str(snapshots_dir / "ctx128_fullstep.pickle"))
    pk = r.analysis().peak
    assert pk.peak == 55078640128  # the timeline's; Mosaic says 51.165 GiB (see the report)
    cats = {c.name: c.bytes for c in pk.by_category}
    # the peak is in the user's AdamW step (a torch.optim.Optimizer): its exp_avg and
    # exp_avg_sq (optimizers.py:82, :84) are twice the gradients, which are what the
    # backward pass kept past its end (the snapshot has no AccumulateGrad frame)
    assert cats["optimizer state"] == pytest.approx(2 * cats["gradient"], rel=0.01)
    assert cats["gradient"] > 12 * 2**30 and cats.get("backward temporary", 0) == 0
    assert "optimizers.py:100" in pk.trigger.site
    r.set_categories({"my adamw": r"optimizers\.py:step"})
    mine = {c.name: c.bytes for c in r.analysis().peak.by_category}
    assert "optimizer state" not in mine
    assert mine["my adamw"] == cats["optimizer state"] + cats["optimizer temporary"]


def _snap(trace, segments=()):
    return pickle.dumps({"segments": list(segments), "device_traces": [trace]})


def _alloc(addr, size, t, frames):
    return {"action": "alloc", "addr": addr, "size": size, "time_us": t, "frames": frames}


def test_segments_only_says_which_answers_are_missing(tmp_path, snapshots_dir):
    r = load_gpumem(str(snapshots_dir / "segments_only.pickle"))
    out = text(r.profile, r.analysis())
    assert "missing: No allocation history (segments only): 20.0 MiB is what the segments " \
        "held allocated when the snapshot was taken, so the peak was at least that" in out
    assert "peak 20.0 MiB allocated, moment not known (no allocation history)" in out
    assert "not known\n" not in out and "top allocation sites:\n" not in out + "\n"
    # the first line gives one moment's figure, not a peak, end and change over a window
    # that was never recorded ("end 20.0 MiB (0 B across the recorded window)")
    assert out.splitlines()[0].startswith("torchlens gpumem: 20.0 MiB allocated when the "
                                          "snapshot was taken (segments only")
    assert "across the recorded window" not in out.splitlines()[0]
    assert "top allocation sites: none, no allocation history (the snapshot has segments " \
        "only)" in out
    html = report_html(r.profile, r.analysis())
    assert "No allocation history (segments only)" in html and "Traceback" not in html
    assert "No allocations." not in html and "which lines allocated is not known" in html


def test_no_frames_and_blocks_from_before_the_window(tmp_path):
    user = [{"filename": "train.py", "line": 7, "name": "step"}]
    trace = [_alloc(0x1000, 2 << 20, 10, []),  # no stack
             _alloc(0x9000, 1 << 20, 20, user),
             {"action": "free_requested", "addr": 0x5000, "size": 4 << 20, "time_us": 30,
              "frames": user},  # alive before the window, freed in it
             {"action": "mystery", "addr": 0, "size": 0, "time_us": 31, "frames": []}]
    path = tmp_path / "s.pickle"
    path.write_bytes(_snap(trace))
    r = load_gpumem(str(path))
    pk = r.analysis().peak
    assert pk.peak == r.analysis().timeline.peak_allocated
    assert sum(c.bytes for c in pk.by_category) == pk.peak
    missing = " ".join(pk.missing)
    assert "has no stack" in missing and "its category and site are unknown" in missing
    assert "mystery" in missing
    assert any(b.origin == "alive before, freed later" for b in pk.blocks)


def test_a_wrapped_history_says_its_peak_is_the_kept_parts():
    from torchlens.analysis.memory.peak import analyze_peak
    from torchlens.analysis.memory.timeline import build_timeline
    from torchlens.model.snapshot import Snapshot, normalize_snapshot

    raw = [_alloc(0x1000, 4096, 1, [{"filename": "a.py", "line": 1, "name": "f"}])]
    trace = normalize_snapshot({"device_traces": [raw]}).device_traces[0]
    tl = build_timeline(trace, start_allocated=8192)
    pk = analyze_peak(tl, trace, Snapshot(), wrapped=True)
    assert pk.peak == 12288 and pk.unattributed == 8192
    assert any("history wrapped" in m for m in pk.missing)
    assert any("unattributed" in m for m in pk.missing)


def test_custom_categories_come_first_and_bad_regex_is_one_line(tmp_path):
    frames = [{"filename": "/x/torch/nn/init.py", "line": 1, "name": "kaiming_uniform_"},
              {"filename": "train.py", "line": 3, "name": "main"}]
    path = tmp_path / "s.pickle"
    free = {"action": "free_requested", "addr": 0x1000, "size": 4096, "time_us": 2,
            "frames": []}
    path.write_bytes(_snap([_alloc(0x1000, 4096, 1, frames), free]))
    r = load_gpumem(str(path))
    assert list(r.categories().category) == ["parameter"]
    r.set_categories({"mine": r"train\.py:main"})
    assert list(r.categories().category) == ["mine"]
    with pytest.raises(InputError, match="bad regex"):
        r.set_categories({"x": "("})


def test_names_in_the_peak_section_are_escaped(tmp_path):
    frames = [{"filename": "<script>alert(1)</script>.py", "line": 1, "name": "<b>f</b>"}]
    path = tmp_path / "s.pickle"
    path.write_bytes(_snap([_alloc(0x1000, 4096, 1, frames)]))
    r = load_gpumem(str(path))
    html = report_html(r.profile, r.analysis())
    assert "<script>alert(1)</script>.py" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.py" in html


def test_a_stack_of_cpp_frames_alone_has_no_python_stack(tmp_path):
    """The walk: the ranks report named such sites "(no user frame) ??:0", beside
    "(no Python stack)" for the same thing elsewhere (torch's unwinder records C++
    frames with file "??" and line 0; the autograd engine's threads have no Python)."""
    cpp = [{"filename": "??", "line": 0, "name": "torch::unwind::unwind()"},
           {"filename": "memory_snapshot.cpp", "line": 0, "name": "gather_with_cpp()"}]
    torch_only = [{"filename": "/site-packages/torch/nn/functional.py", "line": 12,
                   "name": "linear"}, *cpp]
    trace = [_alloc(0x1000, 4 << 20, 10, cpp), _alloc(0x9000, 1 << 20, 20, torch_only)]
    path = tmp_path / "s.pickle"
    path.write_bytes(_snap(trace))
    for native in ("", "1"):  # the compiled reader's columns, then the Python loader
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TORCHLENS_NO_NATIVE", native)
            r = load_gpumem(str(path))
            sites = set(r.peak()["site"])
        assert "(no Python stack)" in sites
        assert "(no user frame) /site-packages/torch/nn/functional.py:12" in sites
        assert not any("??" in s or ".cpp" in s for s in sites)
    out = text(r.profile, r.analysis())
    assert "??:0" not in out and "(no Python stack)" in out
