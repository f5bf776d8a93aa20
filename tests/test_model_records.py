"""Step records (``model.records``) keep the JSON that run folders, the store
and ``.tlprof`` files already hold; every live consumer is a ``RankFeed``."""

from __future__ import annotations

import json

import pytest

from torchlens.capture.channel import protocol
from torchlens.model.feed import RankFeed
from torchlens.model.payloads import DdpRun, RankProfiling, from_json, to_json
from torchlens.model.records import StepMemory, StepRecord, decode_batch, records_from

# Lines as earlier versions wrote them: %ddp_check --profile's steps.jsonl on a
# CPU rank (json.dumps of the stepper's dict) and on a CUDA rank, and `torchlens
# run`'s, which adds the start of the rank ("restart") to each.
CPU_LINE = ('{"step": 12, "t0": 1790857026.1, "t1": 1790857026.17, "phases": {"data": 0.031, '
            '"forward": 0.012, "backward": 0.02, "optimizer": 0.002, "collective": 0.0}, '
            '"profiled": false, "window": false, "mem": {"rss": 412000000, "allocated": null, '
            '"reserved": null, "inactive_split": null, "largest_free": null, "source": "rss"}, '
            '"tl_s": 2.1e-05}')
CUDA_LINE = ('{"step": 9, "t0": 1790857026.5, "t1": 1790857026.6, "phases": {"data": 0.001, '
             '"forward": 0.01, "backward": 0.05, "optimizer": 0.002, "collective": null}, '
             '"profiled": true, "window": false, "mem": {"rss": 2147483648, "allocated": '
             '1048576, "reserved": 2097152, "inactive_split": 4096, "largest_free": null, '
             '"source": "cuda"}, "tl_s": 0.001234}')
RUN_LINES = [CPU_LINE[:-1] + ', "restart": 0}', CUDA_LINE[:-1] + ', "restart": 2}']


@pytest.mark.parametrize("line", [CPU_LINE, CUDA_LINE, *RUN_LINES])
def test_a_step_record_reads_and_writes_the_line_an_older_run_folder_holds(line):
    rec = StepRecord.from_json(line)
    assert rec.to_json() == line
    assert rec.to_dict() == json.loads(line)


def test_the_fields_read_as_the_dict_said():
    cpu, cuda = StepRecord.from_json(CPU_LINE), StepRecord.from_json(CUDA_LINE)
    assert (cpu.step, cpu.t0, cpu.t1, cpu.profiled, cpu.window) == (
        12, 1790857026.1, 1790857026.17, False, False)
    assert cpu.phases["data"] == 0.031 and cpu.tl_s == 2.1e-05
    assert cpu.mem == StepMemory(rss=412000000, source="rss")
    assert cuda.phases["collective"] is None and cuda.mem.allocated == 1048576
    # the start of the rank: 0 when the line does not say
    assert [StepRecord.from_json(x).start for x in (CPU_LINE, *RUN_LINES)] == [0, 0, 2]


def test_a_batch_travels_as_the_same_bytes_and_decodes_once():
    recs = [StepRecord.from_json(CPU_LINE), StepRecord.from_json(CUDA_LINE)]
    body = protocol.encode(recs)
    assert body == protocol.encode([json.loads(CPU_LINE), json.loads(CUDA_LINE)])
    assert decode_batch(body) == (recs, 0)
    # an item that is not a record is counted, the others kept; NaN decodes too
    odd = body[:-1] + b', {"step": "x"}, 7, {"step": 1, "t0": NaN, "t1": 2}]'
    got, bad = decode_batch(odd)
    assert got[:2] == recs and got[2].step == 1 and bad == 2
    with pytest.raises(ValueError):
        decode_batch(b'{"step": 1}')
    # fields an older writer did not send take their defaults
    assert records_from([{"step": 3, "t0": 1, "t1": 2}]) == (
        [StepRecord(step=3, t0=1.0, t1=2.0)], 0)


def test_a_tlprof_payload_keeps_the_records_json():
    rec = StepRecord.from_json(CPU_LINE)
    run = DdpRun(world_size=1, profiling=RankProfiling(steps=[[rec]]))
    data = json.loads(json.dumps(to_json(run)))
    assert data["profiling"]["steps"] == [[json.loads(CPU_LINE)]]
    back = from_json("ddp_check", data)
    assert back.profiling.steps == [[rec]]


def _consumers():
    from torchlens.frontends.shared.live_publish import RankSink
    from torchlens.frontends.shared.live_view import ProfiledLiveView
    from torchlens.frontends.shared.rank_channel import RankPublisher
    from torchlens.render.ddp.heartbeats import LivePlot
    from torchlens.render.ddp.progress import TextProgress

    return [RankSink("r", publisher=RankPublisher("r", server=None)), TextProgress(2),
            LivePlot(2), ProfiledLiveView(2, 5, True)]


def test_every_live_consumer_is_a_rank_feed():
    """Each implements every method: the launcher calls them without asking."""
    for consumer in _consumers():
        assert isinstance(consumer, RankFeed), type(consumer).__name__
