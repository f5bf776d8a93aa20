"""The memory timeline coloured by category: at
every drawn point the categories add up to the plain timeline's allocated bytes, the
peak is drawn at its exact height with the peak section's categories, and a big trace
is thinned to a bounded number of points without losing the peak."""

from __future__ import annotations

import html
import pickle
import re
from html import unescape

import pytest
from gpumem_fixtures import SNAPSHOT_FILES

from torchlens.analysis.memory.timeline_categories import MAX_POINTS
from torchlens.frontends.kinds import report_html
from torchlens.frontends.memory.api import load_gpumem
from torchlens.render.memory.timeline import timeline_figure

MODULE = {"filename": "/x/site-packages/torch/nn/modules/module.py", "name": "_call_impl",
          "line": 1}
AUTOGRAD = {"filename": "/x/site-packages/torch/autograd/graph.py", "name": "_engine_run_backward",
            "line": 1}
OPTIM = {"filename": "/x/site-packages/torch/optim/adam.py", "name": "_init_group", "line": 1}
INIT = {"filename": "/x/site-packages/torch/nn/init.py", "name": "kaiming_uniform_", "line": 1}
USER = {"filename": "/home/me/train.py", "name": "step", "line": 12}


def _check(a) -> None:
    """Every kept point sums to the timeline's allocated there, the peak is kept and is the
    peak section's, with its categories."""
    s, tl = a.category_timeline, a.timeline
    assert s is not None
    for p in range(len(s.x)):
        assert sum(s.bytes[n][p] for n in s.names) == s.total[p]
    # each kept point is a point of the timeline: its x and allocated figure are there
    pairs = set(zip([0, *tl.t_us], [tl.start_allocated, *tl.allocated], strict=True))
    assert all((x, v) in pairs for x, v in zip(s.x, s.total, strict=True))
    assert s.total[s.peak_point] == tl.peak_allocated == a.peak.peak
    assert max(s.total) == tl.peak_allocated
    at_peak = {n: v for n, v in s.at(s.peak_point).items() if v}
    assert at_peak == {r.name: r.bytes for r in a.peak.by_category if r.bytes}


@pytest.mark.parametrize("path", [p for p in SNAPSHOT_FILES], ids=lambda p: p.name)
def test_shared_snapshot_stack_adds_up_to_the_timeline(path):
    a = load_gpumem(str(path)).analysis()
    if not a.trace:
        assert a.category_timeline is None  # segments only: nothing to split over time
        return
    _check(a)
    assert len(a.category_timeline.x) <= MAX_POINTS + 3


def _snapshot(n_steps: int) -> dict:
    """Parameters kept from before the window, an optimizer state block freed in it,
    then ``n_steps`` forward/backward steps and one tall spike in the middle."""
    trace, addr = [], 1 << 20
    t = 10

    def ev(action, a, size, frames):
        nonlocal t
        t += 1
        trace.append({"action": action, "addr": a, "size": size, "time_us": t,
                      "frames": frames})

    ev("free_requested", 64, 4096, [OPTIM, USER])  # alive before, freed: optimizer state
    for i in range(n_steps):
        act, grad = addr + 2 * i * 65536, addr + (2 * i + 1) * 65536
        ev("alloc", act, 8192 * (1 + i % 3), [MODULE, USER])
        size = 1 << 22 if i == n_steps // 2 else 2048
        ev("alloc", grad, size, [AUTOGRAD, USER])
        ev("free_requested", grad, size, [AUTOGRAD, USER])
        ev("free_requested", act, 8192 * (1 + i % 3), [MODULE, USER])
    seg = {"address": 0, "total_size": 1 << 30, "device": 0, "segment_type": "large",
           "allocated_size": 1 << 20, "active_size": 1 << 20, "stream": 0,
           "blocks": [{"address": 0, "size": 1 << 20, "state": "active_allocated",
                       "requested_size": 1 << 20, "frames": [INIT, MODULE, USER]}]}
    return {"segments": [seg], "device_traces": [trace]}


def test_small_synthetic_snapshot_stack(tmp_path):
    path = tmp_path / "small.pickle"
    path.write_bytes(pickle.dumps(_snapshot(6)))
    a = load_gpumem(str(path)).analysis()
    _check(a)
    s = a.category_timeline
    assert len(s.x) == len(a.timeline.t_us) + 1  # small: nothing thinned
    # the kept parameters stay the whole window, the optimizer state until its free
    assert set(s.bytes["parameter"]) == {1 << 20}
    assert s.bytes["optimizer state"][0] == 4096 and s.bytes["optimizer state"][-1] == 0
    # longest-lived lowest: parameters, then optimizer state, then activations
    assert s.names.index("parameter") < s.names.index("optimizer state") < s.names.index(
        "activation") < s.names.index("backward temporary")
    assert max(s.bytes["backward temporary"]) == 1 << 22  # the spike, at its exact height


