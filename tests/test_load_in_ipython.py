"""What IPython (a notebook's kernel) shows when ``torchlens.load`` cannot read
its input: the error's one line, with no torchlens frame above it (the frames
of the readers that found the input wrong say nothing the message does not)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import torchlens

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(torchlens.__file__)))
IPYTHON = Path(sys.executable).with_name("ipython")


@pytest.mark.skipif(not IPYTHON.exists(), reason="IPython is not installed beside Python")
@pytest.mark.parametrize("name, content, said", [
    ("nope", None, "PathNotFoundError: {path}: no such file or folder. Check the path"),
    ("notes.txt", b"lr 0.1\n", "InputError: {path}: not a file torchlens reads"),
])
def test_a_path_load_cannot_read_is_its_message_alone_in_ipython(
        tmp_path: Path, name: str, content: bytes | None, said: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    env = {**os.environ, "PYTHONPATH": ROOT, "IPYTHONDIR": str(tmp_path / "ipython")}
    out = subprocess.run(
        [str(IPYTHON), "--colors=NoColor", "-c", f"import torchlens; torchlens.load({str(path)!r})"],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    shown = out.stdout + out.stderr
    frames = re.findall(r"^File .*torchlens", shown, flags=re.M)
    assert frames == [], shown
    lines = [ln for ln in shown.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(said.format(path=path)), shown
