"""Shared constants of the %%gpumem tests: cells and the shared snapshots (kept in ../shared)."""

from __future__ import annotations

from pathlib import Path

SNAPSHOTS = Path(__file__).resolve().parents[2].parent / "shared" / "testdata" / "snapshots"
SNAPSHOT_FILES = sorted(SNAPSHOTS.glob("*.pickle")) if SNAPSHOTS.is_dir() else []

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
history = []
"""

LEAKY = """%%gpumem -o r {opts}
for i in range(4):
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    history.append(loss)
"""

CLEAN = """%%gpumem -o r {opts}
for i in range(4):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    history.append(loss.item())
"""

