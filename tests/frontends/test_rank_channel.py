"""How a kernel finds the Jupyter server that started it (for the rank channel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from torchlens.frontends.shared.rank_channel import find_server


def test_picks_the_parent_server_from_the_runtime_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHLENS_SERVER_URL", raising=False)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    parent = os.getppid()
    (tmp_path / f"jpserver-{parent + 1}.json").write_text(json.dumps(
        {"url": "http://other:1/", "token": "x", "pid": parent + 1}))
    (tmp_path / "jpserver-999999.json").write_text("{not json")
    (tmp_path / f"jpserver-{parent}.json").write_text(json.dumps(
        {"url": "http://127.0.0.1:8888/user/alice", "token": "t0k", "pid": parent}))
    server = find_server()
    assert server is not None
    assert server.url == "http://127.0.0.1:8888/user/alice/" and server.token == "t0k"


def test_no_server_outside_jupyter(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHLENS_SERVER_URL", raising=False)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    assert find_server() is None


def test_finding_it_does_not_import_the_server_app(tmp_path):
    # jupyter_server.serverapp takes seconds to import: the first %ddp_check
    # of a notebook paid them before this was read from the files directly.
    code = ("import sys; from torchlens.frontends.shared.rank_channel import find_server; "
            "find_server(); print('jupyter_server.serverapp' in sys.modules)")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path))
    env.pop("TORCHLENS_SERVER_URL", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.strip() == "False"


def test_kernel_side_never_imports_the_server_stack(tmp_path):
    """Every %%gpumem / %ddp_check in a plain kernel goes through this channel:
    importing and using it must not load jupyter_server, tornado or
    prometheus_client (seconds on a cold start, and not needed to POST JSON)."""
    code = (
        "import socket, sys\n"
        "import torchlens.frontends.shared.live_publish as lp\n"
        "from torchlens.frontends.shared.rank_channel import RankPublisher, ServerInfo, find_server\n"
        "assert find_server() is None\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
        "pub = RankPublisher('r', ServerInfo(f'http://127.0.0.1:{port}/', 't'), timeout=0.5)\n"
        "assert not pub.publish([{'rank': 0, 't': 0.0, 'allocated': 1}]) and pub.failures == 1\n"
        "with lp.LivePublisher('r', lambda: [], interval=0.01, publisher=pub):\n"
        "    pass\n"
        "sink = lp.RankSink('r', publisher=pub)\n"
        "from torchlens.model.messages import DdpHeartbeat\n"
        "sink.push(DdpHeartbeat(rank=0, t=1.0, rss=5)); sink.flush(force=True)\n"
        "print(sorted(m for m in ('jupyter_server', 'tornado', 'prometheus_client')\n"
        "             if m in sys.modules))\n"
    )
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path))
    env.pop("TORCHLENS_SERVER_URL", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
