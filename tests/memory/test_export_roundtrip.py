"""A %%gpumem result exported to a snapshot .pickle and opened again:
``torchlens.load``, ``torchlens report`` and ``%gpumem --load`` give the live result's
figures (peak, categories, sites, leaks, timeline), never a negative row."""

from __future__ import annotations

import pickle

import pytest

import torchlens
from torchlens.render.memory.report import text_report

ADAM = """%%gpumem -o r --quiet --export {out}
adam = torch.optim.Adam(model.parameters(), lr=1e-3)
for i in range(3):
    adam.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    adam.step()
"""

LEAK = """%%gpumem -o r --quiet --export {out}
keep = []
for i in range(5):
    t = torch.ones(64, 1024)
    keep.append(t * 2)
"""


def _rows(groups):
    return [(g.name, g.bytes, g.count) for g in groups]


def _capture(shell, tmp_path, cell, name="cell.pickle"):
    out = tmp_path / name
    assert shell.run_cell(cell.format(out=out)).success
    return shell.user_ns["r"], out


@pytest.mark.parametrize("cell", [ADAM, LEAK], ids=["adam", "leak"])
def test_export_then_load_gives_the_live_figures(shell, tmp_path, cell):
    live, out = _capture(shell, tmp_path, cell)
    back = torchlens.load(str(out))
    a, b = live.analysis(), back.analysis()
    assert b.timeline.peak_allocated == a.timeline.peak_allocated
    assert b.timeline.start_allocated == a.timeline.start_allocated
    assert b.timeline.end_allocated == a.timeline.end_allocated
    assert b.timeline.allocated == a.timeline.allocated
    assert _rows(b.peak.by_category) == _rows(a.peak.by_category)
    assert _rows(b.peak.by_site) == _rows(a.peak.by_site)
    assert b.peak.unattributed == a.peak.unattributed
    assert [(s.site, s.bytes, s.count) for s in back.sites()] == \
        [(s.site, s.bytes, s.count) for s in live.sites()]
    for g in b.peak.by_category + b.peak.by_site:
        assert g.bytes >= 0 and g.share <= 1.0, g
    assert "-" not in "".join(f"{g.share}" for g in b.peak.by_category)


def test_export_then_load_keeps_the_leak_and_the_cell_number(shell, tmp_path):
    live, out = _capture(shell, tmp_path, LEAK)
    assert [x.site for x in live.leaks()], "the live capture flags the loop"
    back = torchlens.load(str(out))
    assert [(x.site, x.count, x.passes) for x in back.leaks()] == \
        [(x.site, x.count, x.passes) for x in live.leaks()]
    assert "cell [" in back.leaks()[0].site
    # a kernel's cells compile as /tmp/ipykernel_<pid>/<hash>.py: only this table names them
    assert back.analysis().cells == live.analysis().cells != {}
    assert back.to_json()["leaks"] == live.to_json()["leaks"]


def test_the_exported_pickle_stays_torch_format(shell, tmp_path):
    """memory_viz reads the modelled segments; the capture's own figures ride along."""
    _live, out = _capture(shell, tmp_path, ADAM)
    snap = pickle.loads(out.read_bytes())
    assert snap["segments"] and snap["device_traces"][0]


def test_reloaded_text_has_no_negative_row(shell, tmp_path):
    _live, out = _capture(shell, tmp_path, ADAM)
    back = torchlens.load(str(out))
    text = text_report(back.profile, back.analysis())
    assert " -" not in text.split("peak", 1)[1].split("top allocation sites", 1)[0], text
    assert "missing: -" not in text


def test_segments_that_disagree_with_the_history_make_no_negative_row(tmp_path):
    """Torchlens' older CPU exports: modelled segments, addresses the history never saw."""
    frames = [{"filename": "train.py", "line": 3, "name": "<module>"}]
    trace = [{"action": "alloc", "addr": 4096, "size": 1 << 20, "stream": 0,
              "time_us": 10, "frames": frames}]
    block = {"address": 1 << 30, "size": 1 << 20, "requested_size": 1 << 20,
             "state": "active_allocated", "frames": []}
    seg = {"device": 0, "address": 1 << 30, "total_size": 2 << 20, "stream": 0,
           "segment_type": "large", "blocks": [block, {"address": (1 << 30) + (1 << 20),
                                                      "size": 1 << 20, "state": "inactive"}]}
    path = tmp_path / "disagree.pickle"
    path.write_bytes(pickle.dumps({"segments": [seg], "device_traces": [trace]}))
    r = torchlens.load(str(path))
    peak = r.analysis().peak
    assert all(g.bytes >= 0 and g.share <= 1 for g in peak.by_category), peak.by_category
    assert sum(g.bytes for g in peak.by_category) == peak.peak == 1 << 20
    assert any("disagree" in m for m in peak.missing), peak.missing


def test_a_damaged_record_is_said_in_one_line_and_the_file_still_reads(shell, tmp_path):
    _live, out = _capture(shell, tmp_path, LEAK)
    snap = pickle.loads(out.read_bytes())
    snap["torchlens_capture"]["runs"] = "not runs"
    out.write_bytes(pickle.dumps(snap))
    back = torchlens.load(str(out))
    assert back.analysis().measured_on == "snapshot"
    assert any("damaged (runs is not a list" in line for line in back.profile.unmeasured)


def test_a_cell_that_allocates_nothing_says_so(shell):
    assert shell.run_cell("%%gpumem -o r --quiet\nz = 1 + 1").success
    r = shell.user_ns["r"]
    out = text_report(r.profile, r.analysis())
    assert "segments only" not in out, out
    assert "nothing was allocated in the cell" in out


def test_allocated_is_one_figure_in_the_summary_and_the_fragmentation_table(shell, tmp_path):
    from torchlens.render.memory.report import fragmentation_rows, summary_rows

    live, out = _capture(shell, tmp_path, ADAM)
    a = live.analysis()
    assert a.frag.allocated != a.timeline.end_allocated  # the model rounds 40 B biases up
    frag, summary = dict(fragmentation_rows(a)), dict(summary_rows(a))
    assert frag["allocated"] == summary["allocated at end"]


def test_a_4_byte_tensor_stays_4_bytes_after_export(shell, tmp_path):
    cell = "%%gpumem -o r --quiet --export {out}\nsmall = torch.ones(1)\n"
    live, out = _capture(shell, tmp_path, cell)
    back = torchlens.load(str(out))
    assert [s.bytes for s in back.sites()] == [s.bytes for s in live.sites()] == [4]
    assert back.analysis().timeline.peak_allocated == 4


def test_report_help_says_where_the_default_output_goes(shell, tmp_path, monkeypatch, capsys):
    from torchlens.frontends.cli.main import main

    _live, out = _capture(shell, tmp_path, LEAK, name="cell.pickle")
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    assert "in the current folder" in " ".join(capsys.readouterr().out.split())
    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["report", str(out)]) == 0
    assert (here / "cell.html").exists() and not (tmp_path / "cell.html").exists()
