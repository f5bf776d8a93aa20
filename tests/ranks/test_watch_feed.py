"""The live feed of ``torchlens run`` and ``torchlens.watch`` on it, in one process.

A real collector (its store, its run key); the test plays the ranks by
writing sealed values to the store as ``capture.ranks.attach`` does, and plays
the attacker by writing what anyone who can reach the port could.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

import torchlens
from torchlens.analysis.ranks.verdict import live_status, run_view
from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey
from torchlens.capture.ranks.collector import Collector
from torchlens.capture.ranks.feed import (
    KEEP_FRAMES,
    FeedPublisher,
    LiveFrame,
    StoreFeed,
)
from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    VERSION,
    Manifest,
    ProfileEntry,
    read_manifest,
)
from torchlens.formats.run_folder.records import read_steps
from torchlens.frontends.ranks.command import write_folder
from torchlens.model import InputError

T = time.time()


def _say(store: dist.TCPStore, key: RunKey, name: str, body: object) -> None:
    store.set(name, key.seal(name, json.dumps(body).encode()))


def _record(step: int, slow: bool) -> dict:
    """As in DDP: the others wait for the slow rank inside backward (its all_reduce)."""
    data, backward = (0.04, 0.016) if slow else (0.001, 0.055)
    t0 = T + step * 0.1
    return {"step": step, "t0": t0, "t1": t0 + 0.075,
            "phases": {"data": data, "forward": 0.01, "backward": backward,
                       "optimizer": 0.002, "collective": None},
            "profiled": False, "window": False, "mem": {"rss": 100_000_000 + step,
                                                        "source": "rss"}}


class Ranks:
    """Two ranks attached to ``c`` (rank 1 slow in data loading), sending as
    ``capture.ranks.attach`` does (ring keys, counted in the sealed heartbeat)."""

    def __init__(self, c: Collector) -> None:
        self.c, self.key = c, c.key
        self.store = dist.TCPStore("127.0.0.1", c.port, is_master=False,
                                   timeout=timedelta(seconds=5))
        self.prefix, self.slots, self.sent, self.step = [], [], [0, 0], 0
        for r in range(2):
            slot = self.store.add(protocol.slots_key(self.key.run_id), 1) - 1
            name = protocol.slot_key(self.key.run_id, slot, "")
            self.prefix.append(name)
            self.slots.append(slot)
            self.beat(name, r)
            _say(self.store, self.key, name + "hello", {
                "rank": r, "world_size": 2, "node": 0, "host": "gpu7", "pid": 1, "restart": 0,
                "t": T, "shared_run_dir": True})
            protocol.enroll(protocol.Channel(self.store, self.key), self.key.run_id, r, slot)
        c.poll()

    def beat(self, name: str, r: int, bye: dict | None = None) -> None:
        hb = {"t": time.time(), "beat": time.monotonic(), "rss": 100_000_000,
              "steps_done": self.step, "sent": [self.sent[r], 0]}
        _say(self.store, self.key, name + "hb", {**hb, **({"bye": bye} if bye else {})})

    def steps(self, n: int) -> None:
        """``n`` steps on both ranks, one batch each, then a poll of the collector."""
        self.send([[_record(self.step + i, r == 1) for i in range(n)] for r in range(2)])
        self.step += n

    def send(self, batches: list[list[dict]], poll: bool = True) -> None:
        """One batch of records for each rank (in rank order), then a poll."""
        for r, slot in enumerate(self.slots):
            key = protocol.ring_key(self.key.run_id, slot, "steps", self.sent[r])
            body = protocol.pack(self.sent[r], json.dumps(batches[r]).encode())
            self.store.set(key, self.key.seal(key, body))
            self.sent[r] += 1
        for r, name in enumerate(self.prefix):
            self.beat(name, r)
        if poll:
            self.c.poll()

    def bye(self) -> None:
        for r, name in enumerate(self.prefix):
            self.beat(name, r, bye={"t": time.time(), "reason": "exit", "error": None})
        self.c.poll()


@pytest.fixture
def run(tmp_path: Path):
    c = Collector(RunKey.new(), spool=str(tmp_path / ".spool"))
    feed = FeedPublisher(c, str(tmp_path))
    ranks = Ranks(c)
    try:
        yield c, feed, ranks, tmp_path
    finally:
        feed.close()
        c.close()


def _publish(c: Collector, feed: FeedPublisher, ended: bool = False) -> LiveFrame:
    return feed.publish(live_status(run_view(c.snapshot(), ended=ended)).to_json(), ended=ended)


def _steps_shown(w) -> list[list[int]]:
    return [list(src.data["step"]) for src in w.view.profile.panels.steps]


def test_frames_carry_what_is_new_and_both_files_are_written(run) -> None:
    c, feed, ranks, out = run
    ranks.steps(25)
    first = _publish(c, feed)
    assert {r: [s.step for s in v] for r, v in first.steps.items()} == {
        "0": list(range(25)), "1": list(range(25))}
    assert set(first.heartbeats) == {"0", "1"}
    assert "rank 1 is the slow rank" in first.status["verdict"]
    quiet = _publish(c, feed)  # nothing new: no records, no heartbeats
    assert quiet.steps == {} and quiet.heartbeats == {} and quiet.seq == 1
    ranks.steps(5)
    third = _publish(c, feed)
    assert [s.step for s in third.steps["1"]] == list(range(25, 30))
    # the file transport: every frame a line; the status alone in live.json
    lines = (out / "live.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [0, 1, 2]
    status = json.loads((out / "live.json").read_text())
    assert {"format", "version", "run_id", "t", "world_size", "verdict", "ended", "ranks",
            "restarts", "dropped"} <= set(status)
    assert status["format"] == "torchlens-live" and status["version"] == 1
    assert status["run_id"] == c.key.run_id and status["ended"] is False
    assert [(r["rank"], r["state"], r["steps"], r["slow"]) for r in status["ranks"]] == [
        (0, "running", 30, False), (1, "running", 30, True)]
    assert status["ranks"][1]["data_ms"] == pytest.approx(40.0)
    # the end: both ranks' goodbyes reach the frame once
    ranks.bye()
    last = _publish(c, feed, ended=True)
    assert last.ended and {r: e[0] for r, e in last.ended_ranks.items()} == {
        "0": "finished", "1": "finished"}
    assert _publish(c, feed, ended=True).ended_ranks == {}


def test_a_long_feed_file_is_read_in_chunks(run, monkeypatch) -> None:
    from torchlens.capture.ranks import feed as feed_module

    c, feed, ranks, out = run
    for n in (30, 1, 1, 30):
        ranks.steps(n)
        _publish(c, feed)
    monkeypatch.setattr(feed_module, "READ_CHUNK", 4000)  # smaller than the big frames
    reader = feed_module.FileFeed(str(out))
    reads = []
    while got := reader.read():
        reads.append([f.seq for f in got])
    assert sum(reads, []) == [0, 1, 2, 3] and len(reads) > 1 and reader.bad == 0


def test_the_store_keeps_the_newest_frames_only(run) -> None:
    c, feed, ranks, _ = run
    for _ in range(KEEP_FRAMES + 15):
        ranks.steps(1)
        _publish(c, feed)
    newest = feed.seq
    kept = [i for i in range(newest + 1)
            if c.store.check([protocol.live_key(c.key.run_id, i)])]
    assert kept == list(range(newest + 1 - KEEP_FRAMES, newest + 1))
    # a watcher joining late gets the last minute, not the whole run
    late = StoreFeed.connect("127.0.0.1", c.port, c.key.secret)
    frames = late.read()
    assert [f.seq for f in frames] == list(range(newest + 2 - KEEP_FRAMES, newest + 1))
    assert late.read() == []
    ranks.steps(1)
    _publish(c, feed)
    assert [f.seq for f in late.read()] == [newest + 1]
    late.close()


def test_a_frame_too_big_for_the_store_is_thinned_and_the_budget_holds(run, monkeypatch) -> None:
    """TCPStore's server drops a client that sends more than 8 MiB (the collector's
    own connection with it): big frames go to the store thinned, the file in full."""
    from torchlens.capture.ranks import feed as feed_module

    c, feed, ranks, out = run
    monkeypatch.setattr(feed_module, "STORE_FRAME_MAX", 6000)
    monkeypatch.setattr(feed_module, "STORE_BUDGET", 30_000)
    ranks.steps(40)  # ~25 KB of step records
    frame = _publish(c, feed)
    assert len(frame.steps["0"]) == 40 and feed.thinned == 1 and not feed.errors
    stored = StoreFeed.connect("127.0.0.1", c.port, c.key.secret).read()[-1]
    assert stored.thinned and 0 < len(stored.steps["0"]) < 40
    assert json.loads((out / "live.jsonl").read_text().splitlines()[-1])["steps"]["0"] == \
        [r.to_dict() for r in frame.steps["0"]]
    for _ in range(12):  # ~5 KB frames: the byte budget keeps about six
        ranks.steps(8)
        _publish(c, feed)
    held = [i for i in range(feed.seq + 1)
            if c.store.check([protocol.live_key(c.key.run_id, i)])]
    assert held[-1] == feed.seq and 1 < len(held) < 10
    c.poll()  # the collector's own connection is fine


def test_a_forged_frame_is_dropped_and_counted(run) -> None:
    c, feed, ranks, _ = run
    ranks.steps(10)
    for _ in range(3):
        _publish(c, feed)
    attacker = dist.TCPStore("127.0.0.1", c.port, is_master=False, timeout=timedelta(seconds=5))
    name = protocol.live_key(c.key.run_id, 1)
    forger = RunKey(c.key.run_id, b"x" * 32)
    fake = {"format": "torchlens-live-frame", "seq": 1, "world_size": 2,
            "status": {"verdict": "rank 0 is the slow rank"}, "steps": {"0": [_record(99, True)]}}
    attacker.set(name, forger.seal(name, json.dumps(fake).encode()))
    w = torchlens.watch(f"127.0.0.1:{c.port}", secret_file=_secret(c, run[3]), timeout=30)
    try:
        deadline = time.monotonic() + 20
        while w.frames < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert w.frames == 2 and w.dropped == 1  # frames 0 and 2; the forged 1 never decoded
        assert 99 not in _steps_shown(w)[0]
        assert "1 forged frame(s) dropped" in str(w._html())
        # a forged pointer to the newest frame is dropped too (and read no further)
        count = protocol.live_count_key(c.key.run_id)
        attacker.set(count, forger.seal(count, b"1000"))
        deadline = time.monotonic() + 20
        while w.dropped < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert w.dropped == 2 and w.frames == 2
    finally:
        w.stop()


def _secret(c: Collector, folder: Path) -> str:
    path = folder / "run.secret"
    if not path.exists():
        c.key.write_secret(str(path))
    return str(path)


def test_watchers_on_the_folder_and_the_address_draw_the_steps(run) -> None:
    c, feed, ranks, out = run
    ranks.steps(20)
    _publish(c, feed)
    on_dir = torchlens.watch(str(out), timeout=30)
    on_port = torchlens.watch(f"127.0.0.1:{c.port}", secret_file=_secret(c, out), timeout=30)
    try:
        for more in (5, 5):
            ranks.steps(more)
            _publish(c, feed)
        ranks.bye()
        _publish(c, feed, ended=True)
        assert feed.linger(timeout=20) == 0  # the store watcher read the last frame
        for w in (on_dir, on_port):
            assert w.wait(20), w
            assert w.state == "ended"
            assert _steps_shown(w) == [list(range(30)), list(range(30))]
            assert w.view.beats.mem[0].data["t"], "heartbeats reach the memory panel"
            # what the feed cannot fill is not drawn: no ops, no collective counts
            assert not w.view.profile.panels.tl_fig.visible
            assert not w.view.beats.layout.children[1].visible
            assert "rank 1 is the slow rank" in w.status.verdict
            # said once: in the status block, not again above the step chart
            assert not w.view.profile.panels.verdict.visible
            table = str(w._html())
            assert table.count("<tr") == 3 and "finished" in table  # header + two ranks
            assert "rank 1 is the slow rank" in w.status.verdict
            # ranks that finished get no red x: it marks a rank that stopped early
            assert w.view.profile.panels.ended.data["text"] == []
    finally:
        on_dir.stop()
        on_port.stop()


def test_a_finished_folder_shows_its_final_state(run) -> None:
    c, feed, ranks, out = run
    ranks.steps(12)
    ranks.bye()
    view = run_view(c.snapshot(), ended=True)
    write_folder(str(out), c, view, ["torchrun", "train.py"], 0, False)
    # replayed from its feed ...
    _publish(c, feed, ended=True)
    w = torchlens.watch(str(out), timeout=10)
    assert w.wait(10) and "this run has ended" in repr(w)
    assert _steps_shown(w) == [list(range(12)), list(range(12))]
    # ... or, without one, from its files
    os.remove(out / "live.jsonl")
    w = torchlens.watch(out, timeout=10)
    assert w.wait(10) and w.state == "ended"
    assert "no live feed" in repr(w) and "torchlens.load" in repr(w)
    assert _steps_shown(w) == [list(range(12)), list(range(12))]
    assert len(w.view.beats.mem[1].data["t"]) == 12  # RSS from the step records
    assert w.view.profile.panels.tl_fig.visible  # full summaries: the timeline stays
    assert "rank 1 is the slow rank" in w.status.verdict


def test_torchlens_run_writes_the_typed_manifest(run) -> None:
    """torchlens run's folder carries the one Manifest type (as %ddp_check --profile's
    does, tests/formats/test_run_folder.py), version 2, with its source."""
    c, feed, ranks, out = run
    ranks.steps(3)
    ranks.bye()
    _publish(c, feed, ended=True)
    view = run_view(c.snapshot(), ended=True)
    written = write_folder(str(out), c, view, ["torchrun", "train.py"], 0, False,
                           live=feed.manifest_entry())
    manifest = read_manifest(str(out))
    assert isinstance(manifest, Manifest) and manifest == written
    assert (manifest.version, manifest.source, manifest.run_id) == (
        VERSION, SOURCE_RUN, c.key.run_id)
    assert [(e.rank, e.state, e.steps, e.host) for e in manifest.ranks] == [
        (0, "finished", 3, "gpu7"), (1, "finished", 3, "gpu7")]
    assert manifest.nodes[0].ranks == [0, 1] and manifest.live.frames == 1
    assert [r.step for r in read_steps(str(out), 1)] == [0, 1, 2]
    assert manifest.backend is None and manifest.profile == ProfileEntry()  # %ddp_check's fields


def test_bad_targets_say_what_to_do(run, tmp_path: Path, monkeypatch) -> None:
    c, _, _, out = run
    for name in ("TORCHLENS_RUN_SECRET", "TORCHLENS_RUN_SECRET_FILE", "TORCHLENS_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InputError, match="no such folder, and not host:port"):
        torchlens.watch(str(tmp_path / "nope"))
    with pytest.raises(InputError, match="is a file"):
        torchlens.watch(str(out / "live.jsonl"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="not a `torchlens run` folder"):
        torchlens.watch(empty)
    with pytest.raises(InputError, match="timeout"):
        torchlens.watch(str(out), timeout=0)
    address = f"127.0.0.1:{c.port}"
    with pytest.raises(InputError, match="needs the run's secret"):
        torchlens.watch(address)
    with pytest.raises(InputError, match="does not exist"):
        torchlens.watch(address, secret_file=str(tmp_path / "missing.secret"))
    loose = tmp_path / "loose.secret"
    loose.write_text(c.key.secret.hex())
    loose.chmod(0o644)
    with pytest.raises(InputError, match="chmod 600"):
        torchlens.watch(address, secret_file=str(loose))
    wrong = tmp_path / "wrong.secret"
    RunKey.new().write_secret(str(wrong))
    with pytest.raises(InputError, match="secret does not open"):
        torchlens.watch(address, secret_file=str(wrong))
    with pytest.raises(InputError, match=f"hosts run {c.key.run_id}, not run 0123"):
        torchlens.watch(address, secret_file=_secret(c, out), run_id="0123456789abcdef")
    with pytest.raises(InputError, match="nothing listening at 127.0.0.1:1 .*still running"):
        torchlens.watch("127.0.0.1:1", secret_file=_secret(c, out))
    # the secret from the environment, as on another node
    monkeypatch.setenv("TORCHLENS_RUN_SECRET", c.key.secret.hex())
    w = torchlens.watch(address, timeout=5)
    w.stop()
    assert c.key.run_id in w.label


def test_the_live_section_gives_the_headers_verdict(run, monkeypatch) -> None:
    """A walk read 144.5x in the watch's header and 134.6x in the section
    under it: the header is the collector's verdict, the section judged the
    records the watch had received by then. One verdict: the collector's."""
    import html
    import re
    import sys

    c, feed, ranks, out = run
    ranks.steps(20)
    said = live_status(run_view(c.snapshot()))  # the collector judged 20 steps ...
    here = sys.modules[__name__]
    plain = here._record

    def slower(step: int, slow: bool) -> dict:
        rec = plain(step, slow)
        if slow:
            rec["phases"]["data"] *= 2
        return rec

    monkeypatch.setattr(here, "_record", slower)
    ranks.steps(10)  # ... and 10 more, with rank 1 slower, reach the feed with it
    feed.publish(said.to_json())
    w = torchlens.watch(str(out), timeout=10)
    try:
        deadline = time.time() + 10
        while time.time() < deadline and (w.view is None or len(_steps_shown(w)[1]) < 30):
            time.sleep(0.1)
        w.view.profile.flush(force=True)
        header = html.unescape(re.sub(r"<[^>]+>", "", str(w._html())))
        assert said.slow_finding.sentence in header
        # the section shows no verdict of its own, and draws the header's slow
        # rank's line bold (not one judged from the records it received)
        panels = w.view.profile.panels
        assert not panels.verdict.visible
        widths = {r: line.glyph.line_width for r, line in zip(panels.shown, panels.step_lines,
                                                              strict=True)}
        assert widths[said.slow_rank] == 3.0 and widths[1 - said.slow_rank] == 1.5, widths
    finally:
        w.stop()


