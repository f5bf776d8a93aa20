"""Bad input read as one line; device events of an unknown kind said, not hidden.

A number too large for a float in a trace, or an infinite
``--capacity``, used to end in a msgspec / OverflowError traceback; an
accelerator's events that torchlens does not know (MTIA here) were silently
counted as nothing, so the report showed 99.5% CPU time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchlens.formats.kineto import ingest_bytes, load_trace
from torchlens.frontends import kinds
from torchlens.frontends.cli.main import main
from torchlens.model import InputError, Profile

SNAPSHOT = (Path(__file__).resolve().parents[2].parent / "shared" / "testdata" / "snapshots"
            / "eor_nn_with_snapshot_actions.pickle")


@pytest.mark.parametrize("number", ["1e400", "9" * 5000, "-1e999"])
def test_a_number_too_large_is_one_line_naming_field_and_file(tmp_path, capsys, number):
    path = tmp_path / "huge.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, '
                    f'"tid": 1, "ts": 1, "dur": {number}}}]}}')
    with pytest.raises(InputError, match=r'huge\.json: field "dur" holds .*too large'):
        load_trace(path)
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "huge.json" in err[0] and '"dur"' in err[0]


@pytest.mark.parametrize("capacity", ["inf", "1e400GiB", "nan"])
def test_simulate_refuses_an_infinite_capacity_in_one_line(capsys, capacity):
    assert main(["simulate", str(SNAPSHOT), "--capacity", capacity]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("torchlens: error: capacity")


def _mtia_trace() -> bytes:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
               "ts": 0, "dur": 10}]
    events += [{"ph": "X", "cat": "mtia_ccp_events", "name": f"fused_kernel_{i}",
                "pid": "MTIA 0", "tid": 3, "ts": 10 + 100 * i, "dur": 90} for i in range(20)]
    return json.dumps({"traceEvents": events}).encode()


def test_device_events_of_an_unknown_kind_are_named(tmp_path):
    trace = ingest_bytes(_mtia_trace(), "mtia.json")
    profile = Profile(kind="trace", traces={"main": trace}, created_at=0.0)
    html = kinds.report_html(profile)
    assert 'id="not-understood-main"' in html
    assert "20 events of categories torchlens does not know: &#39;mtia_ccp_events&#39; (20)" in html
    text = kinds.text(profile)
    assert "not understood: 20 events of categories torchlens does not know" in text


def test_known_traces_have_nothing_not_understood(traces_dir):
    trace = load_trace(traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz")
    html = kinds.report_html(Profile(kind="trace", traces={"main": trace}))
    assert "not-understood" not in html
