"""``scripts/gpu-check`` on a machine without a GPU: one line, the suite collected, exit 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: gpu-check runs it")
def test_gpu_check_without_gpu_says_so_and_collects_the_suite(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-check"), str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA GPU here"), done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"] and not summary["gpu"]
    assert summary["collected"] >= 10  # one test per CUDA path at least


def test_gpu_check_refuses_wheels_made_for_another_python(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    # a compiled wheel for a Python this one is not
    other = "cp39" if sys.version_info[:2] != (3, 9) else "cp310"
    (wheels / f"msgspec-0.1-{other}-{other}-manylinux_2_17_x86_64.whl").write_bytes(b"PK")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-check"),
                           str(tmp_path / "out"), "--wheels", str(wheels)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "do not install on this Python" in done.stderr and "scripts/gpu-wheels" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("out", ["/proc/no/such", "FILE/below"])
def test_gpu_check_an_output_folder_it_cannot_write_is_one_line(tmp_path: Path, out: str) -> None:
    target = out.replace("FILE", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("x")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-check"), target],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("gpu-check: cannot write results to") and "Traceback" not in done.stderr


def test_gpu_check_a_missing_test_path_is_named_and_leaves_no_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-check"), str(out),
                           "--tests", "tests/cuda/nope.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "tests/cuda/nope.py: no such test file" in done.stderr
    assert not out.exists()


def test_gpu_wheels_help_and_a_python_it_cannot_serve() -> None:
    script = str(REPO / "scripts" / "gpu-wheels")
    shown = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: scripts/gpu-wheels DIR")
    old = subprocess.run([script, "/tmp/never-made", "2.7"], capture_output=True, text=True,
                         timeout=30)
    assert old.returncode == 2 and "needs Python 3.10 or later" in old.stderr
