"""Saving and loading a ``Profile`` as a ``.tlprof`` file (the layout and its
compatibility rule: ``model.tlprof``)."""

from __future__ import annotations

from pathlib import Path

from torchlens.model.profile import Profile
from torchlens.model.tlprof import FORMAT, FORMAT_VERSION

__all__ = ["FORMAT", "FORMAT_VERSION", "load_profile", "save_profile"]


def save_profile(profile: Profile, path: str | Path) -> str:
    """Write ``profile`` to ``path``; returns the path as a string."""
    return profile.save(path)


def load_profile(path: str | Path) -> Profile:
    """Read a ``.tlprof`` file; raises ``InputError`` with advice on bad input."""
    return Profile.load(path)
