"""Files shipped for a Prometheus and Grafana stack (docs/METRICS.md): the alerting
rules and the dashboard that ``torchlens metrics rules|dashboard`` print."""

from __future__ import annotations

from importlib import resources

FILES = {"rules": "torchlens-rules.yml", "dashboard": "torchlens-dashboard.json"}


def shipped(what: str) -> str:
    """The text of ``FILES[what]``, as installed with the package."""
    return resources.files(__name__).joinpath(FILES[what]).read_text(encoding="utf-8")
