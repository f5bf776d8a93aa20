"""``torchlens.watch`` shows the final status once (the tutorial's
watch of an ended run showed the block twice: the copy a saved notebook keeps,
then the widget's own).

The kernel boundary is faked: ``load_bokehjs`` gives a display handle that
records what the cell output was replaced with; the feed is a source that gives
one ended frame.
"""

from __future__ import annotations

from typing import Any

import pytest

from torchlens.capture.ranks.feed import LiveFrame
from torchlens.frontends.ranks import watch as watch_module

STATUS = {"verdict": "rank 1 is the slow rank: its data loading took 30.5 ms per step",
          "world_size": 2, "attached": 2,
          "ranks": [{"rank": 0, "state": "finished"}, {"rank": 1, "state": "finished"}]}


class _Handle:
    def __init__(self) -> None:
        self.shown: list[str] = []

    def update(self, obj: Any, raw: bool = False) -> None:
        self.shown.append(str(getattr(obj, "data", obj)))


class _EndedRun:
    """A feed whose one frame says the run ended."""

    def __init__(self) -> None:
        self.frames = [LiveFrame(seq=1, world_size=2, status=STATUS, ended=True, t=1.0)]

    def read(self) -> list[LiveFrame]:
        out, self.frames = self.frames, []
        return out

    def finished(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def in_a_kernel(monkeypatch: pytest.MonkeyPatch) -> _Handle:
    from torchlens.frontends.shared import bokeh_page, cells

    handle = _Handle()
    monkeypatch.setattr(cells, "in_kernel", lambda: True)
    monkeypatch.setattr(bokeh_page, "load_bokehjs", lambda objs: bokeh_page.LoadedBokehJS(handle))
    return handle


def _shown(w: watch_module.Watch, handle: _Handle) -> list[str]:
    """Every place the verdict is shown: the cell output above and the widget's block."""
    return [text for text in [*handle.shown, w.widget.children[0].value] if STATUS["verdict"] in text]


def test_a_watch_displayed_after_the_run_ended_shows_its_status_once(in_a_kernel: _Handle) -> None:
    w = watch_module.Watch(_EndedRun(), "runs/hf", timeout=5)
    w.start()
    assert w.wait(timeout=10)  # the tutorial: wait, then display the watch
    shown = _shown(w, in_a_kernel)
    assert len(shown) == 1, shown
    assert "final status is above" in w.widget.children[0].value


def test_a_watch_displayed_before_the_run_ended_shows_its_status_once(in_a_kernel: _Handle) -> None:
    source = _EndedRun()
    frames, source.frames = source.frames, []
    w = watch_module.Watch(source, "runs/hf", timeout=5)
    w.start()
    header = w.widget.children[0]  # displayed at once, while waiting
    assert "waiting" in header.value
    source.frames = frames
    assert w.wait(timeout=10)
    assert len(_shown(w, in_a_kernel)) == 1


def test_an_ended_watch_has_no_stop_button(in_a_kernel: _Handle) -> None:
    import ipywidgets

    source = _EndedRun()
    frames, source.frames = source.frames, []
    w = watch_module.Watch(source, "runs/hf", timeout=5)
    w.start()
    buttons = [c for c in w.widget.children if isinstance(c, ipywidgets.Button)]
    assert [b.description for b in buttons] == ["Stop"]  # while it runs
    source.frames = frames
    assert w.wait(timeout=10)
    assert not [c for c in w.widget.children if isinstance(c, ipywidgets.Button)]
    later = watch_module.Watch(_EndedRun(), "runs/hf", timeout=5)  # drawn after its end
    later.start()
    assert later.wait(timeout=10)
    assert not [c for c in later.widget.children if isinstance(c, ipywidgets.Button)]
