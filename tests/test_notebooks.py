"""Every tutorial notebook runs top to bottom in a real kernel on a CPU-only machine."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    before = set((tmp_path).iterdir())
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [
        out for cell in nb.cells if cell.cell_type == "code"
        and "raises-exception" not in cell.metadata.get("tags", [])
        for out in cell.get("outputs", []) if out.output_type == "error"
    ]
    assert not errors, errors
    left = set(tmp_path.iterdir()) - before
    assert not left, f"the tutorial leaves files beside itself: {sorted(p.name for p in left)}"
    # every magic cell left HTML that a saved notebook shows without a kernel
    magic_cells = [c for c in nb.cells if c.cell_type == "code"
                   and c.source.startswith("%%") and "--quiet" not in c.source]
    for cell in magic_cells:
        assert any("text/html" in o.get("data", {}) for o in cell.outputs), cell.source


#: what a new user reads the tutorials for: each must appear in a tutorial's code
COVERED = ("%%torchprof", "%%gpumem", "%ddp_check", "--profile", "torchlens.load(",
           "torchlens report", "torchlens run", "torchlens.watch(", "torchlens diff")


def test_the_tutorials_cover_every_command_and_the_readme_lists_them() -> None:
    code = "\n".join(c.source for p in NOTEBOOKS for c in nbformat.read(p, as_version=4).cells
                     if c.cell_type == "code")
    missing = [what for what in COVERED if what not in code]
    assert not missing, f"no tutorial runs {missing}"
    readme = (NOTEBOOKS[0].parents[1] / "README.md").read_text(encoding="utf-8")
    unlisted = [p.name for p in NOTEBOOKS if f"notebooks/{p.name}" not in readme]
    assert not unlisted, f"README does not list the tutorials {unlisted}"