# -- every record once, whatever falls at a frame's edge ---------------------------
def _span(step: int, label: str | None = None, window: bool = False) -> dict:
    """A step record of either rank; ``label``: an evaluation or checkpoint span."""
    rec = {**_record(step, False), "window": window}
    return {**rec, "label": label} if label else rec


def _carried(frames: list[LiveFrame]) -> dict[str, list[tuple]]:
    """Per rank, every record the frames carried, in order: (step, label, window)."""
    out: dict[str, list[tuple]] = {}
    for f in frames:
        for r, recs in f.steps.items():
            out.setdefault(r, []).extend(
                (x.step, x.label if x.labelled else None, x.window) for x in recs)
    return out


def _as_sent(batches: list[list[dict]]) -> list[tuple]:
    return [(x["step"], x.get("label"), x["window"]) for b in batches for x in b]


def _file_frames(out: Path) -> list[LiveFrame]:
    from torchlens.capture.ranks.feed import FileFeed

    return FileFeed(str(out)).read()


def test_labelled_spans_at_a_frame_edge_lose_no_step(run) -> None:
    """An evaluation and a checkpoint (labelled spans, not counted as training
    steps) arriving in a frame with training steps: the frame carries them all,
    and the training steps before them too."""
    c, feed, ranks, out = run
    sent = [[_span(i) for i in range(5)],
            [_span(5), _span(6), _span(7, "evaluation"), _span(8, "checkpoint")],
            [_span(9), _span(10)],
            [_span(11, "evaluation")],  # alone in its frame
            [_span(12, "checkpoint"), _span(13), _span(14)]]
    frames = []
    for i, batch in enumerate(sent):
        ranks.send([batch, batch])
        if i != 2:  # two batches in one frame too
            frames.append(_publish(c, feed))
    want = _as_sent(sent)
    assert _carried(frames) == {"0": want, "1": want}
    # the file carries the same, each record once, in order
    assert _carried(_file_frames(out)) == {"0": want, "1": want}


