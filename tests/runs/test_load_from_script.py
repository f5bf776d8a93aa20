"""``torchlens.load(folder)`` in a plain script without an ``if __name__ ==
"__main__":`` guard: the ranks are read without the worker processes importing
the script again (a new-user walk got a screen of multiprocessing
RuntimeErrors and a BrokenProcessPool)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_script_loads_a_run_folder_without_a_main_guard(tmp_path: Path, traces_dir: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for name in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"):
        shutil.copy(traces_dir / name, run / name)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    load = f"import torchlens\nrun = torchlens.load({str(run)!r})\nprint('ranks', sorted(run.ranks))\n"
    thread = "import threading, time\nthreading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
    for i, text in enumerate((load, thread + load)):  # alone, and with a thread running
        script = tmp_path / f"analyse{i}.py"
        script.write_text(text)
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "ranks [0, 1]" in done.stdout
        assert "Traceback" not in done.stderr and "bootstrapping" not in done.stderr
