"""The environment a profile was taken in, so two runs can be compared honestly.

Every value is best effort: a fact this machine cannot tell (no CUDA, no NVML)
is recorded as ``None`` and named in ``unmeasured``, never guessed.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

#: Environment variables that change what PyTorch, CUDA or NCCL do.
RELEVANT_ENV_VARS = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "CUBLAS_WORKSPACE_CONFIG",
    "NCCL_DEBUG",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_SOCKET_IFNAME",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
)


def _nvml_driver() -> tuple[str | None, str | None]:
    """(driver version, reason it is unknown). NVML is started once per process
    (``monitor.nvml.start``) and never shut down here: a capture starts often."""
    try:
        import pynvml

        from torchlens.capture.monitor.nvml import start

        start()
    except Exception as exc:  # any NVML failure means "no driver here"
        return None, f"NVML unavailable ({type(exc).__name__})"
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return (version.decode() if isinstance(version, bytes) else version), None
    except Exception as exc:
        return None, f"driver version not reported ({type(exc).__name__})"


def collect_environment() -> dict[str, Any]:
    """A JSON-able description of this process's software and hardware.

    Keys: python, platform, host, cpu_count, torch, cuda, rocm (HIP version
    of a ROCm build, else None), cudnn, nccl, cuda_available, gpus (name,
    memory per visible device), driver, env (relevant variables that are
    set), unmeasured (what could not be told).

    A ROCm build answers ``torch.cuda`` through HIP, so its GPUs, allocator
    and NCCL (RCCL) are read as on CUDA; only the driver version, which comes
    from NVML, is named unmeasured ("ROCm build, NVML not available").
    """
    import torch

    unmeasured: list[str] = []
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "rocm": getattr(torch.version, "hip", None),
        "cudnn": None,
        "nccl": None,
        "cuda_available": False,
        "gpus": [],
        "driver": None,
        "env": {k: os.environ[k] for k in RELEVANT_ENV_VARS if k in os.environ},
        "torch_threads": torch.get_num_threads(),
    }
    try:
        env["cuda_available"] = bool(torch.cuda.is_available())
    except Exception:
        env["cuda_available"] = False
    if env["cuda_available"]:
        try:
            env["cudnn"] = torch.backends.cudnn.version()
        except Exception:
            unmeasured.append("cuDNN version")
        try:
            nccl = torch.cuda.nccl.version()
            env["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
        except Exception:
            unmeasured.append("NCCL version")
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            env["gpus"].append(
                {"index": i, "name": props.name, "total_memory": props.total_memory}
            )
        if env["rocm"]:
            unmeasured.append("GPU driver version: ROCm build, NVML not available")
        else:
            env["driver"], reason = _nvml_driver()
            if reason:
                unmeasured.append(f"GPU driver version: {reason}")
    elif env["rocm"]:
        unmeasured.append(
            f"GPU: no ROCm device visible to torch (torch {torch.__version__}, "
            f"ROCm build: HIP {env['rocm']}; NVML not available)"
        )
    else:
        unmeasured.append(
            "GPU: no CUDA device visible to torch "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})"
        )
    env["unmeasured"] = unmeasured
    return env
