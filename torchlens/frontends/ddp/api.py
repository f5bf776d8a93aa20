"""``torchlens.ddp_check(fn, world_size=2)``: the Python door to %ddp_check.

Validates every option before a single process starts (a typo costs nothing),
runs the check (``capture.ddp``), keeps the per-rank records and tables in a
``Profile`` of kind ``ddp_check``, and returns a ``DdpResult`` whose checklist
says what passed, what failed and what to do. In a notebook the per-rank plot
is live while the ranks run and is replaced by the report when they end, so the
saved notebook still shows it.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from torchlens.analysis.ddp.analyze import collective_rows
from torchlens.frontends.result import Result
from torchlens.frontends.shared.cells import cell_names, in_kernel
from torchlens.model import DdpRun, InputError, Profile
from torchlens.model.feed import RankFeed

BACKENDS = ("auto", "gloo", "nccl")


class DdpResult(Result):
    """A finished %ddp_check: the Profile, the checklist, per-rank tables."""

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile)
        self.checklist = self.analysis().checklist

    @property
    def records(self) -> DdpRun:
        """What the run recorded (``model.payloads.DdpRun``)."""
        return self.profile.payload  # type: ignore[return-value]

    @property
    def ok(self) -> bool:
        """True when no check failed."""
        return not self.failed()

    def failed(self) -> list[Any]:
        return [i for i in self.checklist if i.status == "failed"]

    def item(self, name: str) -> Any:
        """The checklist line called ``name`` (e.g. "collective sequence")."""
        found = self.analysis().item(name)
        if found is None:
            raise KeyError(f"no check named {name!r}; one of {[i.name for i in self.checklist]}")
        return found

    def collectives(self) -> Any:
        """Every recorded collective of every rank (pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(row)
                             for row in collective_rows(self.records, limit=None)])

    def memory(self) -> Any:
        """Heartbeat samples per rank: time, phase, RSS, tensor and CUDA bytes
        (no rows when no genuine heartbeat arrived, e.g. a run shorter than one)."""
        import pandas as pd

        table = self.profile.tables.get("heartbeats")
        if table is None:
            return pd.DataFrame(columns=["rank", "t", "t_rel", "beat", "phase"])
        return table.to_pandas()

    @property
    def run_dir(self) -> str | None:
        """--profile: the run folder (manifest.json, every rank's traces and steps)."""
        profiling = self.records.profiling
        return profiling.run_dir if profiling is not None else None

    def steps(self) -> Any:
        """--profile: one row per rank and step (ms per phase, profiled, window)."""
        import pandas as pd

        from torchlens.analysis.ranks.steps import step_rows

        profiling = self._profiling()
        return pd.DataFrame(step_rows(profiling.steps))

    def slow_rank(self) -> Any:
        """--profile: the rank the others waited for, and why (``analysis.ranks.slow.SlowRank``):
        the verdict of the checklist's slow-rank line, with the same figures."""
        from torchlens.analysis.ddp.profiled import profiled_slow_rank

        return profiled_slow_rank(self._profiling())

    def rank_memory(self) -> Any:
        """--profile: per rank and step: allocated, reserved, fragmentation (DataFrame)."""
        import pandas as pd

        from torchlens.analysis.ranks.steps import memory_rows

        profiling = self._profiling()
        return pd.DataFrame(memory_rows(profiling.steps, profiling.summaries))

    def _profiling(self) -> Any:
        if self.records.profiling is None:
            raise InputError("this run was not profiled: run %ddp_check with --profile")
        return self.records.profiling


