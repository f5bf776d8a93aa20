"""On a terminal the job's output goes to ``command.log``; what torchlens
itself says in a rank (one line starting ``torchlens:``, e.g. an unsupported
transformers: the integration skipped, which version to use) must reach the
terminal too, once however many ranks said it. Real torchrun, CPU, gloo; a
stand-in ``transformers`` 4.30.2 package (its ``trainer`` module is what the
rank's import hook waits for)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO, TORCHRUN, env, free_port

pytestmark = pytest.mark.timeout(300)


def test_an_old_transformers_warning_is_shown_once_on_the_terminal(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '4.30.2'\n")
    (fake / "trainer.py").write_text("DEFAULT_CALLBACKS = []\n")
    script = tmp_path / "job.py"
    script.write_text("import transformers.trainer\nprint('job done', flush=True)\n")
    port = free_port()
    command = [TORCHRUN, "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job{port}", str(script)]
    out = tmp_path / "run"
    # tty=True: the command's output goes to command.log, as on a terminal
    code = ("import sys\nfrom torchlens.frontends.ranks.command import run\n"
            f"sys.exit(run({command!r}, out={str(out)!r}, tty=True))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=240,
                          env=env(PYTHONPATH=f"{tmp_path / 'site'}:{REPO}"))
    assert done.returncode == 0, done.stdout + done.stderr
    log = (out / "command.log").read_text()
    assert log.count("transformers 4.30.2 is older than the 4.40") == 2, log  # one per rank
    said = [line for line in done.stdout.splitlines()
            if "transformers 4.30.2 is older than the 4.40" in line]
    assert len(said) == 1, done.stdout
    assert "pip install 'transformers>=4.40'" in said[0]
