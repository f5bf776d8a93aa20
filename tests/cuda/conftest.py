"""The CUDA test suite: real runs on a GPU, skipped (with the reason) without one.

``scripts/gpu-check`` runs this folder on a GPU node and sets
``TORCHLENS_GPU_CHECK_OUT``: tests then keep what they made (traces,
snapshots, reports, figures) under ``$TORCHLENS_GPU_CHECK_OUT/artifacts`` so
they can be committed to ``tests/data/cuda/`` and read by the CPU tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
HAS_CUDA = torch.cuda.is_available()
NO_CUDA = ("no CUDA device: torch.cuda.is_available() is False "
           f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
           "run scripts/gpu-check on a GPU machine")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=NO_CUDA)
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.cuda)
            if not HAS_CUDA:
                item.add_marker(skip)


@pytest.fixture
def artifacts(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """Where a test keeps what it made: gpu-check's folder, else a temporary one."""
    root = os.environ.get("TORCHLENS_GPU_CHECK_OUT")
    if not root:
        return tmp_path
    out = Path(root) / "artifacts"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def figures(request: pytest.FixtureRequest):
    """Record figures a test measured: gpu-check's summary lists them by test."""
    got: dict[str, Any] = {}
    yield got
    root = os.environ.get("TORCHLENS_GPU_CHECK_OUT")
    if root and got:
        with open(Path(root) / "figures.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"test": request.node.nodeid, **got}, default=str) + "\n")


STAT_KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak",
             "reserved_bytes.all.current", "reserved_bytes.all.peak",
             "inactive_split_bytes.all.current", "active_bytes.all.current")


def keep_snapshot(path: Path, snapshot: dict, before: dict, after: dict) -> None:
    """Save a snapshot with torch's own figures beside it (``.stats.json``):
    the CPU tests check torchlens' figures of the snapshot against them."""
    import pickle

    with open(path, "wb") as fh:
        pickle.dump(snapshot, fh)
    pick = {k: {s: d.get(s) for s in STAT_KEYS} for k, d in (("before", before), ("after", after))}
    path.with_suffix(".stats.json").write_text(json.dumps(
        {**pick, "torch": torch.__version__,
         "device": torch.cuda.get_device_name(0) if HAS_CUDA else None}, indent=1))


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def run_snippet(code: str, timeout: float = 240, **env: str) -> dict[str, Any]:
    """Run ``code`` in a fresh Python (allocator settings are per process); it
    prints one JSON object on its last line, which is returned."""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(**env),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON printed\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return json.loads(lines[-1])
