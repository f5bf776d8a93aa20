"""Import and run the report's code once (Bokeh, pandas) while the user is not waiting.

A fresh kernel's first result spends about a second importing Bokeh and
pandas (``bench_coldstart.py``), while a warm one takes 0.07 s. ``%load_ext
torchlens`` starts those imports, and one tiny report of each kind, on a
background thread, so they happen
while the user writes or runs the next cells; ``%ddp_check`` starts them too,
while its ranks spawn and the kernel only waits.

A cell profiled by ``%%torchprof`` or recorded by ``%%gpumem`` must not share
the interpreter with a thread importing modules (its timings and allocations
would include the imports), so those magics ``wait()`` for the thread before
they start. ``TORCHLENS_NO_PRELOAD=1`` turns it off.
"""

from __future__ import annotations

import importlib
import os
import threading

#: What the first displayed result imports, slowest first.
MODULES = ("torchlens.frontends.ddp.api", "torchlens.capture.ddp", "torchlens.frontends.shared.live_publish",
           "cloudpickle", "jupyter_core.paths")

_thread: threading.Thread | None = None
_lock = threading.Lock()


def _import_all() -> None:
    try:
        for name in MODULES:
            importlib.import_module(name)
        _first_reports()
    except Exception:  # noqa: BLE001 - the real call reports it when it is needed
        return


#: A two-op Kineto trace: enough to take every path of a torchprof report once.
_TINY_TRACE = (b'{"traceEvents": ['
               b'{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, '
               b'"tid": 1, "ts": 0, "dur": 50},'
               b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, '
               b'"ts": 1, "dur": 20, "args": {"External id": 1}},'
               b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, '
               b'"ts": 25, "dur": 10, "args": {"External id": 2}}]}')


def _first_reports() -> None:
    """Report a tiny profile of each kind once: Bokeh fills per-class property
    defaults, pandas and numpy their first-call caches (0.1-0.3 s here), which
    the user's first report would otherwise pay."""
    from torchlens.formats.kineto import ingest_bytes
    from torchlens.frontends import kinds
    from torchlens.model import DdpRun, GpumemPayload, Profile
    from torchlens.model.snapshot import Snapshot, TraceEntry

    trace = [TraceEntry(a, 4096, 512, 0, time_us=t) for a, t in (("alloc", 1),
                                                                 ("free_completed", 2))]
    for profile in (
        Profile(kind="trace", traces={"main": ingest_bytes(_TINY_TRACE, source="warm-up")}),
        Profile(kind="gpumem", payload=GpumemPayload(measured_on="cpu"),
                snapshots={"d": Snapshot([], [trace])}),
        Profile(kind="ddp_check", payload=DdpRun(world_size=1, outcome="finished")),
    ):
        kinds.display_bundle(profile)


def warm_up() -> None:
    """Start the imports on a daemon thread (once per process)."""
    global _thread
    if os.environ.get("TORCHLENS_NO_PRELOAD"):
        return
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_import_all, name="torchlens-preload",
                                       daemon=True)
            _thread.start()


def wait() -> None:
    """Block until the imports started by ``warm_up`` are done (no-op if none)."""
    thread = _thread
    if thread is not None and thread.is_alive():
        thread.join()
