"""``torchlens.watch`` draws from its reader thread while the kernel's own thread
serializes its widgets and takes the browser's messages (Bokeh reports each
plot's size and ranges back; ipywidgets sync their state): the two share the
view's Bokeh document and the widgets' state. A watch once stopped with
"RuntimeError: Set changed size during iteration". Here both run at once, on a
folder whose live feed grows, for a few seconds: the watch must end with the
run, not with an error, and draw every step.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from torchlens.capture.ranks.feed import FRAME_FORMAT, VERSION, FrameBeat, LiveFrame
from torchlens.frontends.ranks import watch as watch_module
from torchlens.model.records import StepRecord

WORLD = 2
FRAMES = 60


def _frame(seq: int, ended: bool) -> bytes:
    t = 1000.0 + seq
    status = {"world_size": WORLD, "attached": WORLD, "verdict": f"frame {seq}",
              "ranks": [{"rank": r, "state": "finished" if ended else "running",
                         "steps": seq + 1} for r in range(WORLD)]}
    frame = LiveFrame(
        format=FRAME_FORMAT, version=VERSION, seq=seq, t=t, t0=1000.0, run_id="r",
        world_size=WORLD, ended=ended, status=status,
        steps={str(r): [StepRecord(step=seq, t0=t, t1=t + 0.5 + 0.1 * r,
                                   phases={"data": 0.01, "compute": 0.4})]
               for r in range(WORLD)},
        heartbeats={str(r): FrameBeat(t=t + 0.5, rss=(100 + seq) << 20, steps_done=seq + 1)
                    for r in range(WORLD)},
        ended_ranks={str(r): ("finished", t + 1) for r in range(WORLD)} if ended else {})
    return msgspec.json.encode(frame) + b"\n"


def _grow(folder: Path, stop: threading.Event) -> None:
    """The collector: a frame every few ms, the last one saying the run ended."""
    with open(folder / "live.jsonl", "ab", buffering=0) as fh:
        for seq in range(FRAMES):
            if stop.is_set():
                return
            fh.write(_frame(seq, seq == FRAMES - 1))
            time.sleep(0.05)


def _browser(w: watch_module.Watch, stop: threading.Event, errors: list[str]) -> None:
    """The kernel's thread: shows the watch again and again and answers as the
    browser does: a range the user panned, reported back to Python."""
    n = 0
    while not stop.is_set():
        n += 1
        try:
            w._repr_mimebundle_()
            repr(w)
            view = w.view
            if view is not None:
                bokeh = view.widget
                for model in list(view.layout.document.models):
                    if not type(model).__name__.endswith("Range1d"):
                        continue
                    bokeh._handle_msg({"content": {"data": {"method": "custom", "content": {
                        "event": "jsevent", "kind": "ModelChanged",
                        "model": {"id": model.id}, "attr": "start", "new": float(n % 7)}}},
                        "buffers": []})
            header = w.widget.children[0]
            header._handle_msg({"content": {"data": {"method": "update", "state": {
                "description": f"d{n}"}}}, "buffers": []})
        except Exception as exc:  # noqa: BLE001 - what the kernel's thread met
            errors.append(f"{type(exc).__name__}: {exc}")
            return


@pytest.mark.timeout(120)
def test_the_reader_and_the_kernel_share_the_view_without_error(tmp_path: Path) -> None:
    import sys

    # the threads switch often (every microsecond, not every 5 ms): a race shows
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _share(tmp_path)
    finally:
        sys.setswitchinterval(before)


def _share(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".spool").mkdir()  # a run starting: its feed is due
    w = watch_module.watch(str(folder), timeout=30)
    stop, errors = threading.Event(), []
    writer = threading.Thread(target=_grow, args=(folder, stop), daemon=True)
    browser = threading.Thread(target=_browser, args=(w, stop, errors), daemon=True)
    writer.start()
    browser.start()
    try:
        ended = w.wait(timeout=60)
    finally:
        stop.set()
        writer.join(5)
        browser.join(5)
        w.stop()
    assert not errors, errors
    assert ended and w.state == "ended", (w.state, w.message)
    assert "failed" not in w.message, w.message
    shown = [[rec.step for rec in recs] for recs in w.view.profile.records]
    assert shown == [list(range(FRAMES))] * WORLD, shown


def test_the_browsers_messages_are_taken_while_the_watch_does_not_draw(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each message the browser sends to the watch's widgets (the box, its
    header, the Bokeh view) is handled holding the lock the reader draws under:
    the reader never changes them meanwhile."""
    import ipywidgets

    held: list[tuple[str, bool]] = []
    handle = ipywidgets.Widget._handle_msg

    def spy(self: Any, msg: Any) -> Any:
        held.append((type(self).__name__, w._lock._is_owned()))
        return handle(self, msg)

    monkeypatch.setattr(ipywidgets.Widget, "_handle_msg", spy)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "live.jsonl").write_bytes(b"".join(_frame(s, s == 4) for s in range(5)))
    w = watch_module.watch(str(folder), timeout=30)
    assert w.wait(timeout=30)
    box = w.widget
    widgets = [box, *box.children]
    assert w.view.widget in widgets
    for widget in widgets:
        widget._handle_msg({"content": {"data": {"method": "request_state"}}, "buffers": []})
    assert len(held) == len(widgets) and all(ok for _, ok in held), held


@pytest.mark.parametrize("grown", [False, True], ids=["shorter", "longer"])
def test_a_watch_of_a_folder_deleted_and_made_again_stops_and_says_why(
        tmp_path: Path, grown: bool) -> None:
    """An earlier watch still running when its folder is deleted and a new run
    writes there: it stops with why, keeping what it drew of its own run,
    rather than draw the new run's frames read from an old offset."""
    import shutil

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".spool").mkdir()
    (folder / "live.jsonl").write_bytes(b"".join(_frame(s, False) for s in range(5)))
    w = watch_module.watch(str(folder), timeout=30)
    deadline = time.monotonic() + 30
    while w.seq != 4:
        assert time.monotonic() < deadline, (w.state, w.message)
        time.sleep(0.05)
    shutil.rmtree(folder)
    folder.mkdir()
    other = [_frame(s, s == 19).replace(b'"run_id":"r"', b'"run_id":"other"')
             for s in range(20 if grown else 2)]
    (folder / "live.jsonl").write_bytes(b"".join(other))
    assert not w.wait(timeout=30)
    assert w.state == "stopped", (w.state, w.message)
    assert "the run folder was deleted and made again" in w.message, w.message
    assert "torchlens.watch(RUN_DIR) again watches the new one" in w.message
    assert [[rec.step for rec in recs] for recs in w.view.profile.records] == \
        [list(range(5))] * WORLD
