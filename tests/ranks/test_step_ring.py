"""A rank never writes its step records over a value the collector has not
read: a collector that falls behind by more than a ring (a starved machine,
1,024 ranks) costs latency, not records. Real collector and store; the test
plays the rank's sender (``attach.StepRing``) and its heartbeat."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import torch.distributed as dist

from torchlens.analysis.ranks.collector_notes import sampling_words
from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey
from torchlens.capture.ranks.attach import StepRing
from torchlens.capture.ranks.collector import Collector

from .test_collector_store import _attach


@pytest.fixture
def collector(tmp_path):
    c = Collector(RunKey.new(), spool=str(tmp_path / "spool"))
    try:
        store = dist.TCPStore("127.0.0.1", c.port, is_master=False,
                              timeout=timedelta(seconds=5))
        yield c, c.key, store
    finally:
        c.close()


def _beat(store, key: RunKey, slot: int, beat: int, ring: StepRing) -> None:
    name = protocol.slot_key(key.run_id, slot, "hb")
    body = {"t": 1.0, "beat": beat, "sent": [ring.sent, 0], "held": len(ring.held),
            "shed": ring.shed}
    store.set(name, key.seal(name, json.dumps(body).encode()))


def _record(step: int) -> dict:
    return {"step": step, "t0": float(step), "t1": step + 0.5, "phases": {}}


def _spooled_steps(c: Collector, slot: int) -> list[int]:
    return [r["step"] for line in c.spool_lines(slot, 0) for r in json.loads(line)]


def test_a_collector_three_rings_behind_loses_no_step_record(collector) -> None:
    c, key, store = collector
    slot = _attach(store, key, 0)
    c.poll()
    ring = StepRing(protocol.Channel(store, key), key.run_id, slot)
    size = protocol.RING["steps"]
    steps = 3 * size + 10
    for i in range(steps):  # one record a flush, the collector polling every 40 flushes
        ring.put([_record(i)])
        ring.send()
        _beat(store, key, slot, i + 2, ring)
        if i % 40 == 39:
            c.poll()
    # the ring filled before the first poll: the rank held what did not fit
    assert ring.sent < steps
    for beat in range(steps + 2, steps + 10):  # the collector catches up
        c.poll()
        ring.send()
        _beat(store, key, slot, beat, ring)
    c.poll()
    assert not ring.held and ring.shed == 0
    assert _spooled_steps(c, slot) == list(range(steps))
    tally = c.tally()
    assert tally.step_records_kept == steps and tally.step_batches_overwritten == 0, tally
    assert sampling_words(tally) == ""


def test_a_rank_whose_collector_never_reads_holds_a_bounded_number_and_says_so(
        collector) -> None:
    c, key, store = collector
    slot = _attach(store, key, 0)
    c.poll()
    ring = StepRing(protocol.Channel(store, key), key.run_id, slot, hold=50)
    size = protocol.RING["steps"]
    for i in range(size + 80):  # nobody reads: the ring fills, then the hold
        ring.put([_record(i)])
        ring.send()
    assert ring.sent == size and len(ring.held) == 50 and ring.shed == 30
    # a read count sealed by someone without the run's secret makes no room
    name = protocol.read_key(key.run_id, slot)
    store.set(name, RunKey(key.run_id, b"x" * 32).seal(name, b'{"steps": 1000}'))
    ring.send()
    assert ring.sent == size and len(ring.held) == 50
    _beat(store, key, slot, 2, ring)
    c.poll()
    tally = c.tally()
    assert tally.step_records_shed == 30, tally
    assert "30 step records shed by ranks" in sampling_words(tally)


def test_what_a_rank_holds_at_exit_is_read_after_its_goodbye(collector) -> None:
    # the collector never polls while the rank runs: at exit the rank leaves what
    # its ring had no room for in its last keys, without waiting
    c, key, store = collector
    slot = _attach(store, key, 0)
    c.poll()
    ring = StepRing(protocol.Channel(store, key), key.run_id, slot)
    steps = protocol.RING["steps"] + 70
    for i in range(steps):
        ring.put([_record(i)])
        ring.send()
    assert ring.held
    last = ring.send_last()
    assert last == 1 and not ring.held
    name = protocol.slot_key(key.run_id, slot, "hb")
    body = {"t": 1.0, "beat": 2, "sent": [ring.sent, 0], "last": last,
            "bye": {"t": 2.0, "reason": "exit", "steps": steps}}
    store.set(name, key.seal(name, json.dumps(body).encode()))
    c.poll()
    assert _spooled_steps(c, slot) == list(range(steps))
    assert c.tally().step_records_kept == steps


def test_a_summary_made_while_its_ring_is_unread_is_not_sent_and_is_counted(
        collector) -> None:
    c, key, store = collector
    slot = _attach(store, key, 0)
    c.poll()
    ring = StepRing(protocol.Channel(store, key), key.run_id, slot)
    size = protocol.RING["prof"]
    sent = 0
    for _ in range(size + 3):  # nobody reads: the first ring-full go, the rest are skipped
        if ring.summary_room(sent):
            sent += 1
    assert sent == size and ring.skipped == 3
    # the collector reads them and says so: the next one goes
    name = protocol.slot_key(key.run_id, slot, "hb")
    for j in range(size):
        ring_name = protocol.ring_key(key.run_id, slot, "prof", j)
        store.set(ring_name, key.seal(ring_name, protocol.pack_summary(
            j, {"rank": 0, "step": j, "step_ms": 1.0})))
    store.set(name, key.seal(name, json.dumps(
        {"t": 1.0, "beat": 2, "sent": [0, sent], "skipped": ring.skipped}).encode()))
    c.poll()
    assert ring.summary_room(sent) and ring.skipped == 3
    tally = c.tally()
    assert tally.summaries_kept == size and tally.summaries_skipped == 3, tally
    assert tally.summaries_overwritten == 0
    assert "3 not sent by ranks whose ring of 4 summaries was full" in sampling_words(tally)
