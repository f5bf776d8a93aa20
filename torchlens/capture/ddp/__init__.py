"""%ddp_check capture: spawned ranks, a kernel-hosted TCPStore, recorded collectives."""

from .launcher import DdpOptions, resolve_backend, run_check, stop_all
from .profile import build_profile

__all__ = ["DdpOptions", "build_profile", "resolve_backend", "run_check", "stop_all"]
