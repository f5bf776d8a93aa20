"""torchlens: profile and debug PyTorch training from inside Jupyter.

``%load_ext torchlens`` registers the magics. The same captures are available
from Python as context managers, e.g. ``with torchlens.torchprof() as result:``.
"""

from __future__ import annotations

import os
from typing import Any

from torchlens._version import __version__
from torchlens.model import InputError, Profile, TorchlensError

__all__ = [
    "InputError",
    "gpumem",
    "Profile",
    "TorchlensError",
    "__version__",
    "ddp_check",
    "load",
    "load_snapshots",
    "load_ipython_extension",
    "step",
    "torchprof",
    "watch",
]


def load(path: Any) -> Any:
    """Read what ``torchlens report`` reads (``frontends.loading.load``, one
    loader for both): a saved ``.tlprof`` result, as the capture gave it (a
    ``%%torchprof`` result's ``ops()``, ``kernels()``, ``steps()``); an allocator
    snapshot ``.pickle`` (a ``MemoryResult``, as ``%%gpumem`` gives); a folder
    of per-rank snapshots (``load_snapshots``); a folder
    or a list of per-rank traces, or one Kineto trace (``.json``, ``.json.gz``):
    the run as one result (``frontends.runs.api.RunResult``; ``run.diff(other)``
    compares, ``run.ignored`` lists the folder's files that are not traces).
    Raises ``FileNotFoundError`` (a ``torchlens.InputError`` too) for a path
    that does not exist, ``InputError`` for a folder with no usable trace."""
    from torchlens.frontends.loading import load as _load
    from torchlens.frontends.loading import missing_path
    from torchlens.model import TorchlensError
    from torchlens.model.errors import shown_alone

    if isinstance(path, (str, os.PathLike)) and not os.path.exists(path):
        raise shown_alone(missing_path(path))
    try:
        return _load(path)
    except TorchlensError as exc:  # its message says it all: no reader's frame under it
        raise shown_alone(exc) from None


def load_snapshots(folder: Any) -> Any:
    """A folder of per-rank allocator snapshots (``rank0.pickle``, ``rank1.pickle`` ...
    or ``rank<N>/*.pickle``; a ``%ddp_check --profile`` run folder's OOM snapshots
    ``rank<r>/oom.pickle``) as one result: each rank's peak, the imbalance named
    (``frontends.memory.ranks``). ``torchlens.load(FOLDER)`` reads such a folder
    the same way when it holds no traces."""
    from torchlens.frontends.memory.ranks import load_snapshots as _load_snapshots

    return _load_snapshots(os.fspath(folder))


def torchprof(**options: Any) -> Any:
    """Profile a block: ``with torchlens.torchprof(top=15) as result:``.

    Same options as ``%%torchprof`` (see ``frontends.trace.api.torchprof``).
    """
    from torchlens.frontends.trace.api import torchprof as _torchprof

    return _torchprof(**options)


def gpumem(**options: Any) -> Any:
    """Record a block's allocations: ``with torchlens.gpumem(simulate=True) as result:``.

    Same options as ``%%gpumem`` (see ``frontends.memory.api.gpumem``).
    """
    from torchlens.frontends.memory.api import gpumem as _gpumem

    return _gpumem(**options)


def ddp_check(fn: Any, **options: Any) -> Any:
    """Run ``fn(rank, world_size)`` on spawned ranks and check it for DDP bugs.

    Same options as ``%ddp_check`` (see ``frontends.ddp.api.ddp_check``):
    ``world_size``, ``backend``, ``timeout``, ``steps``, ``strict``, ``live``,
    ``export``. Returns a result whose ``checklist`` says what failed.
    """
    from torchlens.frontends.ddp.api import ddp_check as _ddp_check

    return _ddp_check(fn, **options)


def watch(target: Any, **options: Any) -> Any:
    """Watch a running ``torchlens run`` job in a notebook: its live view, inline.

    ``target``: the run folder (``--out``) or the collector's ``"host:port"``
    (with ``secret_file=`` the run's ``run.secret``). Options: ``secret_file``,
    ``timeout``, ``run_id`` (see ``frontends.ranks.watch.watch``). Returns a handle
    that shows the view, updates it in the background until the run ends,
    and has ``.stop()`` and ``.wait()``.
    """
    from torchlens.frontends.ranks.watch import watch as _watch

    return _watch(target, **options)


_attach_checked = False


def step() -> None:
    """Mark the end of a training step inside ``%%torchprof`` / ``torchprof()``.

    Drives ``--schedule`` and the per-step breakdown; does nothing outside a
    capture, so the same training code runs unchanged without torchlens.
    Under ``torchlens run`` (``TORCHLENS_COLLECTOR`` set), the first call
    attaches this rank to the collector (docs/MULTINODE.md).
    """
    global _attach_checked
    if not _attach_checked:  # one environment look-up per process
        _attach_checked = True
        if os.environ.get("TORCHLENS_COLLECTOR"):
            from torchlens.frontends.ranks.rank_side import attach

            attach()
    from torchlens.capture.trace.profiler import step as _step

    _step()


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext torchlens``: registers the magics and starts
    importing what the first report needs (``frontends.shared.preload``)."""
    from torchlens.frontends.notebook.magics import register
    from torchlens.frontends.shared import preload

    register(ipython)
    preload.warm_up()


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """Tells jupyter_server where the GPU monitor extension lives (the sidebar's backend)."""
    return [{"module": "torchlens.frontends.server"}]
