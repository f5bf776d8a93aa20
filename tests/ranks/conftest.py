"""Every ``torchlens run`` a test starts registers in a registry of its own,
never in the user's ``~/.cache/torchlens/runs`` (a JupyterLab sidebar on this
machine would list it)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_registry(tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHLENS_RUNS_DIR", str(tmp_path_factory.mktemp("registry")))
