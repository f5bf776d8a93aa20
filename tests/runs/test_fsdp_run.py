"""An FSDP2 job under ``torchlens run``: per rank, the run report and
``torchlens report``'s output say the parameters' sharded and gathered bytes,
the gathered parameters alive at once (and which modules), and the optimizer
state, each said measured or not. Real torchrun, 2 gloo ranks, a script that
never imports torchlens (``no_import_fsdp_train.py``); the expected bytes are
worked out here from the layers' shapes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markupsafe import escape

from tests.ranks.helpers import Collector, free_port, report, torchrun_args
from tests.runs.no_import_fsdp_train import SIZES

pytestmark = pytest.mark.timeout(300)
SCRIPT = Path(__file__).with_name("no_import_fsdp_train.py")
WORLD = 2
F32 = 4
#: each layer's parameters (weight in x out, bias out), float32
LAYER_BYTES = {f"layers.{i}": (i_ * o + o) * F32 for i, (i_, o) in enumerate(SIZES)}
ALL = sum(LAYER_BYTES.values())
SHARD = ALL // WORLD  # every dimension even: each rank holds half of every parameter
PARAMS = 2 * len(SIZES)
#: Adam: two moments of the rank's shard, and one float32 step counter per parameter
ADAM = 2 * SHARD + PARAMS * F32


def _run(tmp_path: Path, **extra: str) -> tuple[str, str]:
    out = tmp_path / "run"
    c = Collector(out, torchrun_args(1, WORLD, free_port(), SCRIPT), **extra)
    try:
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    return report(out, tmp_path)


def _ranks_of(line: str) -> set[int]:
    """The ranks a ``rank 0: FSDP: ...`` or ``ranks 0-1: FSDP: ...`` line speaks for."""
    got = re.match(r"ranks? (\d+)(?:-(\d+))?: FSDP: ", line)
    return set(range(int(got[1]), int(got[2] or got[1]) + 1)) if got else set()


def _b(n: int) -> str:
    assert n < 1024  # the model is small enough that every figure is shown in bytes
    return f"{n} B"


def test_an_fsdp_job_run_report_shows_each_rank_s_shards_gathered_peak_and_adam_state(
        tmp_path: Path) -> None:
    said, page = _run(tmp_path)
    for r in range(WORLD):
        line = next((ln for ln in said.splitlines() if r in _ranks_of(ln)), None)
        assert line is not None, said
        assert f"{_b(SHARD)} sharded of {_b(ALL)} gathered" in line, line
        assert f"optimizer state {_b(ADAM)} (measured: Adam's state tensors" in line, line
        assert "allocator peak not measured on CPU" in line, line
        got = re.search(r"gathered at once (\d+) B \(measured: gathered parameters alive at "
                        r"once; (?:\d+ modules together, (.+?): a prefetch|([\w.]+)\))", line)
        assert got, line
        modules = (got[2] or got[3]).split(" + ")
        assert set(modules) <= set(LAYER_BYTES), line
        # FSDP2 prefetches the next layer's all_gather in backward: two at once
        assert len(modules) == 2, line
        assert int(got[1]) == sum(LAYER_BYTES[m] for m in modules), line
        # the report page says the same, in the FSDP section
        assert str(escape(line)) in page, line
    assert "FSDP memory per rank" in page


def test_a_job_without_fsdp_gets_no_fsdp_section(tmp_path: Path) -> None:
    said, page = _run(tmp_path, TL_PLAIN="1")
    assert "FSDP" not in said and "FSDP memory per rank" not in page, said


def test_an_fsdp1_job_shows_each_rank_s_flat_shard_not_the_gathered_flat_parameter(
        tmp_path: Path) -> None:
    # FSDP1 (FullyShardedDataParallel, use_orig_params): the shard was read after
    # the first unshard, when the flat parameter holds the gathered data, and said
    # "344 B sharded of 344 B gathered"
    said, page = _run(tmp_path, TL_FSDP1="1")
    for r in range(WORLD):
        line = next((ln for ln in said.splitlines() if r in _ranks_of(ln)), None)
        assert line is not None, said
        assert f"{_b(SHARD)} sharded of {_b(ALL)} gathered" in line, line
        got = re.search(r"gathered at once (\d+) B \(measured: gathered parameters alive at "
                        r"once; (?:\d+ modules together, (.+?): a prefetch|([\w.]+)\))", line)
        assert got, line
        modules = (got[2] or got[3]).split(" + ")
        assert set(modules) <= set(LAYER_BYTES), line  # the user's names, not FSDP1's wrappers
        assert int(got[1]) == sum(LAYER_BYTES[m] for m in modules), line
        # Adam: two moments of the shard, and a step counter for each parameter that
        # has elements in this rank's shard (FSDP1 cuts the flat parameter anywhere)
        state = int(re.search(r"optimizer state (\d+) B \(measured", line)[1])
        assert (state - 2 * SHARD) % F32 == 0 and 1 <= (state - 2 * SHARD) // F32 <= PARAMS, line
        assert str(escape(line)) in page, line
