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
