"""Where the benchmarks find their data, interpreters and scratch folders.

Every benchmark asks here instead of naming one machine's folders, so a fresh
clone runs them as RESULTS.md writes them. Each lookup takes the benchmark's
command-line option first, then an environment variable, then a place relative
to this checkout:

- shared test data: ``$TORCHLENS_TESTDATA`` (the variable the tests read), else
  ``../shared/testdata`` beside the checkout (where CI puts it); traces alone
  may come from ``$TORCHLENS_TRACES``.
- the peers' Python (HTA, TraceML, transformers): ``--peer-python``, else
  ``$TORCHLENS_BENCH_PYTHON``, else the venv ``scripts/bench-env`` makes
  (``$TORCHLENS_BENCH_VENV``, default ``.bench-venv`` in the checkout).
- nvdashboard's Python (its own venv, so its Jupyter server loads no
  torchlens extension): ``--nvd-python``, else ``$TORCHLENS_BENCH_NVD_PYTHON``,
  else ``.bench-venv-nvd`` in the checkout when ``scripts/bench-env`` made it.
- a Mosaic checkout: ``--mosaic``, else ``$TORCHLENS_MOSAIC``, else the copy
  ``scripts/bench-env`` fetched into the bench venv (``src/mosaic``).
- torchlens' own Python, where a benchmark runs torchlens in another
  interpreter than its own: ``--torchlens-python``, else ``$TORCHLENS_PYTHON``,
  else the checkout's ``.venv``, else the running interpreter.
- scratch folders: ``tempfile`` (``$TMPDIR``), never a fixed path.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

#: the checkout this benchmarks folder belongs to
REPO = Path(__file__).resolve().parents[1]


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def testdata() -> Path:
    """The shared recorded data (traces, snapshots): ``$TORCHLENS_TESTDATA`` or
    ``../shared/testdata`` beside the checkout."""
    given = os.environ.get("TORCHLENS_TESTDATA")
    return Path(given) if given else REPO.parent / "shared" / "testdata"


def traces() -> Path:
    """The shared Kineto traces: ``$TORCHLENS_TRACES`` or ``testdata()/traces``."""
    given = os.environ.get("TORCHLENS_TRACES")
    return Path(given) if given else testdata() / "traces"


def snapshots() -> Path:
    """The shared allocator snapshots (``*.pickle``)."""
    return testdata() / "snapshots"


def bench_venv() -> Path:
    """The peers' venv ``scripts/bench-env`` makes: ``$TORCHLENS_BENCH_VENV`` or
    ``.bench-venv`` in the checkout."""
    given = os.environ.get("TORCHLENS_BENCH_VENV")
    return Path(given) if given else REPO / ".bench-venv"


def peer_python(given: str | None = None) -> str:
    """The interpreter that has the peers installed: ``given`` (``--peer-python``),
    ``$TORCHLENS_BENCH_PYTHON``, the bench venv's, else the running one."""
    if given:
        return given
    if os.environ.get("TORCHLENS_BENCH_PYTHON"):
        return os.environ["TORCHLENS_BENCH_PYTHON"]
    venv = _venv_python(bench_venv())
    return str(venv) if venv.exists() else sys.executable


def nvd_python(given: str | None = None) -> str | None:
    """nvdashboard's interpreter, or None when none is given or made (then the
    benchmark leaves nvdashboard out)."""
    if given:
        return given
    if os.environ.get("TORCHLENS_BENCH_NVD_PYTHON"):
        return os.environ["TORCHLENS_BENCH_NVD_PYTHON"]
    venv = _venv_python(REPO / ".bench-venv-nvd")
    return str(venv) if venv.exists() else None


def mosaic_checkout(given: str | None = None) -> str | None:
    """A checkout of facebookresearch/mosaic, or None when there is none."""
    if given:
        return given
    if os.environ.get("TORCHLENS_MOSAIC"):
        return os.environ["TORCHLENS_MOSAIC"]
    fetched = bench_venv() / "src" / "mosaic"
    return str(fetched) if fetched.is_dir() else None


def torchlens_python(given: str | None = None) -> str:
    """The interpreter to run torchlens with, when a benchmark runs it apart
    from its own: ``given``, ``$TORCHLENS_PYTHON``, the checkout's ``.venv``,
    else the running one."""
    if given:
        return given
    if os.environ.get("TORCHLENS_PYTHON"):
        return os.environ["TORCHLENS_PYTHON"]
    venv = _venv_python(REPO / ".venv")
    return str(venv) if venv.exists() else sys.executable


def scratch(prefix: str) -> Path:
    """A new empty folder under the system's temporary folder; the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=f"torchlens-{prefix}-"))
