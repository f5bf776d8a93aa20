"""Every package pyproject.toml makes a user install is one torchlens uses.

holoviews and panel were installed by every user and imported by nothing;
this keeps the next unused dependency out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[1]
#: distribution name -> the module it installs, where the two differ
MODULE = {"ipython": "IPython", "nvidia-ml-py": "pynvml"}
#: dependencies torchlens needs without importing them, and why
NOT_IMPORTED = {
    "jupyterlab": "the application the sidebar extension (jupyter_ext/) runs in; "
                  "`scripts/lab` starts it",
}


def _dependencies() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0].lower() for spec in project["dependencies"]]


def test_every_dependency_is_imported_by_torchlens() -> None:
    sources = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "torchlens").rglob("*.py"))
    unused = []
    for name in _dependencies():
        module = MODULE.get(name, name.replace("-", "_"))
        if not re.search(rf"^\s*(import|from)\s+{re.escape(module)}(\.|\s|$)", sources, re.M):
            unused.append(name)
    assert sorted(unused) == sorted(NOT_IMPORTED), (
        f"dependencies nothing in torchlens/ imports: {sorted(set(unused) - set(NOT_IMPORTED))}; "
        "use them or drop them from pyproject.toml (and say why in docs/ARCHITECTURE.md)")
