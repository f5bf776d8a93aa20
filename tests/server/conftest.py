"""jupyter_server's pytest plugin (pytest-jupyter[server]) for the handler tests.

Its fixtures are imported here rather than via ``pytest_plugins`` because
pytest only honours that in the top-level conftest, which another module owns.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip(
    "pytest_jupyter.jupyter_server",
    reason="needs pytest-jupyter[server]: pip install 'pytest-jupyter[server]'",
)

from pytest_jupyter.jupyter_server import *  # noqa: E402,F403 - fixtures and hooks


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
