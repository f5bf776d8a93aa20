"""--strict's shared-memory board, in one process: two ranks' views of one file."""

from __future__ import annotations

import os
import threading
import time

import pytest

from torchlens.capture.ddp import board
from torchlens.capture.ddp.board import FingerprintBoard, digest


@pytest.fixture
def ranks(tmp_path):
    spec = board.create(2, str(tmp_path))
    views = [FingerprintBoard(spec, r, 2) for r in range(2)]
    yield views
    for v in views:
        v.close()
    board.remove(spec.file)
    assert not os.path.exists(spec.file)


def test_a_waiting_rank_is_woken_when_its_peer_publishes(ranks):
    a, b = ranks
    value = digest(0, "allreduce", [[4]], ["float32"])
    a.publish(0, value)
    peer = threading.Timer(0.2, b.publish, (0, value))
    start = time.monotonic()
    peer.start()
    assert a.wait(0, value, [1], 30.0) == ([], [])
    assert time.monotonic() - start < 10  # woken by the peer, not by the 30 s budget
    peer.join()


def test_a_different_digest_is_reported(ranks):
    a, b = ranks
    a.publish(0, digest(0, "allreduce", [[4]], ["float32"]))
    b.publish(0, digest(0, "broadcast", [[4]], ["float32"]))
    assert a.wait(0, digest(0, "allreduce", [[4]], ["float32"]), [1], 1.0) == ([], [1])


def test_an_absent_peer_is_returned_after_the_budget(ranks):
    a, b = ranks
    b.publish(0, 7)  # the same ring slot as collective #4, an older index
    start = time.monotonic()
    assert a.wait(4, 7, [1], 0.1) == ([1], [])
    assert time.monotonic() - start >= 0.1


def test_the_digest_depends_on_the_index():
    assert digest(0, "allreduce", [[4]], ["float32"]) != digest(4, "allreduce", [[4]], ["float32"])
