"""torch's own C++ lines for torchlens' captures are not shown; the user's output is.

torch 2.13 prints ``USDT:... profiler_start`` / ``profiler_stop`` on every
profiler start and stop, and ``CPUAllocator.cpp ... Memory block of unknown
size`` for each tensor a recorded cell frees that was made before it. The
checks run in a fresh process and read its real stderr (file descriptor 2),
where those lines land.
"""

from __future__ import annotations

import subprocess
import sys

CELLS = r'''
import os, sys, warnings
import torch
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_cell("import os, sys, warnings, torch; old = [torch.ones(1000) for _ in range(4)]")
ip.run_line_magic("load_ext", "torchlens")
body = """
os.write(2, b"user fd line" + bytes([10]))
print("user print line", file=sys.stderr)
warnings.warn("user warning line")
del old[:]
y = (torch.randn(16, 16) @ torch.randn(16, 16)).sum()
"""
ip.run_cell_magic("torchprof", "--quiet --memory", body)
ip.run_cell("old = [torch.ones(1000) for _ in range(4)]")
ip.run_cell_magic("gpumem", "--quiet", body)
ip.run_cell_magic("torchprof", "--quiet --schedule 1,1,1", "for _ in range(4):\n    torch.ones(4).sum()\n    import torchlens; torchlens.step()\n")
'''


def test_captures_hide_torchs_lines_and_keep_the_users():
    out = subprocess.run([sys.executable, "-c", CELLS], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    err = out.stderr
    assert "USDT:" not in err and "SyncActivityProfilerHandler" not in err, err
    assert "Memory block of unknown size" not in err, err
    for line in ("user fd line", "user print line", "UserWarning: user warning line"):
        assert err.count(line) == 2, (line, err)  # once per magic, in the order written
    assert err.index("user fd line") < err.index("user print line")


def test_demo_prints_no_warning(tmp_path):
    out = subprocess.run([sys.executable, "-m", "torchlens", "demo", "--steps", "2", "-o",
                          str(tmp_path / "d.html")], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Warning" not in out.stderr and "USDT" not in out.stderr, out.stderr