def test_set_up_windows_published_before_the_first_step_lose_no_step(run) -> None:
    """Windows a rank cut before its first ``torchlens.step()`` (its set-up) reach
    a frame; its first real steps, in the next frames, must too (the collector
    stops counting the windows as steps once a real step comes)."""
    c, feed, ranks, out = run
    sent = [[_span(i, window=True) for i in range(3)],
            [_span(i) for i in range(4)],
            [_span(i) for i in range(4, 7)]]
    frames = []
    for batch in sent:
        ranks.send([batch, batch])
        frames.append(_publish(c, feed))
    want = _as_sent(sent)
    assert _carried(frames) == {"0": want, "1": want}


def test_more_records_than_the_collector_keeps_between_two_frames(run) -> None:
    """A fast rank sends more step records in a second than the collector keeps
    in memory (``KEEP_STEPS``): the next frame carries every one of them."""
    from torchlens.capture.ranks.collector import KEEP_STEPS

    c, feed, ranks, out = run
    sent = [[_span(i + 40 * k) for i in range(40)] for k in range(4)]
    assert sum(map(len, sent)) > KEEP_STEPS
    for batch in sent:
        ranks.send([batch, batch])
    frame = _publish(c, feed)
    want = _as_sent(sent)
    assert _carried([frame]) == {"0": want, "1": want}
    assert not _publish(c, feed).steps  # and only once


