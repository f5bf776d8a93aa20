"""A rank attached to ``torchlens run`` exits cleanly: its sender thread is
stopped at exit, never left inside a store call when the interpreter
finalizes (which ends it through torch's C++ frames and aborts the process,
"terminate called without an active exception", after the last step)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchlens.capture.channel.signing import RunKey
from torchlens.capture.ranks.collector import Collector

from .helpers import REPO, env

pytestmark = pytest.mark.timeout(120)

#: a rank whose sender makes store calls back to back, so that at exit it is
#: inside one nearly always
RANK = """
import torchlens
from torchlens.capture.ranks import attach
attach.HEARTBEAT_S = 0.0
for _ in range(3):
    torchlens.step()
print("trained", flush=True)
"""


def test_a_rank_exits_cleanly_with_its_sender_in_a_store_call() -> None:
    c = Collector(RunKey.new())
    try:
        rank_env = {**env(), **c.key.env(), "TORCHLENS_COLLECTOR": f"127.0.0.1:{c.port}"}
        for _ in range(5):
            proc = subprocess.run([sys.executable, "-c", RANK], cwd=REPO, env=rank_env,
                                  capture_output=True, text=True, timeout=60)
            output = proc.stdout + proc.stderr
            assert "trained" in output, output
            assert proc.returncode == 0, output
            assert "terminate called" not in output, output
    finally:
        c.close()
