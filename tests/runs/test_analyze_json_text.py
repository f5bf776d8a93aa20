"""``torchlens analyze --json`` prints the text ``json.dumps(doc, indent=1)``
printed before it was made faster: a script diffing two runs'
documents must see no change in a single character."""

from __future__ import annotations

import json
import math

import pytest

from torchlens.frontends.cli.main import json_text, main
from torchlens.frontends.runs.api import load_run


def _reference(doc):
    return json.dumps(doc, indent=1, allow_nan=False, default=str)


def test_analyze_json_is_byte_for_byte_the_indented_dumps(tmp_path, traces_dir, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for r in (0, 1):
        name = f"sampled_rank-{r}.json.gz"
        (run_dir / name).symlink_to(traces_dir / name)
    (run_dir / "notes.txt").write_text("not a trace")  # an "ignored" entry
    assert main(["analyze", str(run_dir), "--json", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert out == _reference(load_run(str(run_dir), workers=1).to_json()) + "\n"


def test_odd_values_print_as_json_dumps_prints_them():
    doc = {"empty": [], "none": {}, "nested": [{}, [], [[]]], "ascii": "µs \"q\" \\ \n é \u2028",
           "floats": [1e-05, 1.5e300, -0.0, 0.1 + 0.2, 3.0], "big": 12345678901234567890,
           "flags": [True, False, None], "path": tmp_path_like()}
    assert json_text(doc) == _reference(doc)
    with pytest.raises(ValueError):  # a NaN is refused as before, never printed
        json_text({"x": math.nan})


def tmp_path_like():
    from pathlib import PurePosixPath

    return PurePosixPath("/run/rank0.json")  # not JSON: default=str, as before
