"""Categories from torch's own memory profiler on a live capture:
``%%gpumem --categories torch`` names what was alive at the peak as torch's
``_memory_profile()`` does, the figures equal torch's for the same run (computed
here from the profiler object itself), a private API that is missing or fails
falls back to the inferred rules with one line, and ``--category NAME=REGEX``
adds the user's own categories."""

from __future__ import annotations

import collections
import sys

import pytest
import torch

from torchlens.capture.memory import torch_categories as tc
from torchlens.frontends.kinds import report_html, text

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
tc_model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
tc_adam = torch.optim.Adam(tc_model.parameters(), lr=1e-3)
tc_x = torch.randn(128, 64)
"""

STEPS = """
for _ in range(2):
    tc_adam.zero_grad()
    tc_model(tc_x).square().mean().backward()
    tc_adam.step()
"""

#: torch's Category names as torchlens shows them (written out here, not imported)
WORDS = {"PARAMETER": "parameter", "OPTIMIZER_STATE": "optimizer state", "INPUT": "input",
         "TEMPORARY": "temporary", "ACTIVATION": "activation", "GRADIENT": "gradient",
         "AUTOGRAD_DETAIL": "autograd detail"}


@pytest.fixture
def fresh(shell):
    """A new model and optimizer, so the cell's first step makes the optimizer state."""
    assert shell.run_cell(SETUP).success
    return shell


@pytest.fixture
def kept_profiler(monkeypatch):
    """The real profiler the capture starts, kept so the test can ask torch itself."""
    kept = []
    real = tc.start_profiler

    def keep():
        prof = real()
        kept.append(prof)
        return prof

    monkeypatch.setattr(tc, "start_profiler", keep)
    return kept


