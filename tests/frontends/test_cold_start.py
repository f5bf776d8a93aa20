"""The first capture of a fresh kernel does not pay for imports it does not use.

torch's profiler start (``prepare_trace``) and ``symbolize_tracebacks`` look up
``torch._inductor``, which imports inductor and torch._dynamo: seconds on a
cold kernel, for a flag that cannot be set until inductor is loaded.
"""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch._inductor", "torch._dynamo")

CAPTURES = """
import sys, torch
import torchlens
from torchlens.capture.memory.capture import MemoryCapture
from torchlens.model import MemoryOptions
from torchlens.capture.trace.profiler import ProfilerCapture, ProfilerOptions
{before}
with ProfilerCapture() as p:
    (torch.randn(8, 8) @ torch.randn(8, 8)).sum()
with ProfilerCapture(ProfilerOptions(schedule=(0, 1, 1))) as s:
    for _ in range(3):
        torch.ones(4).sum()
        torchlens.step()
keep = []
with MemoryCapture(MemoryOptions(stacks=8)) as m:
    keep.append(torch.ones(1000) * 2)
trace = m.profile.snapshots["device0"].device_traces[0]
assert any(e.frames for e in trace), "allocation sites still symbolized"
assert p.profile.trace is not None and s.profile.trace is not None
print(sorted(name for name in {heavy!r} if name in sys.modules))
"""


def _run(before: str = "") -> str:
    code = CAPTURES.format(before=before, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_profiler_and_memory_captures_do_not_import_inductor():
    assert _run() == "[]"


def test_captures_still_work_once_inductor_is_imported():
    assert _run("import torch._inductor") == str(sorted(HEAVY))


PRELOAD = """
import sys, threading, time
import torch
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_cell("import torch; x = torch.randn(32, 32)")
ip.run_line_magic("load_ext", "torchlens")
from torchlens.frontends.shared import preload
started = preload._thread is not None
# a profiled cell right away: the import thread must be done before the profiler starts
from torchlens.frontends.trace import api
seen = []
real_enter = api.ProfilerCapture.__enter__
def enter(self):
    seen.append(preload._thread is not None and preload._thread.is_alive())
    return real_enter(self)
api.ProfilerCapture.__enter__ = enter
ip.run_cell_magic("torchprof", "--quiet -o r", "y = (x @ x).sum()")
print(started, seen, "bokeh" in sys.modules)
"""


def test_load_ext_warms_the_report_and_profiled_cells_wait_for_it():
    out = subprocess.run([sys.executable, "-c", PRELOAD], capture_output=True, text=True,
                         check=False, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True [False] True"


def test_no_preload_when_switched_off():
    env = {**__import__("os").environ, "TORCHLENS_NO_PRELOAD": "1"}
    code = PRELOAD.replace('print(started, seen, "bokeh" in sys.modules)', "print(started)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
