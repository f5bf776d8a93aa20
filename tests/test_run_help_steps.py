"""What ``torchlens run`` says about steps matches what it does (docs/MULTINODE.md
"No code change"): a torchrun rank attaches when it starts, without importing
torchlens, and its steps come from ``torchlens.step()`` where the script calls
it, else from the optimizer's steps or a framework's callbacks. Neither the
help, the README nor a diff's note says the loop must call ``torchlens.step()``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchlens.frontends.cli.main import main
from torchlens.model.payloads import RunDiff, StepTime
from torchlens.render.runs.diff import _step_source

REPO = Path(__file__).resolve().parents[1]
UNTRUE = ("calls torchlens.step()", "calls `torchlens.step()`", "first torchlens.step()",
          "every torchlens.step()")


def test_the_run_help_says_ranks_attach_at_start_without_a_code_change(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    said = re.sub(r"\s+", " ", capsys.readouterr().out)
    for words in UNTRUE:
        assert words not in said, words
    assert "attaches when it starts" in said and "no code change" in said
    assert "optimizer" in said


def test_the_readme_row_of_torchlens_run_does_not_ask_for_torchlens_step() -> None:
    row = next(line for line in (REPO / "README.md").read_text().splitlines()
               if line.startswith("| `torchlens run "))
    for words in UNTRUE:
        assert words not in row, words


def test_a_diffs_note_of_step_records_says_every_recorded_step() -> None:
    said = _step_source(RunDiff(step_time=StepTime(source="step records", a_steps=300,
                                                   b_steps=280)))
    assert "torchlens.step()" not in said
    assert "every recorded step of every rank" in said, said