def _torch_at(prof, addr: int, t_us: int) -> dict[str, int]:
    """torch's own bytes per category at the allocation at ``addr`` and ``t_us``: a walk
    of ``_memory_profile().timeline`` up to it (tensors made in the window)."""
    from torch.profiler._memory_profiler import Action, TensorKey

    mp = prof._memory_profile()
    line = mp.timeline
    t_peak = next(t for t, act, (k, _v), _n in line if act == Action.CREATE
                  and isinstance(k, TensorKey) and k.storage.ptr == addr
                  and abs(t // 1000 - t_us) <= 1)
    totals: collections.Counter = collections.Counter()
    for t, act, (key, version), n in line:
        if t > t_peak:
            break
        if t < 0 or not isinstance(key, TensorKey):
            continue
        get = mp._categories.get
        if act == Action.CREATE:
            totals[get(key, version)] += n
        elif act == Action.DESTROY:
            totals[get(key, version)] -= n
        elif act == Action.INCREMENT_VERSION:
            totals[get(key, version)] -= n
            totals[get(key, version + 1)] += n
    return {WORDS[c.name]: v for c, v in totals.items() if c is not None and v}


def test_category_totals_equal_torchs_memory_profiler(fresh, kept_profiler):
    res = fresh.run_cell("%%gpumem --quiet --categories torch -o tc_r" + STEPS)
    assert res.success, res.error_in_exec
    r = fresh.user_ns["tc_r"]
    a = r.analysis()
    pk = a.peak
    assert pk.category_from.startswith("from torch's memory profiler")
    ours: collections.Counter = collections.Counter()
    for b in pk.blocks:
        if b.source == "torch":
            ours[b.category] += b.size
    peak_entry = a.trace[pk.entry]
    theirs = _torch_at(kept_profiler[0], peak_entry.addr, peak_entry.time_us)
    assert dict(ours) == theirs
    assert {"parameter", "optimizer state", "gradient"} & set(theirs)
    # the rows still add up to the peak, and every view says who named the categories
    assert sum(row.bytes for row in pk.by_category) == pk.peak
    out = text(r.profile, a)
    assert "by category (from torch's memory profiler" in out
    html = report_html(r.profile, a)
    assert "Categories are torch&#39;s memory profiler&#39;s" in html
    assert set(r.categories()["source"]) <= {"from torch's memory profiler",
                                             "inferred from stacks", ""}


@pytest.mark.parametrize("mode", ["inferred", "torch"])
def test_adam_state_is_twice_the_parameters_after_the_first_step(fresh, mode):
    res = fresh.run_cell(f"%%gpumem --quiet --categories {mode} -o tc_r" + STEPS)
    assert res.success, res.error_in_exec
    r = fresh.user_ns["tc_r"]
    params = list(fresh.user_ns["tc_model"].parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    state = fresh.user_ns["tc_adam"].state
    steps = sum(s["step"].numel() * s["step"].element_size() for s in state.values())
    cats = r.categories().set_index("category")
    # exp_avg and exp_avg_sq per parameter, plus Adam's float32 step count per parameter
    assert cats.loc["optimizer state", "bytes"] == 2 * param_bytes + steps
    want = "from torch's memory profiler" if mode == "torch" else "inferred from stacks"
    assert cats.loc["optimizer state", "source"] == want


@pytest.mark.parametrize("breakage, why", [
    ("raises", "torch's memory profiler failed (RuntimeError: op graph walk failed)"),
    ("missing", "this torch's profiler has no _memory_profile()"),
    ("no module", "this torch has no torch.profiler._memory_profiler"),
])
def test_private_api_missing_or_failing_falls_back_in_one_line(fresh, monkeypatch,
                                                                breakage, why):
    if breakage == "raises":
        def boom(self):
            raise RuntimeError("op graph walk failed\n  at some C++ frame")
        monkeypatch.setattr(torch.profiler.profile, "_memory_profile", boom)
    elif breakage == "missing":
        owner = next(c for c in torch.profiler.profile.__mro__ if "_memory_profile" in vars(c))
        monkeypatch.delattr(owner, "_memory_profile")
    else:
        monkeypatch.setitem(sys.modules, "torch.profiler._memory_profiler", None)
    res = fresh.run_cell("%%gpumem --quiet --categories torch -o tc_r" + STEPS)
    assert res.success, res.error_in_exec
    r = fresh.user_ns["tc_r"]
    pk = r.analysis().peak
    assert pk.category_from == "inferred from stacks"
    line = next(m for m in pk.missing if "--categories torch" in m)
    assert why in line and line.endswith("they are inferred from stacks.")
    assert "\n" not in line
    out = text(r.profile, r.analysis())
    assert "Traceback" not in out and "by category (inferred from stacks)" in out


def test_own_regex_categories_from_the_magic(fresh):
    res = fresh.run_cell("%%gpumem --quiet --category 'adam=adam\\.py' "
                         "--category \"fwd=modules/linear\" -o tc_r" + STEPS)
    assert res.success, res.error_in_exec
    cats = fresh.user_ns["tc_r"].categories().set_index("category")
    assert "adam" in cats.index and "optimizer state" not in cats.index
    assert cats.loc["adam", "source"] == "from your regexes"


@pytest.mark.parametrize("option, message", [
    ("--category 'bad=(unclosed'", "%%gpumem: --category bad: bad regex '(unclosed'"),
    ("--category nameonly", "%%gpumem: --category 'nameonly': expected NAME=REGEX"),
    ("--categories mosaic", "%%gpumem: --categories must be one of inferred, torch, got 'mosaic'"),
])
def test_bad_category_options_are_one_line_before_the_cell_runs(fresh, option, message):
    fresh.user_ns["ran"] = False
    res = fresh.run_cell(f"%%gpumem --quiet {option}\nran = True")
    assert not res.success
    assert str(res.error_in_exec).startswith(message)
    assert "\n" not in str(res.error_in_exec)
    assert fresh.user_ns["ran"] is False


def test_torch_categories_on_a_loaded_snapshot_is_refused(fresh, tmp_path):
    import pickle

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    res = fresh.run_cell(f"%gpumem --quiet --categories torch --load {path}")
    assert not res.success and "needs a live capture" in str(res.error_in_exec)


def test_hover_of_a_torch_category_names_torch(fresh):
    res = fresh.run_cell("%%gpumem --quiet --categories torch -o tc_r" + STEPS)
    assert res.success, res.error_in_exec
    pk = fresh.user_ns["tc_r"].analysis().peak
    why = dict(pk.rules)
    torch_only = {b.category for b in pk.blocks if b.source == "torch"} - {
        b.category for b in pk.blocks if b.source != "torch"}
    assert torch_only
    assert all(why[name] == "named by torch's memory profiler" for name in torch_only)


def test_diff_says_who_named_the_categories(fresh):
    for name, mode in (("tc_a", "torch"), ("tc_b", "torch"), ("tc_c", "inferred")):
        res = fresh.run_cell(f"%%gpumem --quiet --categories {mode} -o {name}" + STEPS)
        assert res.success, res.error_in_exec
    a, b, c = (fresh.user_ns[n] for n in ("tc_a", "tc_b", "tc_c"))
    same = a.diff(b)
    assert same.to_json()["category_from"].startswith("from torch's memory profiler")
    mixed = a.diff(c).to_json()
    assert mixed["category_from"].startswith("A: from torch's memory profiler")
    assert any("a category's change may be a change of who named it" in n
               for n in mixed["notes"])


def test_made_by_says_torch_named_its_category(fresh):
    """The walk's "made by 4.0 MiB at cell [2] line 5 (activation)", line 5 being
    opt.step(): torch's memory profiler does name Adam's sqrt/div scratch tensors
    parameter and activation, so each view says the word is torch's."""
    res = fresh.run_cell("%%gpumem --quiet --categories torch -o tc_r" + STEPS)
    assert res.success, res.error_in_exec
    r = fresh.user_ns["tc_r"]
    a = r.analysis()
    t = a.peak.trigger
    assert t is not None and t.source == "torch"
    said = f"({t.category}, named by torch's memory profiler)"
    made_by = next(line for line in text(r.profile, a).splitlines() if "made by" in line)
    assert made_by.endswith(said)
    assert said.replace("'", "&#39;") in report_html(r.profile, a)
    assert a.peak.document().made_by.source == "torch"


DTYPES_CELL = """%%gpumem --quiet --categories {mode} -o dt_r
dt_half = torch.randn(512, 512, dtype=torch.float16)
dt_y = (dt_half @ dt_half).sum()
dt_model = nn.Linear(256, 256, bias=False).to(torch.bfloat16)
dt_adam = torch.optim.Adam(dt_model.parameters())
with torch.autocast("cpu", dtype=torch.bfloat16):
    dt_loss = dt_model(torch.randn(64, 256)).float().square().mean()
dt_loss.backward()
dt_adam.step()
"""


def test_bfloat16_and_float16_memory_are_told_apart(shell):
    res = shell.run_cell(DTYPES_CELL.format(mode="torch"))
    assert res.success, res.error_in_exec
    r = shell.user_ns["dt_r"]
    weight = shell.user_ns["dt_model"].weight
    by = r.dtypes().set_index("dtype")
    # the bfloat16 model's weight, its gradient and Adam's two moments, all alive at
    # the peak (Adam's step), and the float16 matrix; none counted in the other dtype
    assert by.loc["bfloat16", "bytes"] >= 4 * weight.numel() * weight.element_size()
    assert {"parameter", "gradient", "optimizer state"} <= set(
        by.loc["bfloat16", "categories"].split(", "))
    half = shell.user_ns["dt_half"]
    assert half.numel() * half.element_size() <= by.loc["float16", "bytes"] < (
        by.loc["bfloat16", "bytes"])
    assert by["bytes"].sum() == r.analysis().peak.peak  # every byte of the peak in a row
    out = text(r.profile, r.analysis())
    assert "alive at the peak by dtype (as torch's memory profiler saw each tensor)" in out
    assert "by dtype (as torch" in report_html(r.profile, r.analysis())


def test_without_torchs_profiler_no_dtype_is_claimed(shell):
    res = shell.run_cell(DTYPES_CELL.format(mode="inferred"))
    assert res.success, res.error_in_exec
    r = shell.user_ns["dt_r"]
    assert r.dtypes().empty
    assert "by dtype" not in text(r.profile, r.analysis())