def test_big_trace_is_thinned_but_keeps_its_peak(tmp_path):
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(_snapshot(30_000)))  # 120k events
    a = load_gpumem(str(path)).analysis()
    s = a.category_timeline
    assert s.events == len(a.timeline.t_us) + 1 > 100_000
    assert len(s.x) <= MAX_POINTS + 3
    _check(a)
    assert s.x[-1] == a.timeline.t_us[-1] and s.total[-1] == a.timeline.end_allocated


def _report(tmp_path, categories=None):
    path = tmp_path / "small.pickle"
    path.write_bytes(pickle.dumps(_snapshot(6)))
    r = load_gpumem(str(path))
    if categories:
        r.set_categories(categories)
    a = r.analysis()
    return a, report_html(r.profile, a), timeline_figure(a)


def _areas(fig) -> dict[str, str]:
    """legend label -> fill colour of the stacked areas"""
    out = {}
    for item in fig.legend[0].items:
        for g in item.renderers:
            if type(g.glyph).__name__ == "VAreaStep":
                out[item.label.value] = g.glyph.fill_color
    return out


def test_report_draws_the_stack_with_a_legend_naming_each_category(tmp_path):
    a, page, fig = _report(tmp_path)
    names = a.category_timeline.names
    assert {"parameter", "optimizer state", "activation", "backward temporary"} <= set(names)
    areas = _areas(fig)
    assert list(areas) == names  # one legend entry per category, in stacking order
    assert len(set(areas.values())) == len(names)  # one colour each
    assert "inferred" in fig.title.text
    for n in names:
        assert html.escape(n) in page
    # one word, one colour: the peak section's swatch of a category is its area's colour
    swatches = dict((unescape(n), c) for c, n in re.findall(
        r'class="swatch" style="[^"]*background:(#[0-9A-Fa-f]{6})"></span>([^<]+)</td>', page))
    assert swatches and all(areas[n] == c for n, c in swatches.items())


def test_a_category_named_like_markup_is_escaped(tmp_path):
    evil = "<script>alert(1)</script>"
    _a, calm, _f = _report(tmp_path, {"mine": r"train\.py"})
    a, page, fig = _report(tmp_path, {evil: r"train\.py"})
    assert evil in a.category_timeline.names and evil in _areas(fig)
    assert evil not in page and "alert(1)" in page
    assert page.count("<script") == calm.count("<script")
    assert html.escape(evil) in page  # the peak table names it, as text


#: torch's memory profiler's words (``--categories torch``), written out here
TORCH_WORDS = {"parameter", "optimizer state", "input", "temporary", "activation", "gradient",
               "autograd detail"}

ADAM_STEPS = """%%gpumem --quiet --categories torch -o ct_r
for _ in range(3):
    ct_opt.zero_grad()
    ct_model(ct_x).pow(2).mean().backward()
    ct_opt.step()
"""


def test_torch_categories_stack_is_the_peak_table_in_torchs_words(shell):
    """The walk's Adam cell: the legend listed "backward temporary" and "optimizer
    temporary" (torchlens' words) for allocations torch's memory profiler had named, next
    to a peak table in torch's words. Every allocation torch named is drawn in torch's
    word; only those it named none fall back to the rules."""
    from torchlens.analysis.memory import categories as cat

    assert shell.run_cell("import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
                          "ct_model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(3)])\n"
                          "ct_opt = torch.optim.Adam(ct_model.parameters(), lr=1e-3)\n"
                          "ct_x = torch.randn(64, 256)").success
    res = shell.run_cell(ADAM_STEPS)
    assert res.success, res.error_in_exec
    a = shell.user_ns["ct_r"].analysis()
    _check(a)  # at the peak point the stack is the peak table, row for row
    s = a.category_timeline
    assert "from torch's memory profiler" in timeline_figure(a).title.text
    unnamed = {cat.categorize(e.frames or []) for e in a.trace
               if e.action == "alloc" and not any(
                   n for _t, n in e.torch_category or [])}
    lifetime = {cat.OPTIMIZER: {cat.OPTIMIZER_TEMP}, cat.BACKWARD: {cat.GRADIENT}}
    allowed = TORCH_WORDS | unnamed | set().union(*(lifetime.get(c, set()) for c in unnamed))
    assert set(s.names) <= allowed, set(s.names) - allowed
    assert cat.BACKWARD not in s.names  # torch named every allocation of backward
