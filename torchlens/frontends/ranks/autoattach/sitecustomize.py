"""``torchlens run`` puts this directory first on its command's ``PYTHONPATH``:
Python imports this ``sitecustomize`` when each of the command's processes
starts, so a training script attaches to the collector without importing
torchlens (``frontends.ranks.rank_side.attach``, as ``torchlens.step()`` does).

What it does, in order:
- the ``sitecustomize`` this one hides (the next one on ``sys.path``, a
  distribution's or the user's own) is run as if it had been found first;
- in a process with ``TORCHLENS_COLLECTOR`` but no ``RANK`` (a launcher's
  own process: torchrun's agent, or Lightning's DDP launcher, which starts
  its ranks itself), Lightning's callbacks factory only: the callback
  attaches each rank when its Trainer sets up;
- only in a rank of a torchrun-style launcher (``TORCHLENS_COLLECTOR``,
  ``RANK`` and ``LOCAL_RANK`` set: not the launcher's agent, not a plain
  ``python``), and not in a process that rank started (a DataLoader's spawned
  worker inherits its environment: ``TORCHLENS_ATTACHED`` names the rank's
  pid), this process attaches, and the callbacks of the frameworks it will
  import are added when it imports them (``torchlens.integrations.autoload``).

In every process of the command, ``sys.stdout`` and ``sys.stderr`` are
guarded (``capture.ranks.output_guard``): if ``torchlens run`` dies, the job's
next ``print`` finds no reader, and the job runs on with its output dropped
instead of dying of BrokenPipeError.

Never breaks the job: a failure prints one line on stderr and the job runs
on untouched.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_MARK = "TORCHLENS_ATTACHED"


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    ours = sys.modules.get(__name__)
    sys.modules[__name__] = module  # the hidden one sees itself as sitecustomize
    try:
        spec.loader.exec_module(module)
    except Exception:
        sys.modules[__name__] = ours
        raise


def _guard() -> None:
    # every process of the command: its prints must not fail when torchlens
    # run, which reads them, is gone
    if os.environ.get("TORCHLENS_COLLECTOR"):
        from torchlens.capture.ranks.output_guard import guard_output

        guard_output()


def _no_script() -> bool:
    """Whether this process is about to fail to open its script (a mistyped
    name): Python says so the moment this module returns, and attaching first
    would import torch for nothing (2 s a rank, the whole run's failure slower
    than bare torchrun's)."""
    script = sys.argv[0] if getattr(sys, "argv", None) else ""
    return bool(script) and script not in ("-c", "-m", "-") and not os.path.exists(script)


def _attach() -> None:
    env = os.environ
    if not env.get("TORCHLENS_COLLECTOR"):
        return
    if "RANK" not in env or "LOCAL_RANK" not in env:
        # a launcher's own process (torchrun's agent; Lightning's DDP launcher,
        # whose rank 0 is this process and which starts the others itself):
        # only Lightning's callbacks factory, which attaches each rank when its
        # Trainer sets up; nothing is imported until a Trainer is built
        if not env.get(_MARK):
            from torchlens.integrations import lightning_autoload

            lightning_autoload.install()
        return
    if env.get(_MARK) and env[_MARK] != str(os.getpid()):
        return  # a process the attached rank started
    if _no_script():
        return
    env[_MARK] = str(os.getpid())
    from torchlens.frontends.ranks.rank_side import attach

    if attach() is not None:  # the frameworks' callbacks, once the job imports them
        from torchlens.integrations import autoload

        autoload.install()


for _part in (_chain, _guard, _attach):
    try:
        _part()
    except Exception as _exc:  # noqa: BLE001 - the user's job must run whatever happens here
        print(f"torchlens: {'the hidden sitecustomize failed' if _part is _chain else 'not attached'}"
              f": {type(_exc).__name__}: {_exc}", file=sys.stderr)
