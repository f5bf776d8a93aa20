"""%ddp_check capture: spawned ranks, a kernel-hosted TCPStore, recorded collectives."""

from .launcher import DdpOptions, resolve_backend, run_check, stop_all

__all__ = ["DdpOptions", "resolve_backend", "run_check", "stop_all"]
