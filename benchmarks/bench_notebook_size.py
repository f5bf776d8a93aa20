"""How much a saved notebook grows per displayed torchlens result (issue 11 item 17).

Runs a notebook of ``--cells`` ``%%torchprof`` cells in a real kernel
(nbclient), saves it, and prints the saved file's growth per result next to
the size of one plain HTML report (BokehJS inline, as ``--export x.html``
writes it): each notebook output carries its own copy of the report in an
iframe, so the saved notebook still renders without a kernel.

Run: ``python benchmarks/bench_notebook_size.py [--cells 10]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

SETUP = "%load_ext torchlens\nimport torch\nx = torch.randn(64, 64)"
CELL = "%%torchprof\nfor _ in range(3):\n    y = (x @ x).relu().sum()"


def saved_size(cells: int, folder: Path) -> int:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP)]
    nb.cells += [nbformat.v4.new_code_cell(CELL) for _ in range(cells)]
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    path = folder / f"n{cells}.ipynb"
    nbformat.write(nb, path)
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        base, full = saved_size(0, folder), saved_size(args.cells, folder)
        import torch

        import torchlens

        x = torch.randn(64, 64)
        with torchlens.torchprof() as r:
            for _ in range(3):
                (x @ x).relu().sum()
        report = len(r.export(str(folder / "r.html")) and (folder / "r.html").read_bytes())
    per = (full - base) / args.cells
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  load {os.getloadavg()[0]:.2f}")
    print(f"saved notebook: {base:,} B empty, {full:,} B with {args.cells} results")
    print(f"growth per result {per / 1e6:.2f} MB; one plain report {report / 1e6:.2f} MB; "
          f"ratio {per / report:.2f}")


if __name__ == "__main__":
    main()
