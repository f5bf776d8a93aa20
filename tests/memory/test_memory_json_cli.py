"""`torchlens report X.pickle --json`: a memory result as one JSON document with the
text view's own figures, `--category` on the command line, and
`torchlens analyze X.pickle` pointing at it instead of "not JSON"."""

from __future__ import annotations

import json

import pytest
from gpumem_fixtures import SNAPSHOTS

from torchlens.frontends import kinds
from torchlens.frontends.cli.main import main
from torchlens.frontends.memory.api import load_gpumem
from torchlens.model.units import format_bytes, format_percent

FORWARD = SNAPSHOTS / "ctx128_forward.pickle"
EOR = SNAPSHOTS / "eor_nn_with_snapshot_actions.pickle"


def _json(capsys, *argv: str) -> dict:
    assert main(["report", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("path", [FORWARD, EOR], ids=lambda p: p.name)
def test_json_has_the_text_views_figures(capsys, path):
    if not path.is_file():
        pytest.skip(f"{path} not in the shared test data")
    doc = _json(capsys, str(path))
    r = load_gpumem(str(path))
    out = kinds.text(r.profile, r.analysis())
    peak_line = next(ln for ln in out.splitlines() if ln.startswith("peak "))
    assert peak_line.startswith(f"peak {format_bytes(doc['peak']['peak_allocated'])} allocated")
    assert doc["peak_allocated"] == doc["peak"]["peak_allocated"]
    for row in doc["peak"]["by_category"]:
        line = (f"  {format_bytes(row['bytes']):>12}  {format_percent(100 * row['share']):>6}"
                f"  {row['name']}")
        assert line in out.splitlines()
    after = out.split("top allocation sites:\n", 1)[1].splitlines()
    sites = after[:after.index("")] if "" in after else after
    assert len(doc["sites"]) == len(sites) > 0
    for row, line in zip(doc["sites"], sites, strict=True):
        assert line.startswith(f"  {format_bytes(row['bytes']):>12}  {row['count']:>6}x  "
                               f"{row['site']}")
    assert set(doc) >= {"fragmentation", "leaks", "growth", "oom", "notes", "not_measured"}
    assert doc["fragmentation"]["reserved"] == r.analysis().frag.reserved
    assert doc["peak"]["categories_from"] == "inferred from stacks"


def test_category_option_on_the_command_line(capsys):
    if not EOR.is_file():
        pytest.skip("shared snapshot missing")
    doc = _json(capsys, str(EOR), "--category", "mine=.*")
    names = {row["name"]: row["source"] for row in doc["peak"]["by_category"]}
    assert names.get("mine") == "from your regexes"


def test_bad_category_regex_is_one_line(capsys):
    rc = main(["report", str(EOR), "--json", "--category", "x=[oops"])
    err = capsys.readouterr().err
    assert rc != 0 and "--category x: bad regex '[oops'" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_json_of_a_trace_says_what_it_is_for(capsys, tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 5, "pid": 1,
         "tid": 1}]}))
    rc = main(["report", str(trace), "--json"])
    err = capsys.readouterr().err
    assert rc != 0 and "--json is for memory reports" in err and "torchlens analyze" in err


def test_analyze_of_a_snapshot_points_at_report(capsys):
    rc = main(["analyze", str(EOR)])
    err = capsys.readouterr().err
    assert rc != 0 and "an allocator snapshot, not a trace" in err
    assert f"torchlens report {EOR}" in err


def test_saved_torch_categories_capture_as_json(capsys, tmp_path):
    import torch
    from torch import nn

    import torchlens

    with torchlens.gpumem(categories="torch") as r:
        model = nn.Linear(32, 32)
        opt = torch.optim.Adam(model.parameters())
        for _ in range(2):
            model(torch.randn(8, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
    path = tmp_path / "cell.tlprof"
    r.export(str(path))
    doc = _json(capsys, str(path))
    assert doc["peak_allocated"] == r.analysis().timeline.peak_allocated
    assert doc["peak"]["categories_from"].startswith("from torch's memory profiler")
    assert not doc["peak"]["categories_inferred"]
