"""``torchlens run -- accelerate launch --cpu --num_processes N``: Accelerate
starts those processes without torchrun, so they do not attach; torchlens run
says so in one line with what to run instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ranks.helpers import BIN, Collector

pytest.importorskip("accelerate")
pytestmark = pytest.mark.timeout(200)


def test_torchlens_run_says_the_cpu_ranks_will_not_attach(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("print('the job ran')\n")
    c = Collector(tmp_path / "run", [str(BIN / "accelerate"), "launch", "--cpu",
                                     "--num_processes", "2", "--num_machines", "1",
                                     "--mixed_precision", "no", "--dynamo_backend", "no",
                                     str(script)], HF_HOME=str(tmp_path / "hf"))
    try:
        c.wait()
    finally:
        c.kill()
    # once before the job starts (the verdict at its end says it again, as the why)
    said = [line for line in c.lines
            if "accelerate launch --cpu" in line and not line.startswith("verdict:")]
    assert len(said) == 1, c.output
    assert "will not attach" in said[0] and "torchrun --nproc-per-node 2" in said[0]
    assert "accelerate launch --multi_gpu --num_processes 2" in said[0]


@pytest.mark.parametrize("command", [
    ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "t.py"],
    ["accelerate", "launch", "--cpu", "--num_processes=1", "t.py"],
    ["accelerate", "launch", "--num_processes", "2", "t.py", "--cpu"],  # the script's flag
    ["torchrun", "--nproc-per-node", "2", "t.py"],
])
def test_other_launches_get_no_line(command: list[str]) -> None:
    from torchlens.frontends.ranks.launchers import accelerate_cpu

    assert accelerate_cpu(command) is None


def test_the_equals_form_is_read() -> None:
    from torchlens.frontends.ranks.launchers import accelerate_cpu

    said = accelerate_cpu(["/usr/bin/accelerate", "launch", "--cpu", "--num_processes=4", "t.py"])
    assert said is not None and "\n" not in said and "its 4 processes" in said
