"""``%gpumonitor``: the live GPU/host monitor inline, for front ends without the sidebar.

Classic notebook and VS Code cannot load the JupyterLab sidebar, so this runs
the same samplers inside the kernel and streams them into a Bokeh figure
(``jupyter_bokeh.BokehModel``; only the new rows travel). Widgets are not
saved with a notebook, so a plain-HTML summary (``display_id``, updated in
place) is left beside the plot: the saved notebook still says what was seen.

The magics module registers it and parses its options (``%gpumonitor
[--interval S] [--minutes M] [--duration S]``, duration 0 = until Stop is
pressed); ``monitor_options`` checks them.
"""

from __future__ import annotations

import html
import math
import threading
import time
from typing import Any

from torchlens.capture.monitor.gpu import NvmlSampler, Sampler
from torchlens.capture.monitor.host import HostSampler
from torchlens.model import InputError
from torchlens.model.samples import GpuReading, GpuSample, HostSample, MachineSample
from torchlens.model.units import format_bytes, format_percent

COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
)


def monitor_options(
    interval: float = 1.0, minutes: float = 5.0, duration: float = 0.0
) -> dict[str, float]:
    """Validated monitor options; InputError (starting with the parameter's name).

    ``interval`` (seconds between samples) is clamped to 0.1 .. 60; ``minutes``
    of history are shown; ``duration`` 0 runs until Stop is pressed.
    """
    for name, value in (("interval", interval), ("minutes", minutes), ("duration", duration)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            raise InputError(f"{name} must be a number, got {value!r}")
    if minutes <= 0:
        raise InputError(f"minutes must be > 0, got {minutes!r}")
    if duration < 0:
        raise InputError(f"duration must be >= 0 seconds (0: until Stop), got {duration!r}")
    return {"interval": min(60.0, max(0.1, float(interval))), "minutes": float(minutes),
            "duration": float(duration)}


def _na(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


#: The sampler's metric keys in the words the summary uses (as the sidebar's card).
METRIC_NAMES = {
    "util_gpu": "util", "mem_used": "memory", "mem_reserved": "driver-reserved memory",
    "temp_c": "temp", "power_w": "power", "power_limit_w": "power limit",
    "pcie_tx_bps": "PCIe tx", "pcie_rx_bps": "PCIe rx",
    "nvlink_tx_bps": "NVLink tx", "nvlink_rx_bps": "NVLink rx",
}
#: Under the GPUs when NVML's pids are the host's (the sampler's ``pids``).
HOST_PIDS_NOTE = ("process ids are the host's (this kernel runs in a container); "
                  "names not shown")


def not_read_words(not_read: dict[str, str] | None) -> str:
    """"not read: NVLink tx, NVLink rx (why)": the metrics NVML would not give,
    grouped by why; "" when it gave every one."""
    by_why: dict[str, list[str]] = {}
    for key, why in (not_read or {}).items():
        by_why.setdefault(why, []).append(METRIC_NAMES.get(key, key))
    parts = [f"{', '.join(names)} ({why})" for why, names in by_why.items()]
    return f"not read: {'; '.join(parts)}" if parts else ""


def gpu_lines(g: GpuReading) -> list[str]:
    """One GPU of a sample as HTML lines: its figures, then why any is missing."""
    label = f"GPU {g.index}" + (f" MIG {g.mig_slot}" if g.mig_parent is not None else "")
    cuda = f" (cuda:{g.cuda})" if g.cuda is not None else ""
    mem = f"{format_bytes(g.mem_used)} / {format_bytes(g.mem_total)}"
    if g.mem_reserved is not None:
        mem += f" (+ {format_bytes(g.mem_reserved)} reserved by the driver)"
    pcie = (f"PCIe tx {_na(_mb(g.pcie_tx_bps), '{:.0f} MB/s')} · rx "
            f"{_na(_mb(g.pcie_rx_bps), '{:.0f} MB/s')}")
    if g.pcie_age_s is not None:
        pcie += f" (read {g.pcie_age_s:.0f} s ago)"
    lines = [
        f"{label}{cuda} {html.escape(g.name)}: util {format_percent(g.util_gpu)}, "
        f"mem {mem}, {_na(g.temp_c, '{} °C')}, {_na(g.power_w, '{:.0f} W')}, {pcie}, "
        f"{len(g.processes)} process(es)"
    ]
    if g.cuda is None and g.cuda_note:
        lines.append(f"&nbsp;&nbsp;no CUDA ordinal: {html.escape(g.cuda_note)}")
    if words := not_read_words(g.not_read):
        lines.append(f"&nbsp;&nbsp;{html.escape(words)}")
    return lines


def _mb(value: float | None) -> float | None:
    return None if value is None else value / 1e6


def summary_html(sample: MachineSample, stopped: bool = False) -> str:
    """Static text of one combined sample: what the saved notebook shows."""
    host, gpu = sample.host, sample.gpu
    when = time.strftime("%H:%M:%S", time.localtime(sample.t))
    lines = [
        f"<b>{html.escape(gpu.status)}</b>",
        f"host CPU {format_percent(host.cpu_percent)} · RAM "
        f"{format_bytes(host.ram_used)} / {format_bytes(host.ram_total)}",
    ]
    for g in gpu.gpus:
        lines.extend(gpu_lines(g))
    if gpu.gpus and gpu.pids == "host":
        lines.append(HOST_PIDS_NOTE)
    lines.append(f"<small>{'stopped' if stopped else 'last sample'} at {when}</small>")
    return "<div class='torchlens-gpumonitor'>" + "<br>".join(lines) + "</div>"


class InlineMonitor:
    """Samples in a thread and streams into one Bokeh figure; ``step()`` is one tick."""

    def __init__(
        self, host: Sampler[HostSample], gpu: Sampler[GpuSample], interval: float,
        minutes: float
    ) -> None:
        from bokeh.models import ColumnDataSource
        from bokeh.plotting import figure

        self.host, self.gpu, self.interval = host, gpu, interval
        self.rollover = max(10, int(minutes * 60 / interval))
        first = self._row(self._sample())
        self.source = ColumnDataSource({k: [v] for k, v in first.items()})
        self.figure = figure(
            height=220, sizing_mode="stretch_width", x_axis_type="datetime", y_range=(0, 100),
            title="GPU monitor (%)", tools="", toolbar_location=None,
        )  # fmt: skip
        for k, column in enumerate(c for c in first if c != "t"):
            self.figure.line(
                "t",
                column,
                source=self.source,
                color=COLORS[k % len(COLORS)],
                legend_label=column,
            )
        self.figure.legend.location = "top_left"
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __repr__(self) -> str:
        thread = getattr(self, "thread", None)
        ended = self._stop.is_set() or (thread is not None and not thread.is_alive())
        state = "stopped" if ended else "running"
        return (f"GPU monitor: {state}, a sample every {self.interval:g} s "
                f"(.stop() ends it)")

    def _sample(self) -> MachineSample:
        self.last = MachineSample(t=time.time(), host=self.host.sample(),
                                  gpu=self.gpu.sample())
        return self.last

    @staticmethod
    def _row(sample: MachineSample) -> dict[str, float | None]:
        host = sample.host
        row: dict[str, float | None] = {
            "t": sample.t * 1000,
            "host CPU": host.cpu_percent,
            "host RAM": host.ram_percent,
        }
        for g in sample.gpu.gpus:
            mem = (
                g.mem_used / g.mem_total * 100
                if g.mem_used is not None and g.mem_total
                else float("nan")
            )
            row[f"GPU{g.index} util"] = float("nan") if g.util_gpu is None else g.util_gpu
            row[f"GPU{g.index} mem"] = mem
        return row

    def step(self) -> MachineSample:
        """Take one sample and stream it (rows keep the first sample's columns)."""
        row = self._row(self._sample())
        self.source.stream(
            {k: [row.get(k, float("nan"))] for k in self.source.data},
            rollover=self.rollover,
        )
        return self.last

    def run(self, duration: float, on_sample: Any) -> None:
        """Sample until stopped (or ``duration`` s), calling ``on_sample(sample)`` each tick."""
        end = time.monotonic() + duration if duration > 0 else float("inf")
        while not self._stop.wait(self.interval) and time.monotonic() < end:
            on_sample(self.step())
        self.host.close()
        self.gpu.close()
        on_sample(self.last, stopped=True)

    def stop(self) -> None:
        self._stop.set()


UNTRUSTED_WIDGET = ("GPU monitor: a live widget, drawn only with its kernel running in a "
                    "trusted notebook; re-run the cell to see it")


def gpumonitor_magic(
    interval: float = 1.0, minutes: float = 5.0, duration: float = 0.0
) -> InlineMonitor:
    """``%gpumonitor``: show the live monitor inline; returns the running monitor."""
    import ipywidgets
    from IPython.display import HTML, display
    from jupyter_bokeh import BokehModel

    from torchlens.frontends.shared.bokeh_page import load_bokehjs

    opts = monitor_options(interval, minutes, duration)
    monitor = InlineMonitor(HostSampler(), NvmlSampler(), opts["interval"], opts["minutes"])
    loaded = load_bokehjs([monitor.figure])  # BokehModel draws with the page's BokehJS
    stop = ipywidgets.Button(description="Stop", icon="stop")
    stop.on_click(lambda _button: monitor.stop())
    box = ipywidgets.VBox([BokehModel(monitor.figure), stop])
    bundle = box._repr_mimebundle_() or {}
    # what an untrusted or kernel-less notebook shows instead of the widget
    bundle["text/plain"] = UNTRUSTED_WIDGET
    display(bundle, raw=True)
    handle = display(HTML(summary_html(monitor.last)), display_id=True)

    def on_sample(sample: MachineSample, stopped: bool = False) -> None:
        if handle is not None:  # None outside IPython (a script)
            handle.update(HTML(summary_html(sample, stopped)))
        if stopped:
            stop.disabled = True
            loaded.drop()

    monitor.thread = threading.Thread(
        target=monitor.run, args=(opts["duration"], on_sample), daemon=True
    )
    monitor.thread.start()
    return monitor
