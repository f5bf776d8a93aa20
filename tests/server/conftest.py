"""jupyter_server's pytest plugin (pytest-jupyter[server]) for the handler tests.

Its fixtures are imported here rather than via ``pytest_plugins`` because
pytest only honours that in the top-level conftest, which another module owns.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip(
    "pytest_jupyter.jupyter_server",
    reason="needs pytest-jupyter[server]: pip install 'pytest-jupyter[server]'",
)

from pytest_jupyter.jupyter_server import *  # noqa: E402,F403 - fixtures and hooks


class StepHost:
    """Host sampler double: deterministic CPU values 0, 1, 2, ..."""

    def __init__(self) -> None:
        self.n = 0

    def sample(self) -> dict[str, Any]:
        self.n += 1
        return {
            "t": time.time(),
            "cpu_percent": float(self.n),
            "cpu_count": 2,
            "ram_used": 1,
            "ram_total": 2,
            "ram_percent": 50.0,
        }

    def close(self) -> None:
        pass


class NoGpu:
    """GPU sampler double for a machine without a driver."""

    closed = False

    def sample(self) -> dict[str, Any]:
        status = "no NVIDIA GPU found (NVIDIA driver not loaded)"
        return {"t": time.time(), "available": False, "status": status, "gpus": []}

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def jp_server_config() -> Any:
    """Enable the torchlens extension with a fast interval (it is off in the default config)."""
    from traitlets.config import Config

    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {"torchlens": True},
                "tornado_settings": {"torchlens_monitor_interval": 0.1},
            }
        }
    )


@pytest.fixture
def monitor(jp_serverapp: Any) -> Any:
    """The server's monitor; stopped after the test so no thread outlives its loop."""
    mon = jp_serverapp.web_app.settings["torchlens_monitor"]
    yield mon
    mon.stop()
