"""What the gpumem report's figures show, read from the Bokeh objects themselves."""

from __future__ import annotations

import pickle

import pytest
from gpumem_fixtures import CLEAN

from torchlens.analysis.memory.allocator import CachingAllocator
from torchlens.frontends.memory.api import load_gpumem
from torchlens.render.memory.report import segment_map_figure


def _one_segment_snapshot(tmp_path):
    alloc = CachingAllocator()
    blocks = [alloc.malloc(4096) for _ in range(6)]
    alloc.free(blocks[2])
    path = tmp_path / "one.pickle"
    path.write_bytes(pickle.dumps(alloc.snapshot().to_torch()))
    return load_gpumem(str(path))


def _assert_rows_visible(fig, n_rows):
    """Every row has rectangles, lies inside the y range with its full height, and the
    figure is tall enough for its title and x axis plus a visible band per row."""
    (r,) = [r for r in fig.renderers if type(r.glyph).__name__ == "Rect"]
    data = r.data_source.data
    assert data["x"] and set(data["y"]) == set(range(n_rows))
    assert all(w > 0 for w in data["w"])
    lo, hi = sorted((fig.y_range.start, fig.y_range.end))
    h = r.glyph.height
    assert lo <= -h / 2 and hi >= n_rows - 1 + h / 2, (lo, hi, h)
    # about 80 px of title and axis, then at least 16 px per row
    assert fig.height - 80 >= 16 * n_rows, fig.height


def test_one_segment_snapshot_map_shows_its_row(tmp_path):
    """With one segment the block map's plot area was 0 px tall."""
    a = _one_segment_snapshot(tmp_path).analysis()
    assert len(a.segments) == 1
    _assert_rows_visible(segment_map_figure(a), 1)


def test_one_segment_cpu_capture_map_shows_its_row(shell):
    assert shell.run_cell(CLEAN.format(opts="")).success
    a = shell.user_ns["r"].analysis()
    assert len(a.segments) == 1
    _assert_rows_visible(segment_map_figure(a), 1)


@pytest.mark.parametrize("n", [2, 30])
def test_several_segments_each_get_a_row(tmp_path, n):
    alloc = CachingAllocator()
    for _ in range(n):
        alloc.malloc(3 * 2**20)  # one 20 MiB segment holds six; force a segment each
        alloc.malloc(18 * 2**20)
    path = tmp_path / "many.pickle"
    path.write_bytes(pickle.dumps(alloc.snapshot().to_torch()))
    a = load_gpumem(str(path)).analysis()
    rows = len(a.segments)
    assert rows >= n
    _assert_rows_visible(segment_map_figure(a), rows)
