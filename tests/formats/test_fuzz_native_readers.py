"""The C readers under AddressSanitizer and UBSan: damaged inputs neither crash nor leak.

``benchmarks/fuzz_readers.py`` compiles ``scan.c`` and ``read.c`` with the
sanitizers and a driver each, and runs mutated traces and snapshots through
them. Here it runs for ~20 s with a fixed seed and must report no crash; and
a snapshot cut short at many places, one with an empty stack, and empty
APPENDS / SETITEMS each read clean (a truncated pickle once leaked the
parser's arrays; an empty stack, and items added to an empty container, passed
NULL to memcmp / memcpy). Skipped where gcc or its sanitizer runtimes are
missing.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz_readers.py"


def _module():
    spec = importlib.util.spec_from_file_location("fuzz_readers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules.setdefault("fuzz_readers", mod)
    spec.loader.exec_module(mod)
    return mod


fuzz = _module()


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    built = fuzz.build(tmp_path_factory.mktemp("drivers"))
    if isinstance(built, str):
        pytest.skip(built)
    return built


def _run(driver: Path, body: bytes, where: Path) -> tuple[int, str]:
    where.write_bytes(body)
    done = subprocess.run([str(driver), str(where)], capture_output=True, timeout=60,
                          env={**os.environ, **fuzz.ENV})
    return done.returncode, done.stderr.decode("utf-8", "replace")[-2000:]


def test_damaged_snapshots_read_clean(drivers: dict[str, Path],
                                                        tmp_path: Path) -> None:
    snap = fuzz._small_snapshot()
    whole = pickle.dumps(snap, protocol=4)
    cases = [whole] + [whole[:n] for n in range(1, len(whole), max(1, len(whole) // 24))]
    # an empty APPENDS / SETITEMS into an empty list / dict: nothing to copy
    cases += [b"\x80\x02](e.", b"\x80\x02}(u.", b"\x80\x02}(}(u(u."]
    broken = []
    for body in cases:
        rc, err = _run(drivers["snapshot"], body, tmp_path / "case")
        if rc != 0:
            broken.append((len(body), rc, err))
    assert not broken, broken[:2]


def test_a_short_fuzz_run_finds_no_crash(drivers: dict[str, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    rc = fuzz.main(["--seconds", "20", "--seed", "3", "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "crashes: 0" in printed, printed
    assert not list((tmp_path / "out").iterdir()), printed
