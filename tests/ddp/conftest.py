"""Every %ddp_check test must leave no worker and no listening store behind."""

from __future__ import annotations

import os
import socket

import cloudpickle
import psutil
import pytest

from . import buggy, profiled

cloudpickle.register_pickle_by_value(buggy)
cloudpickle.register_pickle_by_value(profiled)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def assert_clean(result_or_records) -> None:
    rec = getattr(result_or_records, "records", result_or_records)
    rec = getattr(rec, "run", rec)  # the launcher's records before they become a Profile
    for pid in rec.pids:
        assert not group_alive(pid), f"process group {pid} of a worker is still alive"
    assert port_free(rec.port), f"store port {rec.port} still in use"
    if rec.board:  # --strict's shared-memory file
        assert not os.path.exists(rec.board), f"board file {rec.board} left behind"


@pytest.fixture
def no_leftovers():
    """After the test (pass or fail): no new child process; kill any and fail."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    left = [p for p in me.children(recursive=True) if p.pid not in before]
    for p in left:
        try:
            os.killpg(p.pid, 9)
        except (ProcessLookupError, PermissionError):
            p.kill()
    assert not left, f"worker processes left behind: {[p.pid for p in left]}"
