"""``%ddp_check --profile --metrics``'s series carry the ``host`` and ``node`` that
``torchlens run --metrics`` gives (they were ``host=""``, ``node=""``,
so a dashboard's host join and node filter lost the notebook's ranks)."""

from __future__ import annotations

import socket
from typing import Any

from torchlens.frontends.ddp.api import ddp_check

from . import profiled


class _Publisher:
    """The kernel's channel to its Jupyter server, keeping what it would POST."""

    enabled = True

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.failures = 0
        self.last_error = ""

    def post(self, path: str, body: dict[str, Any]) -> bool:
        self.bodies.append(body)
        return True


def test_notebook_series_are_labelled_with_this_host_and_node_0(monkeypatch, tmp_path) -> None:
    publisher = _Publisher()
    monkeypatch.setattr("torchlens.frontends.shared.metrics_publish.needs_server",
                        lambda what, p=None: publisher)
    res = ddp_check(profiled.balanced, world_size=2, backend="gloo", profile=True, steps=6,
                    run_dir=str(tmp_path / "nbrun"), live=False, metrics=True)
    assert res.records.outcome == "finished"
    final = publisher.bodies[-1]
    assert final["run"] == "nbrun"
    per_rank = [labels for f in final["families"] for _, labels, _ in f["samples"]
                if "rank" in labels]
    assert per_rank
    assert {(lab["host"], lab["node"]) for lab in per_rank} == {(socket.gethostname(), "0")}
