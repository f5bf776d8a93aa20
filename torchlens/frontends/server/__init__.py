"""Jupyter server extension: the GPU monitor behind the JupyterLab sidebar.

Enabled at install by ``jupyter-config/server-config/torchlens.json``; jupyter
server finds this module through ``torchlens._jupyter_server_extension_points``.
One ``Monitor`` (one sampler thread) serves every browser tab; it is stopped
when the server shuts down.

Settings go through the server's ``tornado_settings`` (no config class to keep
this small), e.g. ``--ServerApp.tornado_settings='{"torchlens_monitor_interval":
0.5, "torchlens_monitor_idle_interval": 10, "torchlens_monitor_idle_after": 30}'``.
"""

from __future__ import annotations

from typing import Any

from tornado.ioloop import IOLoop

from torchlens.frontends.monitor.sampler import Monitor
from torchlens.frontends.server import prometheus
from torchlens.frontends.server.handlers import handlers
from torchlens.frontends.server.notebook_metrics import NotebookRuns
from torchlens.frontends.server.stream import Broadcaster


def make_monitor(settings: dict[str, Any]) -> Monitor:
    """Build the monitor with the real NVML and psutil samplers."""
    from torchlens.capture.monitor.gpu import NvmlSampler
    from torchlens.capture.monitor.host import HostSampler

    return Monitor(
        HostSampler(),
        NvmlSampler(),
        interval=float(settings.get("torchlens_monitor_interval", 1.0)),
        idle_interval=float(settings.get("torchlens_monitor_idle_interval", 10.0)),
        idle_after=float(settings.get("torchlens_monitor_idle_after", 30.0)),
    )


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Register the handlers and start the single sampler thread."""
    web_app = serverapp.web_app
    monitor = web_app.settings.get("torchlens_monitor")
    if monitor is None:
        monitor = make_monitor(web_app.settings)
        web_app.settings["torchlens_monitor"] = monitor
        # every socket shares one encode of each sample (see stream.py)
        web_app.settings["torchlens_broadcaster"] = Broadcaster(
            monitor, web_app.settings
        )
        # the loop the server's handlers run on: the thread hands samples to it
        monitor.start(IOLoop.current())
        # its GPU and host series on the server's own /metrics (docs/METRICS.md)
        # and the per-rank series notebook kernels publish (notebook_metrics.py)
        notebook = web_app.settings["torchlens_notebook_metrics"] = NotebookRuns()
        web_app.settings["torchlens_prometheus"] = prometheus.register(monitor, notebook)
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))
    serverapp.log.info("torchlens GPU monitor: %s", monitor.gpu.status)


def _unload_jupyter_server_extension(serverapp: Any) -> None:
    """Stop the sampler thread when the server shuts down."""
    prometheus.unregister(serverapp.web_app.settings.pop("torchlens_prometheus", None))
    broadcaster = serverapp.web_app.settings.pop("torchlens_broadcaster", None)
    if broadcaster is not None:
        broadcaster.close()
    monitor = serverapp.web_app.settings.pop("torchlens_monitor", None)
    if monitor is not None:
        monitor.stop()
