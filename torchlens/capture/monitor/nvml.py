"""NVML started once per process, and what to say where NVML cannot be.

Why once: ``nvmlInit`` can take hundreds of ms on a GPU without persistence
mode (the driver sets the devices up for the first client), and NVML counts
its clients: every ``nvmlShutdown`` that brings the count to zero lets the
next ``nvmlInit`` pay again. A capture reads the driver version at every
start and the sampler runs for the life of a server, so NVML is started on
first use and left running until the process ends (its handles are the
driver's, freed at exit). A failed start is remembered too: a machine
without the driver does not try again on every capture.

ROCm: PyTorch's ROCm builds answer ``torch.cuda`` through HIP (the caching
allocator, ``memory_stats`` and snapshots work the same) but an AMD GPU has
no NVML; ``rocm_build`` tells so the UI can say "ROCm build, NVML not
available" instead of "no NVIDIA GPU found".
"""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
from pathlib import Path
from typing import Any

#: id(api) -> (api, the error its nvmlInit raised or None).
_STARTED: dict[int, tuple[Any, BaseException | None]] = {}
_LOCK = threading.Lock()


def start(api: Any = None) -> None:
    """``nvmlInit`` once per process (per ``api``: tests pass fakes); raises the
    first start's ``NVMLError`` again on every later call."""
    import pynvml

    api = pynvml if api is None else api
    with _LOCK:
        hit = _STARTED.get(id(api))
        if hit is None or hit[0] is not api:
            try:
                api.nvmlInit()
                hit = (api, None)
            except pynvml.NVMLError as err:
                hit = (api, err)
            _STARTED[id(api)] = hit
    if hit[1] is not None:
        raise hit[1]


def rocm_build() -> str | None:
    """``torch.version.hip`` of the installed torch (``None``: not a ROCm build).

    Read without importing torch when this process has not: the server's
    sampler must not pay torch's import (seconds, hundreds of MB) to word a
    status line. ``torch/version.py`` is a plain file of assignments."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "version"):
        return getattr(torch.version, "hip", None) or None
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "version.py"
        if path.is_file():
            found = re.search(r"^hip\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]",
                              path.read_text(errors="replace"), re.M)
            return found.group(1) if found else None
    return None


def rocm_status(hip: str) -> str:
    """The line shown instead of "no NVIDIA GPU found" on a ROCm build."""
    return (f"ROCm build (HIP {hip}), NVML not available: AMD GPUs are not sampled here "
            "(rocm-smi shows them); CUDA memory and traces still work through HIP")
