"""scripts/setup says what it is doing (it printed nothing
for four and a half minutes). Run against a stand-in .venv whose ``python``
and ``pip`` do nothing, so the test checks the script's own words in seconds."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_setup_names_each_long_step(tmp_path):
    (tmp_path / "scripts").mkdir()
    for name in ("setup", "setup-browser"):
        shutil.copy(REPO / "scripts" / name, tmp_path / "scripts" / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    stub = bin_dir / "python"
    # "import torch" fails, so the torch step runs; everything else succeeds silently
    stub.write_text('#!/bin/sh\n[ "$*" = "-c import torch" ] && exit 1\nexit 0\n')
    stub.chmod(0o755)
    (bin_dir / "activate").write_text(f'PATH="{bin_dir}:$PATH"\n')
    out = subprocess.run(["bash", str(tmp_path / "scripts" / "setup")], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stdout.splitlines() if line.startswith("setup: ")]
    assert any("torch 2.13.0" in line for line in said), out.stdout
    assert any("JupyterLab extension" in line for line in said), out.stdout