def test_the_watch_draws_every_training_step_around_labelled_spans(run) -> None:
    """``torchlens.watch`` on the folder: every training step drawn once, in
    order; the evaluation and checkpoint spans as their markers."""
    c, feed, ranks, out = run
    sent = [[_span(i) for i in range(4)],
            [_span(4), _span(5), _span(6, "evaluation"), _span(7, "checkpoint")],
            [_span(8), _span(9)]]
    for batch in sent:
        ranks.send([batch, batch])
        _publish(c, feed)
    ranks.bye()
    _publish(c, feed, ended=True)
    w = torchlens.watch(str(out), timeout=10)
    try:
        assert w.wait(10) and w.state == "ended"
        training = [0, 1, 2, 3, 4, 5, 8, 9]
        assert _steps_shown(w) == [training, training]
        assert [[x.step for x in recs] for recs in w.view.profile.records] == [
            list(range(10)), list(range(10))]
    finally:
        w.stop()


def test_the_metrics_step_histogram_counts_every_training_step_once(run) -> None:
    """``/metrics``'s step-time histogram, ticked between the batches as the
    collector's loop does: every training step once, around set-up windows,
    labelled spans, and more records than the collector keeps between two ticks."""
    from torchlens.capture.ranks.collector import KEEP_STEPS
    from torchlens.frontends.ranks.metrics_endpoint import MetricsEndpoint

    c, feed, ranks, out = run
    endpoint = MetricsEndpoint("127.0.0.1", 0, str(out))
    try:
        sent = [[_span(i, window=True) for i in range(3)],
                [_span(0), _span(1), _span(2, "evaluation"), _span(3, "checkpoint")],
                [_span(4)],
                [_span(5 + i) for i in range(KEEP_STEPS + 10)]]
        endpoint.tick(c, None)
        for i, batch in enumerate(sent):
            ranks.send([batch, batch])
            if i != 1:  # two batches between two ticks too
                endpoint.tick(c, endpoint.view)
        training = [r for b in sent for r in b if not r["window"] and "label" not in r]
        for rank in (0, 1):
            h = endpoint.histograms.ranks[rank]
            assert h.count == len(training) == KEEP_STEPS + 13
            assert abs(h.total_s - sum(r["t1"] - r["t0"] for r in training)) < 1e-6
    finally:
        endpoint.close()
