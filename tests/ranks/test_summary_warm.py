"""The summary thread imports what the first summary needs as soon as a rank
attaches, during the job's set-up (the step after the first
profiled step was 3-10x its neighbours, partly that import taking the
interpreter from the training thread). Checked in a fresh interpreter, with
no step taken."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from .helpers import REPO, env

SCRIPT = textwrap.dedent("""
    import sys, tempfile, time
    import torch
    from torchlens.capture.ranks.stepper import RankProfiler
    from torchlens.frontends.ranks.rank_side import summarize_file

    wanted = "torchlens.analysis.ranks.summary"
    assert wanted not in sys.modules  # nothing before the rank attaches
    rp = RankProfiler(rank=0, run_dir=tempfile.mkdtemp(), device=torch.device("cpu"),
                      every=10_000, summarize=summarize_file)
    rp.start()
    deadline = time.monotonic() + 30
    while wanted not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.01)
    print("imported" if wanted in sys.modules else "not imported", rp.errors)
    rp.finish(setup_is_step=False)
""")


def test_the_summary_code_is_imported_when_the_rank_starts_not_in_a_step() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          cwd=REPO, env=env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "imported []", done.stdout + done.stderr[-2000:]
