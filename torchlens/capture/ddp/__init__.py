"""%ddp_check capture: spawned ranks, a kernel-hosted TCPStore, recorded collectives."""

from torchlens.capture.ddp.launcher import run_check, stop_all
from torchlens.capture.ddp.options import DdpOptions, resolve_backend
from torchlens.capture.ddp.profile import build_profile

__all__ = ["DdpOptions", "build_profile", "resolve_backend", "run_check", "stop_all"]
