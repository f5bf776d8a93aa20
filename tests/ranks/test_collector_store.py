"""The collector's store: forged or foreign messages are dropped and counted.

A test plays the rank (or the attacker) by writing to the collector's store
directly, as anyone who can reach its port could.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as dist

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey
from torchlens.capture.ranks.collector import Collector

from .helpers import REPO, env


def _client(c: Collector) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", c.port, is_master=False, timeout=timedelta(seconds=5))


def _say(store: dist.TCPStore, key: RunKey, name: str, body: object) -> None:
    store.set(name, key.seal(name, json.dumps(body).encode()))


def _attach(store: dist.TCPStore, key: RunKey, rank: int) -> int:
    """A rank takes a slot and says hello, as ``attach`` does; its slot."""
    slot = store.add(protocol.slots_key(key.run_id), 1) - 1
    _beat(store, key, slot, 1, [0, 0])
    _say(store, key, protocol.slot_key(key.run_id, slot, "hello"),
         {"rank": rank, "world_size": 2, "node": 0, "host": "h", "pid": 1, "restart": 0,
          "t": 1.0})
    protocol.enroll(protocol.Channel(store, key), key.run_id, rank, slot)
    return slot


@pytest.fixture
def collector():
    c = Collector(RunKey.new())
    try:
        yield c, c.key, _client(c)
    finally:
        c.close()


def _batch(store: dist.TCPStore, key: RunKey, slot: int, seq: int, t1: float) -> None:
    """Step batch number ``seq`` of ``slot``, as a rank sets it."""
    name = protocol.ring_key(key.run_id, slot, "steps", seq)
    body = protocol.pack(seq, protocol.encode([{"step": seq, "t0": 0.0, "t1": t1,
                                                "phases": {}}]))
    store.set(name, key.seal(name, body))


def _beat(store: dist.TCPStore, key: RunKey, slot: int, beat: int, sent: list[int]) -> None:
    _say(store, key, protocol.slot_key(key.run_id, slot, "hb"),
         {"t": 1.0, "beat": beat, "sent": sent})


def test_forged_and_foreign_messages_are_dropped_and_counted(collector) -> None:
    c, key, store = collector
    slot = _attach(store, key, 0)  # a genuine rank 0
    # a forged hello claiming rank 1 (signed with another secret, same run id)
    forger = RunKey(key.run_id, b"x" * 32)
    _attach(store, forger, 1)
    c.poll()
    assert [s.rank for s in c.all_slots()] == [0]
    assert c.dropped == 1
    # batch 0 forged, batch 1 genuine, batch 2 unsigned, batch 3 a genuine
    # value sealed for another key (batch 1's, copied: a replay)
    _batch(store, forger, slot, 0, 9.0)
    _batch(store, key, slot, 1, 0.1)
    ring = [protocol.ring_key(key.run_id, slot, "steps", j) for j in range(4)]
    store.set(ring[2], protocol.pack(2, b'[{"step": 2}]'))
    store.set(ring[3], store.get(ring[1]))
    _beat(store, key, slot, 2, [4, 0])
    c.poll()
    kept = c.all_slots()[0].steps
    assert [s.t1 for s in kept] == [0.1]
    assert c.dropped == 4
    assert c.snapshot().dropped == 4
    # a forged heartbeat claiming far more values is dropped, read nothing
    # and cost no wait (a counter, which cannot be sealed, could not say so)
    _beat(store, forger, slot, 3, [500, 500])
    c.poll()
    assert c.dropped == 5 and len(c.all_slots()[0].steps) == 1


def test_a_collector_behind_by_more_than_a_ring_counts_what_it_lost(collector) -> None:
    c, key, store = collector
    slot = _attach(store, key, 0)
    c.poll()
    ring = protocol.RING["steps"]
    # the rank sends ring + 5 batches between two polls: the first 5 are gone
    for seq in range(ring + 5):
        _batch(store, key, slot, seq, float(seq))
    _beat(store, key, slot, 2, [ring + 5, 0])
    c.poll()
    s = c.all_slots()[0]
    assert [r.step for r in s.steps] == list(range(5, ring + 5))
    assert c.snapshot().ranks[0].overwritten == [5, 0]
    assert c.dropped == 0


def _summary(store: dist.TCPStore, key: RunKey, slot: int, seq: int) -> None:
    """Profiled-step summary number ``seq`` of ``slot``, as a rank sets it."""
    name = protocol.ring_key(key.run_id, slot, "prof", seq)
    body = protocol.pack_summary(seq, {"rank": 0, "step": seq, "ops": [1, 2, 3]})
    store.set(name, key.seal(name, body))


def test_a_collector_behind_on_summaries_samples_them_by_a_stated_rule(
        collector, tmp_path, monkeypatch) -> None:
    from torchlens.analysis.ranks.collector_notes import collector_notes, sampling_words
    from torchlens.capture.ranks import collector as collector_module
    from torchlens.formats.run_folder.manifest import (
        SOURCE_RUN,
        Manifest,
        read_manifest,
    )
    from torchlens.formats.run_folder.write import write_run_folder

    c, key, store = collector
    slot = _attach(store, key, 0)
    c.poll()
    behind = collector_module.SUMMARIES_BEHIND
    # the rank sends SUMMARIES_BEHIND summaries between two polls: all read,
    # and from the next poll every 2nd summary of each rank
    for seq in range(behind):
        _summary(store, key, slot, seq)
    _beat(store, key, slot, 2, [0, behind])
    c.poll()
    assert c.stride == 2
    for seq in range(behind, behind + 4):
        _summary(store, key, slot, seq)
    _beat(store, key, slot, 3, [0, behind + 4])
    c.poll()
    s = c.all_slots()[0]
    kept = [x["step"] for x in s.summaries]
    assert kept == [0, 1, 2, 4, 6]  # the even-numbered ones of the 4 sent while behind
    assert s.sampled == 2 and s.overwritten == [0, 0]
    tally = c.tally()
    assert (tally.summaries_sent, tally.summaries_kept, tally.summaries_sampled,
            tally.summaries_overwritten, tally.stride_max) == (7, 5, 2, 0, 4)
    words = sampling_words(tally)
    assert words.startswith("summaries of 5 profiled steps kept of 7: 2 sampled out")
    assert "every k-th summary of each rank, k doubling up to 4" in words
    # the manifest keeps the counts and the sentence; the report says it
    tally.words = words
    write_run_folder(str(tmp_path), Manifest(source=SOURCE_RUN, world_size=1, collector=tally), [])
    again = read_manifest(str(tmp_path))
    assert again.collector is not None and again.collector.summaries_sampled == 2
    assert any(f.code == "collector_sampling" and words in f.sentence
               for f in collector_notes(again))
    # a collector that keeps up again reads every summary once more
    monkeypatch.setattr(collector_module, "STRIDE_RELAX_S", 0.0)
    _summary(store, key, slot, behind + 4)
    _beat(store, key, slot, 4, [0, behind + 5])
    c.poll()
    assert c.stride == 2
    assert sampling_words(collector_module.CollectorEntry()) == ""


def test_a_read_the_store_was_too_busy_to_answer_is_made_again(collector) -> None:
    c, key, store = collector
    slot = _attach(store, key, 0)
    c.poll()
    for seq in range(2):
        _batch(store, key, slot, seq, float(seq))
    _beat(store, key, slot, 2, [2, 0])
    real = c._get_there
    c._get_there = lambda names, chunk=64: (_ for _ in ()).throw(RuntimeError("timeout"))
    with pytest.raises(RuntimeError):
        c.poll()
    c._get_there = real
    _batch(store, key, slot, 2, 2.0)
    _beat(store, key, slot, 3, [3, 0])
    c.poll()
    s = c.all_slots()[0]
    assert [r.step for r in s.steps] == [0, 1, 2] and s.overwritten == [0, 0]


def test_another_runs_keys_are_not_read(collector) -> None:
    c, _, store = collector
    _attach(store, RunKey.new(), 0)
    c.poll()
    assert c.all_slots() == [] and c.dropped == 0


def test_collector_listens_on_loopback_only() -> None:
    c = Collector(RunKey.new())
    try:
        assert c.host == "127.0.0.1"
    finally:
        c.close()


def test_step_without_collector_starts_nothing() -> None:
    code = ("import threading, torchlens\n"
            "for _ in range(3): torchlens.step()\n"
            "print(sorted(t.name for t in threading.enumerate()))")
    e = env()
    e.pop("TORCHLENS_COLLECTOR", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['MainThread']"


def test_step_with_unreachable_collector_warns_and_trains_on() -> None:
    code = ("import torchlens\n"
            "for _ in range(3): torchlens.step()\n"
            "print('trained')")
    e = env(TORCHLENS_COLLECTOR="127.0.0.1:9", TORCHLENS_RUN_ID="abc")
    e.pop("TORCHLENS_RUN_SECRET", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "trained"
    assert "not reporting to the collector" in done.stderr


def test_cli_run_help_and_bad_command(tmp_path) -> None:
    helped = subprocess.run([sys.executable, "-m", "torchlens", "run", "--help"], cwd=REPO,
                            env=env(), capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "torchrun --nnodes" in helped.stdout
    assert "--host IFACE" in helped.stdout
    bad = subprocess.run([sys.executable, "-m", "torchlens", "run", "--out", str(tmp_path / "d"),
                          "--", "no-such-torchrun-here"], cwd=REPO, env=env(),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "torchlens: error: no-such-torchrun-here: command not found"


# -- what a local user without the secret can do to the store ------------------

def test_a_moved_slots_counter_changes_nothing_the_collector_does(collector) -> None:
    """The slots counter is unsigned: moving it on before the ranks attach (by
    300, then by 2*10^7) must neither hide the ranks nor grow the collector."""
    import tracemalloc

    c, key, store = collector
    store.add(protocol.slots_key(key.run_id), 300)
    slots = [_attach(store, key, r) for r in range(2)]
    assert slots == [300, 301]
    c.poll()
    assert [(s.rank, s.slot) for s in c.all_slots()] == [(0, 300), (1, 301)]
    tracemalloc.start()
    try:
        store.add(protocol.slots_key(key.run_id), 2 * 10**7)
        for _ in range(3):
            c.poll()
        grown = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert grown < 1 << 20, grown  # nothing per counted slot
    assert c.pending == [] and len(c.all_slots()) == 2
    assert c.dropped == 0 and c.snapshot().pending_slots == 0


def test_oversized_and_junk_values_are_dropped_unopened_and_counted(collector) -> None:
    c, key, store = collector
    slot = _attach(store, key, 0)
    c.poll()
    # junk under names nobody reads costs the collector nothing
    for i in range(50):
        store.set(f"{protocol.run_prefix(key.run_id)}/junk/{i}", b"x" * 1000)
    # a step batch the rank counted, overwritten with 5 MiB of junk before the read
    _batch(store, key, slot, 0, 1.0)
    store.set(protocol.ring_key(key.run_id, slot, "steps", 0), b"x" * (5 << 20))
    _beat(store, key, slot, 2, [1, 0])
    store.get(protocol.slot_key(key.run_id, slot, "hb"))  # the sets above are in
    c.poll()
    assert c.dropped_why == {"oversized": 1}
    assert c.all_slots()[0].steps == []
    # an oversized heartbeat is not a sign of life, nor kept
    store.set(protocol.slot_key(key.run_id, slot, "hb"), b"y" * (1 << 20))
    store.get(protocol.slot_key(key.run_id, slot, "hb"))
    c.poll()
    c.poll()
    assert c.dropped_why == {"oversized": 2}  # counted once, however often it is read
    assert len(c.all_slots()[0].raw_hb) <= 4096
    # the junk keys are never read, but the store keeps them: counted, said
    for i in range(50, 300):
        store.set(f"junk/{i}", b"x")
    store.get("junk/299")
    c._keys_t = -float("inf")  # its next look at the store's key count
    c.poll()
    assert c.dropped_why["unread keys"] >= 150, c.dropped_why  # of 300, less the run's own room


def test_a_replayed_heartbeat_is_dropped_and_is_no_sign_of_life(collector) -> None:
    """A genuine older heartbeat set again under its key (the rank stopped) must
    not keep the rank alive: it is counted as replayed, its silence goes on."""
    import time

    c, key, store = collector
    slot = _attach(store, key, 0)
    hb = protocol.slot_key(key.run_id, slot, "hb")
    c.poll()
    old = store.get(hb)  # beat 1
    _beat(store, key, slot, 2, [0, 0])
    c.poll()
    time.sleep(0.4)  # the rank stops here
    store.set(hb, old)
    c.poll()
    store.set(hb, store.get(hb) + b"")  # the same bytes again: nothing new
    c.poll()
    info = c.snapshot().ranks[0]
    assert c.dropped_why == {"replayed": 1}
    assert info.heartbeat.beat == 2 and info.silent_s >= 0.4


def test_a_forged_roster_does_not_hide_a_rank(collector) -> None:
    """Junk (or a forged roster) set at a rank's roster before it attaches: the
    rank replaces it and the collector finds the rank."""
    c, key, store = collector
    store.set(protocol.roster_key(key.run_id, 0), b"junk")
    _attach(store, key, 0)
    c.poll()
    assert [s.rank for s in c.all_slots()] == [0]


def test_a_heartbeat_silent_for_seconds_is_a_spell_the_others_waited_through(
        collector, monkeypatch) -> None:
    """A rank whose heartbeats stop (kill -STOP) then come back: the collector
    records the spell, with the others' step over it, and the verdict names it."""
    import time

    from torchlens.analysis.ranks.verdict import run_view
    from torchlens.capture.ranks import collector as collector_module

    monkeypatch.setattr(collector_module, "SPELL_S", 0.5)
    c, key, store = collector
    slots = [_attach(store, key, r) for r in range(2)]
    t0 = time.time()
    for slot in slots:
        _batch(store, key, slot, 0, t0)
        _say(store, key, protocol.slot_key(key.run_id, slot, "hb"),
             {"t": 1.0, "beat": 2, "sent": [1, 0], "steps_done": 7})
    c.poll()
    for i in range(5):  # rank 1 silent, rank 0 waits in its step 7
        time.sleep(0.15)
        _say(store, key, protocol.slot_key(key.run_id, slots[0], "hb"),
             {"t": 1.0, "beat": 3 + i, "sent": [1, 0], "steps_done": 7})
        c.poll()
    # rank 0's step 7, which spans the spell, arrives before or after rank 1 is back
    name = protocol.ring_key(key.run_id, slots[0], "steps", 1)
    store.set(name, key.seal(name, protocol.pack(1, protocol.encode(
        [{"step": 7, "t0": t0, "t1": time.time() + 0.05, "phases": {}}]))))
    _say(store, key, protocol.slot_key(key.run_id, slots[0], "hb"),
         {"t": 1.0, "beat": 20, "sent": [2, 0], "steps_done": 8})
    _say(store, key, protocol.slot_key(key.run_id, slots[1], "hb"),
         {"t": 1.0, "beat": 3, "sent": [1, 0], "steps_done": 8})
    c.poll()
    snap = c.snapshot()
    assert [(s.rank, s.step, s.step_after) for s in snap.spells] == [(1, 7, 8)]
    view = run_view(snap)
    said = view.verdict.sentence
    assert said.startswith(f"rank 1 went silent for {snap.spells[0].silent_s:.1f} s at step 7; "
                           "the others waited for it"), said
    assert view.spells == [said] and said not in view.notes  # said once, as the verdict


def test_ranks_are_found_when_rank_0_never_attaches(collector) -> None:
    c, key, store = collector
    _attach(store, key, 1)
    c.poll()
    assert [s.rank for s in c.all_slots()] == [1]
    assert c.snapshot().world_size == 2


def test_a_rank_whose_collector_is_gone_tries_once_and_says_one_line() -> None:
    # torchlens run killed before the ranks attach: a closed port with the run's
    # secret set, reached at start (the torchrun hook) and again at the first
    # step by the old code, 30 s each with torch's C++ stack on stderr
    import time

    key = RunKey.new()
    code = ("import torchlens\n"
            "from torchlens.capture.ranks.attach import attach\n"
            "attach()\n"
            "for _ in range(3): torchlens.step()\n"
            "print('trained')")
    e = env(TORCHLENS_COLLECTOR="127.0.0.1:9", **key.env())
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 0 and done.stdout.strip() == "trained", done.stderr
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("torchlens: not reporting to the collector"), (
        done.stderr)
    assert took < 25, took
