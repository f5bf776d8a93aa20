"""The README's complete ``train(rank, world_size)`` runs under ``%ddp_check --profile``
as the README says: the code block is read from README.md,
so the README cannot drift from what works."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _train_block() -> str:
    found = [b for b in _blocks("python") if "def train(rank, world_size)" in b]
    assert len(found) == 1, "README.md shows one complete train(rank, world_size)"
    return found[0]


def test_the_readme_says_once_how_to_run_torchlens_from_the_venv() -> None:
    assert README.count("source .venv/bin/activate") == 1
    top = README.index("source .venv/bin/activate")
    assert top < README.index("## What it is")  # before any bare `torchlens` command
    first_bare = re.search(r"(?<![/\w])torchlens (demo|report|analyze|diff|run)\b", README)
    assert first_bare is not None and first_bare.start() > top


@pytest.mark.timeout(300)
def test_the_readme_train_function_runs_under_ddp_check_profile(tmp_path: Path) -> None:
    from torchlens.frontends.ddp.api import ddp_check

    code = _train_block()
    # the magic the README runs right after it names this function
    assert "%ddp_check train --world-size 4 --profile --steps 60" in README
    module = types.ModuleType("readme_example")  # not importable: travels by value
    exec(compile(code, "README.md", "exec"), module.__dict__)  # noqa: S102 - our README
    res = ddp_check(module.train, world_size=2, backend="gloo", profile=True, steps=6,
                    live=False, run_dir=str(tmp_path / "run"))
    assert res.records.outcome == "finished"
    assert [len(s) for s in res.records.profiling.steps] == [6, 6]  # --steps ended each rank
    steps = res.steps()  # what the README's next line shows
    assert sorted(set(steps["rank"])) == [0, 1] and len(steps) == 12