def check_options(world_size: int, backend: str, timeout: float, steps: int | None,
                  export: str | None, *, profile: bool = False,
                  profile_every: int | None = None, profile_window: float = 1.0,
                  run_dir: str | None = None, local_ranks: int | None = None) -> None:
    """InputError naming the bad option; nothing has started yet. ``local_ranks``:
    the ranks on this machine when it is one node of several (--nproc-per-node)."""
    if not isinstance(world_size, int) or world_size < 1:
        raise InputError(f"world_size must be a whole number >= 1, got {world_size!r}")
    if backend not in BACKENDS:
        raise InputError(f"backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if not timeout > 0:
        raise InputError(f"timeout must be > 0 seconds, got {timeout!r}")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise InputError(f"steps must be a whole number >= 1, got {steps!r}")
    if profile_every is not None and (not isinstance(profile_every, int) or profile_every < 1):
        raise InputError(f"profile_every must be a whole number >= 1, got {profile_every!r}")
    if not (isinstance(profile_window, (int, float)) and 0.05 <= profile_window <= 3600):
        raise InputError(f"profile_window must be 0.05 to 3600 seconds, got {profile_window!r}")
    if run_dir is not None and not profile:
        raise InputError("run_dir keeps the profiled ranks' traces: add --profile")
    if run_dir is not None and os.path.exists(run_dir) and (
            not os.path.isdir(run_dir) or os.listdir(run_dir)):
        raise InputError(f"run folder {run_dir!r} exists and is not an empty folder: "
                         "name a new one (nothing is overwritten)")
    if backend == "nccl":
        import torch

        here = local_ranks or world_size
        if not torch.cuda.is_available() or torch.cuda.device_count() < here:
            raise InputError(f"backend nccl needs {here} GPUs; this machine has "
                             f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
                             " (use --backend gloo)")
    if export:
        from torchlens.frontends.export import check_export_path

        check_export_path(export, "ddp_check")
        if str(export).endswith("/") and not profile:
            raise InputError(f"--export {export}: a folder holds a --profile run's traces; "
                             "add --profile (or export to .html or .tlprof)")


def check_nodes(nnodes: int | None, nproc_per_node: int | None, rdzv_endpoint: str | None,
                host: str | None, *, strict: bool = False) -> Any:
    """--nnodes and its companions -> an ``ElasticSpec`` (None without --nnodes);
    InputError naming the bad option; nothing has started yet."""
    from torchlens.capture.ddp.elastic import ElasticSpec

    if nnodes is None:
        for name, value in (("nproc_per_node", nproc_per_node),
                            ("rdzv_endpoint", rdzv_endpoint), ("host", host)):
            if value is not None:
                raise InputError(f"{name} is for a run under torch's elastic agent: "
                                 "add --nnodes N (1 for this machine only)")
        return None
    if not isinstance(nnodes, int) or nnodes < 1:
        raise InputError(f"nnodes must be a whole number >= 1, got {nnodes!r}")
    if not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise InputError(f"nproc_per_node must be a whole number >= 1 (ranks on each node), "
                         f"got {nproc_per_node!r}")
    if not rdzv_endpoint or ":" not in rdzv_endpoint:
        raise InputError(f"rdzv_endpoint must be HOST:PORT (where the agents meet; this "
                         f"machine's address and a free port), got {rdzv_endpoint!r}")
    rhost, _, rport = rdzv_endpoint.rpartition(":")
    if not rhost or not rport.isdigit() or not 0 < int(rport) < 65536:
        raise InputError(f"rdzv_endpoint {rdzv_endpoint!r}: expected HOST:PORT with a port "
                         "from 1 to 65535")
    if strict and nnodes > 1:
        raise InputError("--strict compares collectives through shared memory on one machine: "
                         "drop --strict, or run with --nnodes 1")
    host = host or "127.0.0.1"
    import socket

    from torchlens.capture.channel.store import interface_address

    try:
        socket.getaddrinfo(interface_address(host), 0)
    except OSError:
        raise InputError(f"host {host!r} is neither an address nor an interface of this "
                         "machine (e.g. --host eth0, --host 10.0.0.5)") from None
    return ElasticSpec(nnodes, nproc_per_node, rdzv_endpoint, host)


def check_function(fn: Callable[..., Any]) -> None:
    """The function must be callable with (rank, world_size, device) or fewer."""
    if not callable(fn):
        raise InputError(f"{fn!r} is not a function")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return
    known = {"rank", "world_size", "device"}
    required = [p for p in params if p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    unnamed = [p for p in required if p.name not in known]
    if len(unnamed) > 2 or any(p.kind == p.KEYWORD_ONLY for p in unnamed):
        raise InputError(f"{getattr(fn, '__name__', fn)} needs arguments {[p.name for p in unnamed]}: "
                         "it is called as fn(rank, world_size) or with keywords rank, "
                         "world_size, device")


def cell_globals(source: str, filename: str, namespace: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The notebook names a cell uses that can travel to the workers (by value)."""
    import cloudpickle

    code = compile(source, filename, "exec")
    names: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack += [k for k in c.co_consts if inspect.iscode(k)]
    sent, skipped = {}, []
    for name in sorted(names - {"rank", "world_size", "device"}):
        if name not in namespace or name.startswith("__"):
            continue
        try:
            cloudpickle.dumps(namespace[name])
        except Exception:  # noqa: BLE001 - anything unpicklable stays behind
            skipped.append(name)
            continue
        sent[name] = namespace[name]
    return sent, skipped


def ddp_check(fn: Callable[..., Any] | None = None, *, world_size: int = 2,
              backend: str = "auto", timeout: float = 30.0, steps: int | None = None,
              strict: bool = False, live: bool | None = None, export: str | None = None,
              show: bool = False, seed: int = 0, profile: bool = False,
              profile_every: int | None = None, profile_window: float = 1.0,
              run_dir: str | None = None, nnodes: int | None = None,
              nproc_per_node: int | None = None, rdzv_endpoint: str | None = None,
              host: str | None = None,
              on_other_nodes: Callable[[list[str], dict[str, str]], Any] | None = None,
              metrics: bool = False) -> DdpResult:
    """Run ``fn`` on ``world_size`` spawned ranks and check it; returns the result.

    ``fn(rank, world_size)`` is one training step from a fixed start; it runs
    ``steps`` times per rank (default 2), each time from the same seeds
    (``seed``), so two runs can be compared for determinism. ``strict``
    compares each collective across ranks before it runs.

    ``profile``: ``fn`` is the training loop instead, run once per rank; it
    calls ``torchlens.step()`` at the end of each step. Every step's phases
    (data, forward, backward, optimizer, collectives) and memory are measured
    on every rank, one step in ``profile_every`` (default: chosen so the
    profiler costs at most 3% of step time, at least every 5th) runs under
    torch.profiler, and the ranks' traces go to ``run_dir`` (default
    ``./torchlens-runs/<name>-<time>``). ``steps`` then stops every rank after
    that many steps (and is passed to ``fn`` if it takes ``steps``). Code
    that never calls ``torchlens.step()`` is cut into ``profile_window``-second
    windows. ``live`` (default: inside a Jupyter kernel)
    shows the per-rank plot while the ranks run; it becomes the report when
    they end. A KeyboardInterrupt stops every rank and is re-raised.

    ``nnodes`` (with ``nproc_per_node`` and ``rdzv_endpoint`` HOST:PORT): the
    ranks start under torch's elastic agent (c10d rendezvous), this machine
    being one node of ``nnodes``; world size ``nnodes * nproc_per_node``. The
    command every other node runs is printed, and passed as (argv, env
    additions) to ``on_other_nodes``. ``host``: where the kernel's store
    listens (default loopback; name an interface when other nodes are other
    machines).

    ``metrics`` (with ``profile``): the job's per-rank series (those of
    ``torchlens run --metrics``, docs/METRICS.md) on the Jupyter server's
    ``/metrics`` while it runs, labelled with the run folder's name.
    """
    result, interrupted = run_ddp_check(
        fn, world_size=world_size, backend=backend, timeout=timeout, steps=steps,
        strict=strict, live=live, export=export, show=show, seed=seed, profile=profile,
        profile_every=profile_every, profile_window=profile_window, run_dir=run_dir,
        nnodes=nnodes, nproc_per_node=nproc_per_node, rdzv_endpoint=rdzv_endpoint, host=host,
        on_other_nodes=on_other_nodes, metrics=metrics)
    if interrupted:
        raise KeyboardInterrupt
    return result


def run_ddp_check(fn: Callable[..., Any] | None = None, *, world_size: int = 2,
                  backend: str = "auto", timeout: float = 30.0, steps: int | None = None,
                  strict: bool = False, live: bool | None = None,
                  export: str | None = None, show: bool = True, seed: int = 0,
                  cell: str | None = None, cell_filename: str = "<ddp_check cell>",
                  namespace: dict[str, Any] | None = None, profile: bool = False,
                  profile_every: int | None = None, profile_window: float = 1.0,
                  run_dir: str | None = None, nnodes: int | None = None,
                  nproc_per_node: int | None = None, rdzv_endpoint: str | None = None,
                  host: str | None = None, on_other_nodes: Any = None,
                  metrics: bool = False) -> tuple[DdpResult, bool]:
    """``ddp_check`` for front ends: also runs a cell; returns (result, interrupted).

    With ``show``, the live view (if any) is replaced by the result's display,
    and without a live view the result is displayed at the end.
    """
    from torchlens.capture.ddp import (
        DdpOptions,
        build_profile,
        resolve_backend,
        run_check,
    )
    from torchlens.capture.ddp.options import DdpJob, ProfileSpec

    profile = profile or profile_every is not None
    spec = check_nodes(nnodes, nproc_per_node, rdzv_endpoint, host, strict=strict)
    if spec is not None:
        world_size = spec.world_size
    check_options(world_size, backend, timeout, steps, export, profile=profile,
                  profile_every=profile_every, profile_window=profile_window, run_dir=run_dir,
                  local_ranks=spec.nproc_per_node if spec else None)
    publisher = None
    if metrics:
        from torchlens.frontends.shared.metrics_publish import needs_server

        if not profile:
            raise InputError("--metrics publishes --profile's step series: add --profile")
        publisher = needs_server("--metrics")
    skipped: list[str] = []
    if cell is not None:
        sent, skipped = cell_globals(cell, cell_filename, namespace or {})
        job = DdpJob(kind="cell", source=cell, filename=cell_filename, globals=sent)
        source = "%%ddp_check cell"
    else:
        if fn is None:
            raise InputError("give a function (or a cell) to run on every rank")
        check_function(fn)
        job = DdpJob(kind="function", fn=fn)
        source = getattr(fn, "__qualname__", repr(fn))
    backend = resolve_backend(backend, spec.nproc_per_node if spec else world_size)
    profiling = None
    if profile:
        if run_dir is None:
            name = "cell" if cell is not None else getattr(fn, "__name__", "run")
            run_dir = os.path.join("torchlens-runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
                                   f"-{os.getpid()}")
        profiling = ProfileSpec(every=profile_every, budget=0.03,
                                window_s=float(profile_window), max_steps=steps,
                                run_dir=os.path.abspath(run_dir), keep=50)
    runs = 1 if profile else (2 if steps is None else steps)
    job = dataclasses.replace(job, backend=backend, strict=strict, timeout_s=float(timeout),
                              steps=runs, seed=seed, cells=cell_names(), profile=profiling)
    options = DdpOptions(world_size=world_size, backend=backend, timeout_s=float(timeout),
                         steps=runs, strict=strict, seed=seed, profile=profiling,
                         entry="torchlens.frontends.ranks.rank_side" if profile
                         else "torchlens.capture.ddp.worker",
                         elastic=spec, on_other_nodes=on_other_nodes)
    live = in_kernel() if live is None else live
    if live or show or export:
        from torchlens.frontends.shared import preload

        preload.warm_up()  # the report's imports overlap the ranks' start-up
    handle = None
    loaded = None
    where = None  # the line that names the run folder while the ranks run

    def live_plot() -> RankFeed:
        # built once the ranks are spawned (RankSink.start): its Bokeh imports
        # overlap the workers' own torch import in a cold kernel
        nonlocal handle, loaded, where
        if not in_kernel():  # a terminal IPython: no widgets, one progress line
            from torchlens.render.ddp.progress import TextProgress

            return TextProgress(world_size)
        from IPython.display import HTML, display

        from torchlens.frontends.shared.bokeh_page import load_bokehjs
        from torchlens.render.ddp.heartbeats import LivePlot
        from torchlens.render.ddp.progress import running_note

        if profile:  # one view: step times, slow rank, memory, timeline, then heartbeats
            from torchlens.frontends.shared.live_view import ProfiledLiveView

            plot: ProfiledLiveView | LivePlot = ProfiledLiveView(
                world_size, profile_every, modelled=backend != "nccl")
            if not strict:  # only --strict counts collectives: no flat zero panel
                plot.beats.hide_collectives()
        else:
            plot = LivePlot(world_size)
        loaded = load_bokehjs([plot.layout])  # the widget draws with the page's BokehJS
        if profiling is not None:  # kept by a saved notebook whose kernel died mid-run
            where = display(HTML(str(running_note(world_size, profiling.run_dir))),
                            display_id=True)
        handle = display(plot.widget, display_id=True)
        return plot

    from torchlens.frontends.shared.live_publish import RankSink
    from torchlens.frontends.shared.metrics_publish import (
        MetricsFeed,
        Tee,
        this_machine,
    )

    # the same host and node labels as torchlens run's: under --nnodes the ranks' heartbeats say them
    feed = (MetricsFeed(os.path.basename(run_dir), world_size, publisher,
                        where=None if spec is not None else this_machine())
            if publisher is not None and run_dir is not None else None)
    make = live_plot if live else None
    if feed is not None:  # the Jupyter server's /metrics too (metrics_publish)
        make = (lambda: Tee(live_plot(), feed)) if live else (lambda: feed)
    # the GPU Monitor sidebar shows every rank's memory too, while they run
    sink = RankSink(f"%ddp_check {source} {time.strftime('%H:%M:%S')}", make_inner=make)
    rec = run_check(job, options, sink)
    sink.close()  # the terminal's progress line ends
    if feed is not None and feed.trouble():
        print(f"%ddp_check: {feed.trouble()}", file=sys.stderr)
    profile = build_profile(rec, source, skipped)
    result = DdpResult(profile)
    if export:
        result.export(export)
    if where is not None:  # the result names the folder: the running line goes
        where.update(_Empty())
    if handle is not None:
        # the static copy the saved notebook keeps (or nothing, if not shown)
        handle.update(result if show else _Empty())
        loaded.drop()  # BokehJS stays in the page; the notebook file drops its 1 MB
    elif show:
        from IPython.display import display

        display(result)
    return result, rec.run.interrupted


class _Empty:
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        return {"text/plain": ""}
