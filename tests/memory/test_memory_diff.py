"""``torchlens diff A B`` and ``result.diff(other)`` on memory results: the
peak's change, what was alive at each peak by category and site, both timelines on one
axis, and ``--fail-if-larger`` as a CI gate."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import msgspec
import pytest

from torchlens.frontends.cli.main import main
from torchlens.frontends.kinds import report_html, text
from torchlens.model import InputError, load_profile
from torchlens.model.memory_figures import memory_diff_from

DATA = Path(__file__).resolve().parents[1] / "data" / "cuda"
SMALL, LARGE, WIDTH, HIDDEN = 32, 256, 64, 512
EXTRA = 256  # an nn.Linear(EXTRA, EXTRA) made in the cell: parameters, the same at both sizes

SETUP = f"""
import torch
from torch import nn
torch.manual_seed(0)
diff_model = nn.Sequential(nn.Linear({WIDTH}, {HIDDEN}), nn.ReLU(), nn.Linear({HIDDEN}, {WIDTH}))
x_small, x_large = torch.randn({SMALL}, {WIDTH}), torch.randn({LARGE}, {WIDTH})
def forward_with_head(x):
    head = nn.Linear({EXTRA}, {EXTRA})
    return head, diff_model(x)
"""


def _raw_peak(snapshot: dict) -> int:
    """The peak of the raw CPU trace, replayed here: requested bytes allocated less freed."""
    level = peak = 0
    for e in snapshot.device_traces[0]:
        if e.action == "alloc":
            level += e.size
        elif e.action in ("free_completed", "free"):
            level -= e.size
        peak = max(peak, level)
    return peak


@pytest.fixture(scope="module")
def two_batches(shell):
    assert shell.run_cell(SETUP).success
    out = []
    for name, x in (("diff_small", "x_small"), ("diff_large", "x_large")):
        res = shell.run_cell(f"%%gpumem -o {name}\nout_{name} = forward_with_head({x})\n")
        assert res.success, res.error_in_exec
        out.append(shell.user_ns[name])
    return out


def test_batch_size_growth_is_the_activations(two_batches):
    small, large = two_batches
    d = small.diff(large)
    # independently: Linear(64, 512) and ReLU outputs (float32) are both alive at the
    # peak (ReLU saves its output; the Linear output is freed only after ReLU made its own)
    activation_growth = (LARGE - SMALL) * HIDDEN * 4 * 2
    cats = d.categories().set_index("name")
    assert cats.loc["activation", "status"] == "grew"
    assert cats.loc["activation", "delta"] == activation_growth
    # the head's parameters are alive at both peaks, the same bytes
    params = EXTRA * EXTRA * 4 + EXTRA * 4
    assert cats.loc["parameter", "a_bytes"] == cats.loc["parameter", "b_bytes"] == params
    assert cats.loc["parameter", "status"] == "same"
    # the peak's change from the raw traces equals the activations' growth
    peak = d.figures().loc["peak"]
    raw_a, raw_b = _raw_peak(small.snapshot()), _raw_peak(large.snapshot())
    assert (peak["a"], peak["b"]) == (raw_a, raw_b)
    assert peak["delta"] == raw_b - raw_a == activation_growth
    # the sites are the user's lines, the same in both captures: grew, not added/removed
    sites = d.sites()
    assert set(sites.status) <= {"grew", "same"}
    assert d.verdict.startswith("peak allocated ")
    assert "most growth at the peak: activation +" in d.verdict
    assert d.regressed(50) is True and d.regressed(1000) is False


def test_report_has_the_verdict_first_and_both_timelines(two_batches, tmp_path):
    small, large = two_batches
    d = small.diff(large)
    page = report_html(d.profile, d.analysis())
    assert page.index("peak allocated") < page.index("Alive at the peak by category")
    assert "A and B on one axis" in page
    tl = d.diff.timelines
    assert tl.a.allocated[0] == 0 and max(tl.b.allocated) == d.diff.figures.peak.b
    assert "activation" in text(d.profile, d.analysis())
    # saved and loaded back, the same report
    path = d.save(str(tmp_path / "d.tlprof"))
    again = load_profile(path)
    assert again.kind == "memdiff" and again.payload.diff == d.diff
    assert again.payload.diff.verdict.code == "memory_diff"
    json.dumps(d.to_json(), allow_nan=False)
    # a diff saved before verdicts were findings held the sentence alone: it reads
    # back as an info finding of the diff's kind, the rest of the figures unchanged
    saved = msgspec.to_builtins(d.diff)
    older = memory_diff_from({**saved, "verdict": d.verdict})
    assert str(older.verdict) == d.verdict and older.verdict.code == "memory_diff"
    assert older.figures == d.diff.figures and older.sites == d.diff.sites


def test_cli_gate_on_saved_captures(two_batches, tmp_path, capsys):
    small, large = two_batches
    a, b = small.save(str(tmp_path / "a.tlprof")), large.save(str(tmp_path / "b.tlprof"))
    assert main(["diff", a, b, "--fail-if-larger", "50"]) == 1
    err = capsys.readouterr().err
    assert "peak allocated grew +" in err and "--fail-if-larger 50%" in err
    assert main(["diff", a, b, "--fail-if-larger", "1000"]) == 0
    assert main(["diff", b, a, "--fail-if-larger", "0"]) == 0  # B smaller: passes
    out = capsys.readouterr().out
    assert out.startswith("memory diff: peak allocated")


def test_cli_snapshots_json_and_html(tmp_path, capsys):
    a, b = DATA / "cuda_gpumem_train.pickle", DATA / "cuda_gpumem_expandable.pickle"
    html = tmp_path / "d.html"
    assert main(["diff", str(a), str(b), "--json", "-o", str(html)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "memdiff" and doc["figures"]["peak"]["a"] > 0
    assert sum(r["delta"] for r in doc["categories"]) == doc["figures"]["peak"]["delta"]
    assert "A and B on one axis" in html.read_text()


def test_cli_unusable_input_exits_2(tmp_path, capsys):
    snap = DATA / "cuda_gpumem_train.pickle"
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps({"nothing": 1}))
    assert main(["diff", str(snap), str(bad), "--fail-if-larger", "5"]) == 2
    assert "torchlens: error:" in capsys.readouterr().err
    trace = DATA / "cuda_torchprof.json.gz"
    assert main(["diff", str(snap), str(trace), "--fail-if-larger", "5"]) == 2
    err = capsys.readouterr().err
    assert "A is a memory result" in err and "B is not" in err
    assert main(["diff", str(snap), str(snap), "--fail-if-slower", "5"]) == 2
    assert "use --fail-if-larger" in capsys.readouterr().err


def test_result_diff_refuses_a_run(two_batches):
    with pytest.raises(InputError, match="not a memory result"):
        two_batches[0].diff(str(DATA / "cuda_torchprof.json.gz"))


def test_two_captures_in_one_second_are_told_apart(two_batches):
    """The walk: two cells captured within one second read "A: ... taken 21:30:05" and
    "B: ... taken 21:30:05", so the user cannot tell which side is which."""
    small, large = two_batches
    small.profile.created_at, large.profile.created_at = 1_800_000_000.125, 1_800_000_000.875
    d = small.diff(large)
    a, b = d.profile.payload.a, d.profile.payload.b
    assert a != b and a.endswith(".125") and b.endswith(".875")
    shown = text(d.profile, d.analysis())
    assert f"A: {a}" in shown and f"B: {b}" in shown
    # a second apart, the seconds alone tell them apart
    large.profile.created_at += 1
    d = small.diff(large)
    assert not d.profile.payload.a.endswith(".125")
