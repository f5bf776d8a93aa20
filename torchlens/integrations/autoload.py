"""Under ``torchlens run``: the Hugging Face Trainer gets ``TorchlensCallback``
when (and only if) the job imports it, with no change to the job.

Why this way: ``transformers.trainer.DEFAULT_CALLBACKS`` is the list every
``Trainer`` starts its callbacks from (``DefaultFlowCallback``); appending the
callback class there is how the Trainer itself adds callbacks, touches no
method, and puts it right after ``DefaultFlowCallback``. It is appended once
``transformers.trainer`` has been imported by the job: a finder first on
``sys.meta_path`` waits for that one module name, lets the usual finders find
it, runs its code, then appends, and takes itself off ``sys.meta_path``. A job
that never imports the Trainer imports nothing more.

A Lightning ``Trainer`` gets its callback through Lightning's own
callbacks-factory entry point instead (``lightning_autoload``).

A transformers older than supported, or anything that fails here: one line on
stderr, nothing added, and the job runs on untouched (its steps then come from
its optimizer, ``capture.ranks.autostep``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from torchlens.integrations import lightning_autoload
from torchlens.integrations.versions import message

TRAINER = "transformers.trainer"


def _say(what: str, exc: BaseException) -> None:
    print(f"torchlens: {what}: {type(exc).__name__}: {exc}", file=sys.stderr)


def add_trainer_callback(module: ModuleType) -> None:
    """Append ``TorchlensCallback`` to ``module.DEFAULT_CALLBACKS`` (once), or say
    in one line why not."""
    try:
        import transformers

        too_old = message("transformers", transformers.__version__)
        if too_old is not None:
            print(f"{too_old}; the Trainer's steps come from its optimizer", file=sys.stderr)
            return
        from torchlens.integrations.huggingface import TorchlensCallback

        callbacks = module.DEFAULT_CALLBACKS
        if TorchlensCallback not in callbacks:
            callbacks.append(TorchlensCallback)
    except Exception as exc:  # noqa: BLE001 - the user's job must run whatever happens here
        _say("the Hugging Face Trainer runs without TorchlensCallback", exc)


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after the module ``name`` is first imported."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        self.remove()
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, then = spec.loader, self.then

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)  # the user's import; its errors are its own
                then(module)

            def __getattr__(self, attr: str) -> Any:  # get_source, get_code, is_package
                return getattr(loader, attr)

        spec.loader = Loader()
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def install() -> None:
    """Add the callbacks of the frameworks this job imports (module docstring);
    never raises."""
    try:
        lightning_autoload.install()
        module = sys.modules.get(TRAINER)
        if module is not None:
            add_trainer_callback(module)
        elif not any(isinstance(f, AfterImport) and f.name == TRAINER for f in sys.meta_path):
            sys.meta_path.insert(0, AfterImport(TRAINER, add_trainer_callback))
    except Exception as exc:  # noqa: BLE001 - the user's job must run whatever happens here
        _say("framework callbacks not added", exc)
