"""Under ``torchlens run``: a Lightning ``Trainer`` gets ``TorchlensCallback``
with no change to the job, through Lightning's own mechanism.

Why this way: every Lightning 2.x ``Trainer`` extends its callbacks with what
the factories of the entry point group ``lightning.pytorch.callbacks_factory``
(``pytorch_lightning.callbacks_factory`` in the older ``pytorch_lightning``
distribution) return (``_CallbackConnector.on_trainer_init``, after the user's callbacks and
its defaults, before it moves checkpoint callbacks last). Entry points are
read from the distributions that ``importlib.metadata`` finds on
``sys.meta_path``; ``install`` puts there a finder of one small distribution
whose only entry point is ``callbacks`` below. No Lightning method is touched,
nothing is imported until a Trainer is built, and a job never run under
``torchlens run`` has no finder (a ``pip install`` entry point would be seen
by every Lightning job on the machine).

A Trainer that already has a ``TorchlensCallback`` (added by hand) gets none:
the factory is called with no arguments, so it reads the callbacks the Trainer
holds at that point from ``on_trainer_init``'s frame; where that frame is not
found (another Lightning), the callback is added and the two act as one
(``lightning.TorchlensCallback``: the first on the Trainer's list acts).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from typing import Any

from torchlens.integrations.versions import UnsupportedVersion

#: the distribution ``importlib.metadata`` sees under ``torchlens run``
NAME = "torchlens-run-callbacks"
#: ``lightning``'s group and the older ``pytorch_lightning`` distribution's
GROUPS = ("lightning.pytorch.callbacks_factory", "pytorch_lightning.callbacks_factory")
_ENTRY_POINTS = "".join(f"[{g}]\ntorchlens = {__name__}:callbacks\n" for g in GROUPS)


class _Distribution(importlib.metadata.Distribution):
    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\nName: {NAME}\nVersion: 0\n"
        if filename == "entry_points.txt":
            return _ENTRY_POINTS
        return None

    def locate_file(self, path: Any) -> Any:
        return None


class _Finder:
    """A ``sys.meta_path`` entry that finds no module, only ``_Distribution``."""

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        return None

    def find_distributions(self, context: Any = None) -> list[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is not None and name.replace("_", "-").lower() != NAME:
            return []
        return [_Distribution()]


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())


def _trainer_callbacks() -> list[Any] | None:
    """The callbacks of the Trainer being built, from ``on_trainer_init``'s frame."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "on_trainer_init":
            trainer = getattr(frame.f_locals.get("self"), "trainer", None)
            found = getattr(trainer, "callbacks", None)
            return list(found) if isinstance(found, list) else None
        frame = frame.f_back
    return None


def callbacks() -> list[Any]:
    """Lightning's callbacks factory: ``[TorchlensCallback()]`` under ``torchlens
    run`` unless the Trainer has one; ``[]`` otherwise. Never raises: a
    failure is one line on stderr and the Trainer is built without it."""
    if not os.environ.get("TORCHLENS_COLLECTOR"):
        return []
    try:
        from torchlens.integrations.lightning import TorchlensCallback

        if any(isinstance(cb, TorchlensCallback) for cb in _trainer_callbacks() or []):
            return []
        return [TorchlensCallback()]
    except UnsupportedVersion as exc:  # its message is the line (names the version)
        print(f"{exc}; the Trainer's steps come from its optimizer", file=sys.stderr)
        return []
    except Exception as exc:  # noqa: BLE001 - the user's job must run whatever happens here
        print(f"torchlens: the Lightning Trainer runs without TorchlensCallback "
              f"(its steps come from its optimizer): {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return []
