"""What a %ddp_check run was asked for (``DdpOptions``), the job its ranks run
(``DdpJob``), and the backend it resolves to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchlens.formats.run_folder.manifest import ProfileEntry


@dataclass
class ProfileSpec:
    """``--profile``: the profiling interval (None: the ranks agree on one), the
    time budget, the window of a loop without steps, the steps to run (None:
    all), the run folder, and the step records the kernel keeps per rank."""

    every: int | None = None
    budget: float = 0.03
    window_s: float = 1.0
    max_steps: int | None = None
    run_dir: str = ""
    keep: int = 50

    def manifest(self) -> ProfileEntry:
        """The manifest's ``profile``: every figure but the folder itself."""
        return ProfileEntry(every=self.every, budget=self.budget, window_s=self.window_s,
                            max_steps=self.max_steps, keep=self.keep)


@dataclass
class BoardSpec:
    """Where a --strict rank attaches to the fingerprint board: its file and
    one wake FIFO per rank (``board.create``)."""

    file: str
    wake: list[str]


@dataclass
class DdpJob:
    """What every rank runs: a function (``fn``) or a notebook cell (``source``
    compiled as ``filename``, with the ``globals`` it uses), and how."""

    kind: str  # "function" or "cell"
    fn: Callable[..., Any] | None = None
    source: str = ""
    filename: str = ""
    #: the cell's names that can be sent: the user's own namespace, any objects
    globals: dict[str, Any] = field(default_factory=dict)
    backend: str = "gloo"
    strict: bool = False
    timeout_s: float = 30.0
    steps: int = 1
    seed: int = 0
    #: the kernel's cell file names -> In[N], to name cells in stacks and tracebacks
    cells: dict[str, int] = field(default_factory=dict)
    profile: ProfileSpec | None = None
    board: BoardSpec | None = None


#: a rank's heartbeat phase while its training thread is in torch.profiler's
#: stop and trace export: the hang clock stands still (at most
#: ``startup_timeout_s``), as it does while a rank starts
EXPORT_PHASE = "profiler export"


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
    profile: ProfileSpec | None = None
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
