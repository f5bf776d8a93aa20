"""OOM diagnosis: a real shared snapshot with fragmentation, and a synthetic exhaustion."""

from __future__ import annotations

import pytest
from gpumem_fixtures import SNAPSHOTS

from torchlens.analysis.memory import fragmentation
from torchlens.analysis.memory.allocator import AllocatorConfig
from torchlens.analysis.memory.oom import (
    from_model_oom,
    from_snapshot,
    parse_oom_message,
)
from torchlens.analysis.memory.what_if import run_model
from torchlens.model.snapshot import Frame, TraceEntry, load_snapshot

GIB = 1024**3
MIB = 1024**2


def test_parse_torch_message():
    msg = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
           "79.15 GiB of which 6.69 MiB is free. Including non-PyTorch memory, this process has "
           "79.14 GiB memory in use. Of the allocated memory 77.34 GiB is allocated by PyTorch, "
           "and 1.31 GiB is reserved by PyTorch but unallocated.")
    f = parse_oom_message(msg)
    assert f["requested"] == 20 * MIB and f["free_cached"] == int(1.31 * GIB)
    assert f["device_free"] == int(6.69 * MIB) and f["allocated"] == int(77.34 * GIB)


def test_fragmented_shared_snapshot():
    snap = load_snapshot(SNAPSHOTS / "ftcourse_older_format.pickle")
    s = fragmentation.summarize(snap)
    request = s.largest_free["large"] + 2 * MIB  # fits the free total, not any block
    assert s.free_cached > request
    trace = [TraceEntry("oom", 0, request, device_free=0)]
    d = from_snapshot(snap, trace=trace)
    assert d.cause == "fragmentation"
    assert d.free_cached == s.free_cached and d.largest_usable <= s.largest_free["large"]
    assert d.inactive_split == s.inactive_split > 0
    actions = " ".join(a.action for a in d.advice)
    assert "expandable_segments:True" in actions and "max_split_size_mb" in actions
    # every piece of advice carries a figure
    assert all(any(ch.isdigit() for ch in a.evidence) for a in d.advice)


def test_synthetic_exhaustion_with_the_model():
    trace, t = [], 0
    for i in range(12):  # 12 x 100 MiB kept alive on a 1 GiB card
        trace.append(TraceEntry("alloc", 1000 + i, 100 * MIB, time_us=t,
                                frames=[Frame("<ipython-input-3-ab>", "<module>", 4)]))
        t += 1
    run = run_model(trace, AllocatorConfig(), capacity=GIB)
    assert run.ooms
    idx, first = run.ooms[0]
    d = from_model_oom(first, run.snapshot, site="cell [3] line 4")
    assert d.cause == "exhaustion" and d.requested == 100 * MIB
    assert d.capacity == GIB and d.allocated >= 10 * 100 * MIB
    # this trace has no backward pass, so no batch to shrink; the
    # advice says how much is missing instead (a new 100 MiB segment, 24 MiB free)
    assert d.advice[0].action == "Keep less alive when this allocation runs"
    assert d.shortfall == 76 * MIB and "76.0 MiB more free on the device" in d.advice[0].evidence
    trained = from_model_oom(first, run.snapshot, site="cell [3] line 4", training=True)
    assert "smaller batch" in trained.advice[0].action


# --- the explanation, the table, the chart and the fields agree ---

_PHRASES = {
    "requested": r"^(\S+ \S+) was requested",
    "total_free": r"(\S+ \S+) was free in total",
    "free_cached": r"\((\S+ \S+) cached by the allocator",
    "device_free": r"cached by the allocator, (\S+ \S+) on the device",
    "capacity": r"on the device of (\S+ \S+)\)",
    "usable_free": r"largest piece this request could use was (\S+ \S+)",
    "largest_usable": r"largest usable cached block was (\S+ \S+)",
    "segment_size": r"needs a new (\S+ \S+) segment",
    "allocated": r"(\S+ \S+) is allocated by tensors",
    "shortfall": r"(\S+ \S+) short of",
}
_ROWS = {"requested": "requested", "total_free": "free in total",
         "free_cached": "reserved but free (cached)", "device_free": "free on the device",
         "capacity": "capacity", "usable_free": "largest piece this request could use",
         "largest_usable": "largest usable cached block",
         "segment_size": "new segment a request of this size needs", "allocated": "allocated",
         "shortfall": "short by"}


