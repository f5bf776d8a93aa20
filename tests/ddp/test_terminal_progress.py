"""%ddp_check in a terminal IPython (no kernel, no widgets): a progress line, not a widget repr."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from torchlens.model.messages import DdpHeartbeat
from torchlens.render.ddp.progress import TextProgress

ROOT = Path(__file__).resolve().parents[2]

SESSION = """\
%load_ext torchlens
import torch.distributed as dist, torch
def step(rank, world_size):
    import time
    t = torch.ones(2); dist.all_reduce(t); time.sleep(1.5)  # long enough for a heartbeat

%ddp_check step --world-size 2 --backend gloo --steps 1 --timeout 60
print("DONE")
"""


def test_terminal_ipython_prints_a_progress_line_not_the_widget_repr(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        IPYTHONDIR=str(tmp_path / "ipython"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"))
    env.pop("TORCHLENS_SERVER_URL", None)
    out = subprocess.run(
        [sys.executable, "-m", "IPython", "--quick", "--no-banner", "--simple-prompt",
         "--colors=NoColor"],
        input=SESSION, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    text = out.stdout
    assert "DONE" in text, out.stderr[-3000:]
    assert "BokehModel(" not in text and "render_bundle" not in text
    progress = [line for line in text.splitlines() if "%ddp_check: 2 ranks · rank 0 " in line]
    assert progress, text[-3000:]
    assert any("rank 1 step 0" in line for line in progress), progress
    assert all(line.rstrip().endswith(" s") for line in progress)
    # the result's text follows the last progress line (a line may repeat: take the last)
    assert "ddp_check" in text.rsplit(progress[-1], 1)[1]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_is_rewritten_in_place_and_ended():
    out = Tty()
    p = TextProgress(2, out, interval=0.0)
    p.push(DdpHeartbeat(rank=0, phase="step 0"))
    p.flush()
    p.push(DdpHeartbeat(rank=1, phase="done"))
    p.flush(force=True)
    p.close()
    written = out.getvalue()
    assert written.count("\r") == 2 and written.endswith("\n") and written.count("\n") == 1
    assert "rank 0 step 0, rank 1 done" in written.split("\r")[-1]
