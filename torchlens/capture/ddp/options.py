"""What a %ddp_check run was asked for (``DdpOptions``), and the backend it resolves to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DdpOptions:
    """What the user chose (validated by the front end before anything starts)."""

    world_size: int = 2
    backend: str = "auto"
    timeout_s: float = 30.0
    steps: int = 2
    strict: bool = False
    seed: int = 0
    startup_timeout_s: float = 180.0
    #: --profile: {"every", "budget", "window_s", "max_steps", "run_dir", "keep"}
    profile: dict[str, Any] | None = None
    #: the module a rank runs (``python -m``); a profiled rank's entry also summarises
    entry: str = "torchlens.capture.ddp.worker"
    #: --nnodes: the ranks start under torch's elastic agent (``elastic.ElasticSpec``)
    elastic: Any = None
    #: called with (argv, env additions) of the command every other node runs
    on_other_nodes: Any = None


def resolve_backend(backend: str, world_size: int) -> str:
    """auto: nccl when every rank can have its own GPU, else gloo."""
    if backend != "auto":
        return backend
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"