def assert_diagnosis_agrees(r):
    """Every figure the explanation states is the field's value and the table's row;
    the text view shows the same explanation; the chart draws the same figures."""
    import re
    from html import unescape

    from torchlens.model.units import format_bytes
    from torchlens.render.memory.report import (
        diagnosis_html,
        text_report,
        timeline_figure,
    )

    a = r.analysis()
    d = a.diagnosis
    box = str(diagnosis_html(d))  # the table as the report shows it
    rows = {unescape(k): unescape(v) for k, v in
            re.findall(r'<tr><th>(.*?)</th><td class="num">(.*?)</td></tr>', box)}
    assert unescape(box).count(d.finding.sentence) == 1
    said = {k: m.group(1) for k, pat in _PHRASES.items() if (m := re.search(pat, d.finding.sentence))}
    assert {"requested", "total_free", "free_cached", "device_free"} <= set(said), d.finding.sentence
    for key, text in said.items():
        assert text == format_bytes(getattr(d, key)) == rows.get(_ROWS[key]), (key, d.finding.sentence, rows)
    assert d.total_free == (d.free_cached or 0) + (d.device_free or 0)
    assert d.usable_free <= d.total_free
    if d.cause == "exhaustion":
        assert "shortfall" in said and d.shortfall > 0
        if "segment_size" in said:
            assert d.shortfall == d.segment_size - d.device_free
    assert d.finding.sentence in text_report(r.profile, a)
    for x in d.advice:  # a shortfall in the advice is the diagnosis' own
        for short in re.findall(r"(\S+ \S+) short\b", x.evidence):
            assert short == format_bytes(d.shortfall), x.evidence
    fig = timeline_figure(a)
    (bar,) = [g for g in fig.renderers if type(g.glyph).__name__ == "Segment"]
    data = bar.data_source.data
    # drawn in the axis' unit (GiB from a 1 GiB peak)
    per = {"MiB": MIB, "GiB": 1 << 30}[fig.yaxis[0].axis_label.split()[0]]
    assert data["y0"][0] * per == (d.allocated or 0)
    assert data["y1"][0] * per == (d.allocated or 0) + d.requested
    if d.capacity:
        assert any(set(g.data_source.data.get("y", [])) == {d.capacity / per}
                   for g in fig.renderers if type(g.glyph).__name__ == "Line")
    return a, d


def test_simulated_oom_on_a_small_card_agrees_with_itself(shell):
    """The tutorial's 24 MiB card: 4 MiB requests each need a new 20 MiB segment."""
    cell = ("%%gpumem -o r --simulate --capacity 24MiB --quiet\nbig = []\n"
            "for step in range(8):\n    big.append(torch.randn(1024, 1024))\n")
    assert shell.run_cell(cell).success
    r = shell.user_ns["r"]
    a, d = assert_diagnosis_agrees(r)
    assert d.cause == "exhaustion" and d.device_free == 4 * MIB and d.total_free == 4 * MIB
    assert d.segment_size == 20 * MIB and d.shortfall == 16 * MIB and d.usable_free == 0
    assert "only 0 B was free" not in d.finding.sentence
    assert not any("batch" in x.action for x in d.advice)  # the cell has no batch
    assert any("line 3" in x.evidence for x in d.advice)  # what holds the memory
    # the chart: the model's reserved memory and the allocated line drawn solid stop at
    # the simulated OOM, so allocated is never drawn above the reserved it lives in
    from torchlens.render.memory.report import timeline_figure

    fig = timeline_figure(a)
    solid = [g for g in fig.renderers if type(g.glyph).__name__ == "Step"
             and g.glyph.line_alpha == 1.0]
    reserved, allocated = (g.data_source.data for g in solid)
    assert max(allocated["y"]) <= max(reserved["y"]) == 20
    assert max(allocated["x"]) == a.oom_x / 1000  # solid up to the OOM bar, faded after
    # the first line: the model's reserved below the cell's allocated says why
    from torchlens.render.memory.report import summary_line

    line = summary_line(r.profile, a)
    assert ("reserved 20.0 MiB (allocator model: 3 simulated OOMs at 24.0 MiB, where it "
            "held at most 20.0 MiB allocated)") in line, line


@pytest.mark.skipif(not (SNAPSHOTS / "ctx128_fullstep.pickle").exists(), reason="no snapshots")
@pytest.mark.parametrize("request_mib, device_free_mib", [(30 * 1024, 512), (150, 60)])
def test_shared_snapshot_with_an_oom_entry_agrees_with_itself(tmp_path, request_mib,
                                                              device_free_mib):
    import pickle

    from torchlens.frontends.memory.api import load_gpumem

    snap = load_snapshot(SNAPSHOTS / "ctx128_fullstep.pickle")
    trace = snap.device_traces[0]
    last = trace[-1]
    trace.append(TraceEntry("oom", 0, request_mib * MIB, 0, last.frames,
                            time_us=last.time_us + 10, device_free=device_free_mib * MIB))
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps(snap.to_torch()))
    r = load_gpumem(str(path))
    a, d = assert_diagnosis_agrees(r)
    assert d.source == "trace oom entry" and a.oom_x == last.time_us + 10 - trace[0].time_us
