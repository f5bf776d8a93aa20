"""The oldest framework versions the integrations support, and the one-line
message for an older one (``pyproject.toml``'s extras say the same)."""

from __future__ import annotations

import re

#: distribution -> the oldest supported version
OLDEST = {"transformers": (4, 40), "accelerate": (0, 30)}


class UnsupportedVersion(ImportError):
    """A framework older than ``OLDEST``; its message is the one line to show."""


def parse(version: str) -> tuple[int, ...]:
    """``"4.40.0.dev0"`` -> ``(4, 40, 0)``: the leading numbers."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


def message(name: str, version: str) -> str | None:
    """The one line saying ``version`` of ``name`` is too old, or None when it is not."""
    oldest = OLDEST[name]
    if parse(version)[: len(oldest)] >= oldest:
        return None
    need = ".".join(map(str, oldest))
    return (f"torchlens: {name} {version} is older than the {need} the torchlens "
            f"integration supports: pip install '{name}>={need}' "
            f"(or pip install 'torchlens[{_EXTRA[name]}]')")


_EXTRA = {"transformers": "huggingface", "accelerate": "accelerate"}


def require(name: str, version: str) -> None:
    """Raise ``UnsupportedVersion`` when ``version`` of ``name`` is too old."""
    said = message(name, version)
    if said is not None:
        raise UnsupportedVersion(said)
