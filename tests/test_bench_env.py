"""The benchmarks run on a fresh machine: no benchmark names one machine's folders,
``benchmarks/paths.py`` follows the options and environment variables it documents,
and ``scripts/bench-env`` makes the peers' environment with a pinned CPU torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
SCRIPT = REPO / "scripts" / "bench-env"
# an absolute folder of one machine: a checkout or venv under /work, a named /tmp folder
MACHINE_PATH = re.compile(r"/work/|/tmp/[A-Za-z]")


def test_no_benchmark_or_results_command_names_a_machine_folder() -> None:
    # HISTORY.md is the record of past runs, kept as written
    files = [*BENCH.glob("*.py"), BENCH / "RESULTS.md"]
    found = [f"{p.name}:{i}: {line.strip()[:80]}"
             for p in files
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if MACHINE_PATH.search(line)]
    assert not found, "\n".join(found)


@pytest.fixture
def bench_paths(monkeypatch: pytest.MonkeyPatch):
    for name in ("TORCHLENS_TESTDATA", "TORCHLENS_TRACES", "TORCHLENS_BENCH_PYTHON",
                 "TORCHLENS_BENCH_VENV", "TORCHLENS_BENCH_NVD_PYTHON", "TORCHLENS_MOSAIC",
                 "TORCHLENS_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(BENCH))
    import paths

    return paths


def test_paths_default_to_places_beside_the_checkout(bench_paths) -> None:
    assert bench_paths.REPO == REPO
    assert bench_paths.traces() == REPO.parent / "shared" / "testdata" / "traces"
    assert bench_paths.snapshots() == REPO.parent / "shared" / "testdata" / "snapshots"
    assert bench_paths.bench_venv() == REPO / ".bench-venv"


def test_paths_follow_options_then_environment(bench_paths, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TORCHLENS_TESTDATA", str(tmp_path / "data"))
    assert bench_paths.traces() == tmp_path / "data" / "traces"
    monkeypatch.setenv("TORCHLENS_TRACES", str(tmp_path / "t"))
    assert bench_paths.traces() == tmp_path / "t"

    venv = tmp_path / "venv"
    monkeypatch.setenv("TORCHLENS_BENCH_VENV", str(venv))
    assert bench_paths.peer_python() == sys.executable  # no venv there yet
    assert bench_paths.mosaic_checkout() is None
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / "src" / "mosaic").mkdir(parents=True)
    assert bench_paths.peer_python() == str(venv / "bin" / "python")
    assert bench_paths.mosaic_checkout() == str(venv / "src" / "mosaic")
    monkeypatch.setenv("TORCHLENS_BENCH_PYTHON", "/opt/peers/python")
    assert bench_paths.peer_python() == "/opt/peers/python"
    assert bench_paths.peer_python("given/python") == "given/python"

    scratch = bench_paths.scratch("x")
    assert scratch.is_dir() and not any(scratch.iterdir())
    scratch.rmdir()


def _bench_env(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)


def test_bench_env_dry_run_pins_cpu_torch_and_makes_nothing(tmp_path: Path) -> None:
    venv, nvd, mosaic = tmp_path / "peers", tmp_path / "nvd", tmp_path / "mosaic-copy"
    mosaic.mkdir()
    got = _bench_env("--dry-run", "--venv", str(venv), "--nvd-venv", str(nvd),
                     "--mosaic", str(mosaic))
    assert got.returncode == 0, got.stderr
    commands = [line for line in got.stdout.splitlines() if line.startswith("+ ")]
    installs = [c for c in commands if " pip install " in c]
    assert any(c.endswith(" torch==2.13.0") for c in installs), installs
    assert not any(re.search(r" torch(\s|$)", c) for c in installs), installs  # never bare
    for peer in ("HolisticTraceAnalysis==", "traceml-ai==", "transformers==",
                 "jupyterlab-nvdashboard=="):
        assert any(peer in c for c in installs), (peer, installs)
    assert any(f"cp -R {mosaic} {venv}/src/mosaic" in c for c in commands), commands
    assert not venv.exists() and not nvd.exists()


def test_bench_env_says_how_to_use_it_and_refuses_unknown_parts() -> None:
    got = _bench_env("--help")
    assert got.returncode == 0 and "--mosaic" in got.stdout and "--dry-run" in got.stdout
    bad = _bench_env("--dry-run", "--only", "base,gpu")
    assert bad.returncode == 2 and "gpu" in bad.stderr
