"""Every memory chart (the single timeline, the diff's, the per-rank one) is drawn from 0
in the unit its text states the peak in (a 51.3 GiB peak drawn up to
60,000 MiB on an axis starting at 13,000 MiB made a 10% gap look like a doubling), and
the diff's legend tells A from B."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import torchlens
from torchlens.frontends.kinds import report_html
from torchlens.frontends.memory.api import load_gpumem
from torchlens.model.units import format_bytes
from torchlens.render.memory import diff as render_diff
from torchlens.render.memory import ranks as render_ranks
from torchlens.render.memory.timeline import timeline_figure

MIB, GIB = 1 << 20, 1 << 30
USER = [{"filename": "/nonexistent/proj/model.py", "line": 88, "name": "forward"},
        {"filename": "/opt/venv/lib/python3.12/site-packages/torch/nn/modules/module.py",
         "line": 1750, "name": "_call_impl"}]


def _snapshot(base: int, extra: int) -> bytes:
    """``base`` bytes allocated, then ``extra`` on top, then both freed."""
    trace, t = [], 0
    for action, addr, size in (("alloc", 1 << 40, base), ("alloc", 2 << 40, extra),
                               ("free_requested", 2 << 40, extra),
                               ("free_requested", 1 << 40, base)):
        t += 100
        trace.append({"action": action, "addr": addr, "size": size, "time_us": t,
                      "frames": USER, "stream": 0})
    return pickle.dumps({"segments": [], "device_traces": [trace]})


def _write(path: Path, base: int, extra: int) -> str:
    path.write_bytes(_snapshot(base, extra))
    return str(path)


def _drawn_max(fig) -> float:
    """The highest y any line, step or area of ``fig`` draws."""
    top = 0.0
    for r in fig.renderers:
        data = r.data_source.data
        for key in ("y", "y2", "total", *(k for k in data if k.startswith("c"))):
            if key in data and len(data[key]):
                top = max(top, float(max(data[key])))
    return top


def _check(fig, peak: int) -> None:
    unit = format_bytes(peak).split()[-1]
    assert unit in fig.yaxis[0].axis_label, (fig.yaxis[0].axis_label, format_bytes(peak))
    assert fig.y_range.start == 0
    scale = {"GiB": GIB, "MiB": MIB, "KiB": 1024}[unit]
    assert _drawn_max(fig) == pytest.approx(peak / scale, rel=1e-3)


@pytest.mark.parametrize("base, extra", [(40 * GIB, 11 * GIB + 300 * MIB), (40 * MIB, 8 * MIB)],
                         ids=["GiB", "MiB"])
def test_single_timeline_axis(tmp_path, base, extra):
    a = load_gpumem(_write(tmp_path / "s.pickle", base, extra)).analysis()
    assert a.peak.peak == base + extra
    _check(timeline_figure(a), base + extra)


@pytest.mark.parametrize("scale", [GIB, MIB], ids=["GiB", "MiB"])
def test_diff_axis(tmp_path, scale):
    a = load_gpumem(_write(tmp_path / "a.pickle", 20 * scale, 2 * scale))
    b = load_gpumem(_write(tmp_path / "b.pickle", 20 * scale, 4 * scale))
    d = a.diff(b)
    figs: list = []
    render_diff.report_parts(d.profile, d.diff, figs)
    _check(figs[0], 24 * scale)


def test_diff_legend_tells_a_from_b(tmp_path):
    """The walk's legend: "A: gpumem capture (CPU allocator events), taken 19:2…" twice."""
    a = load_gpumem(_write(tmp_path / "a.pickle", 20 * MIB, 2 * MIB))
    b = load_gpumem(_write(tmp_path / "b.pickle", 20 * MIB, 4 * MIB))
    d = a.diff(b)
    same = "gpumem capture (CPU allocator events), taken 19:21:07 on a long long day"
    d.profile.payload.a, d.profile.payload.b = same + " (A)", same + " (B)"
    figs: list = []
    render_diff.report_parts(d.profile, d.diff, figs)
    labels = [item.label.value for item in figs[0].legend[0].items]
    assert labels == ["A", "A's peak", "B", "B's peak"]
    # the full names stand in the text right above the chart
    page = report_html(d.profile, d.analysis())
    timelines = page[page.index(">Timelines<"):]
    timelines = timelines[:timelines.index("</section>")] if "</section>" in timelines \
        else timelines
    for key, name, peak in (("A", d.profile.payload.a, "22.0 MiB"),
                            ("B", d.profile.payload.b, "24.0 MiB")):
        assert f"{key}: {name} (peak {peak})" in timelines


def _ranks(folder: Path, sizes: dict[int, tuple[int, int]]):
    folder.mkdir()
    for rank, (base, extra) in sizes.items():
        (folder / f"rank{rank}.pickle").write_bytes(_snapshot(base, extra))
    return torchlens.load(folder)


@pytest.mark.parametrize("scale", [GIB, MIB], ids=["GiB", "MiB"])
def test_ranks_axis(tmp_path, scale):
    r = _ranks(tmp_path / "snaps", {0: (18 * scale, 2 * scale), 1: (18 * scale, 4 * scale),
                                    2: (18 * scale, 2 * scale)})
    _check(render_ranks.timelines_figure(r.figures), 22 * scale)
