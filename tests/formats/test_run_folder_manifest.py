"""The run folder's typed manifest and rank records (``formats.run_folder``): written
and read back, version-1 folders of both writers still read, and every bad
manifest a one-line InputError naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchlens.analysis.ranks.collector_notes import collector_notes
from torchlens.formats.run_folder.files import MANIFEST, rank_traces
from torchlens.formats.run_folder.manifest import (
    SOURCE_DDP_CHECK,
    SOURCE_RUN,
    VERSION,
    LiveEntry,
    Manifest,
    ManifestError,
    NodeEntry,
    RankEntry,
    RestartEntry,
    read_manifest,
    write_manifest,
)
from torchlens.formats.run_folder.records import (
    collected_steps,
    read_steps,
    read_summaries,
    write_steps,
    write_summaries,
)
from torchlens.formats.run_folder.sources import discover
from torchlens.model import InputError
from torchlens.model.records import StepRecord

#: what ``%ddp_check --profile`` wrote before the manifest was typed (version 1)
V1_DDP_CHECK = {
    "format": "torchlens-run", "version": 1, "world_size": 2, "backend": "gloo",
    "created": 1732400000.5, "profile": {"every": 5, "window_s": 1.0, "keep": 50},
    "ranks": [{"rank": r, "pid": 4000 + r, "host": "gpu7", "device": "cpu",
               "traces": [f"rank{r}/step00003.pt.trace.json"], "oom_snapshot": None}
              for r in (0, 1)]}

#: what ``torchlens run`` wrote before the manifest was typed (version 1)
V1_TORCHLENS_RUN = {
    "format": "torchlens-run", "version": 1, "source": "torchlens run", "world_size": 2,
    "created": 1732400100.0, "run_id": "8c1f0e27a4b9d3e1",
    "command": ["torchrun", "--nproc-per-node", "2", "train.py"], "exit_code": 0,
    "interrupted": False, "stopped": "finished: every rank said goodbye (12 steps or more each)",
    "verdict": "rank 1 is the straggler: its data loading takes 40.0 ms per step",
    "ranks": [{"rank": r, "node": 0, "host": "gpu7", "pid": 1, "local_rank": r,
               "device": "cpu", "restart": 0, "state": "finished", "error": None,
               "stopped_at_step": 12, "last_heartbeat": 1732400099.5, "steps": 12,
               "summaries": 0, "traces": []} for r in (0, 1)],
    "nodes": [{"node": 0, "host": "gpu7", "ranks": [0, 1]}],
    "lost_nodes": [{"node": 1, "host": "gpu8", "ranks": [2], "step": 7, "why": "silent",
                    "words": "node 1 (gpu8) at step 7"}],
    "restarts": [{"number": 1, "ranks": [0, 1], "world_size": 2, "t": 1732400050.0,
                  "resumed_t": 1732400055.0, "cause": "failed", "cause_rank": 1,
                  "cause_step": 5, "error": "ValueError: bad batch", "before": [],
                  "words": "rank 1 failed at step 5", "label": "restart 1: rank 1 failed"}],
    "started": 1732400001.5, "dropped_messages": 0, "dropped_why": {},
    "slow_rank": {"rank": 1, "cause": "data", "words": "rank 1 is the straggler",
                  "gap_ms": 39.0, "late_share": 1.0, "skew_pct": 50.0,
                  "median_step_ms": 75.0, "steps": 12},
    "memory_creep": [], "notes": ["a note"],
    "live": {"feed": "live.jsonl", "status": "live.json", "frames": 14, "bytes": 9000,
             "store_thinned": 0, "publish_ms_median": 0.4, "publish_ms_max": 2.0,
             "errors": {}}}


def _write_doc(folder: Path, doc: dict | str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MANIFEST
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_a_manifest_round_trips_with_every_field(tmp_path: Path) -> None:
    manifest = Manifest(
        source=SOURCE_RUN, world_size=2, created=1.5, run_id="abc", command=["torchrun"],
        started=1.0, exit_code=1, interrupted=True, stopped="interrupted after 3 steps",
        verdict="v", ranks=[RankEntry(rank=0, host="h", pid=3, node=0, state="failed",
                                      error="E: x", last_heartbeat=2.5, steps=3,
                                      traces=["rank0/step00001.pt.trace.json"])],
        nodes=[NodeEntry(node=0, host="h", ranks=[0])], restarts=[RestartEntry(number=1)],
        slow_rank={"rank": None}, dropped_messages=2, dropped_why={"bad signature": 2},
        notes=["n"], live=LiveEntry(feed="live.jsonl", frames=3))
    write_manifest(str(tmp_path), manifest)
    back = read_manifest(str(tmp_path))
    assert back == manifest and back.version == VERSION == 2
    assert back.rank(0).error == "E: x" and back.rank(1) is None
    # every key is in the file, null where this writer has nothing to say
    doc = json.loads((tmp_path / MANIFEST).read_text())
    assert doc["format"] == "torchlens-run" and doc["backend"] is None
    assert doc == back.to_dict()


def test_numpy_figures_are_written_as_numbers(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    write_manifest(str(tmp_path), Manifest(world_size=1, slow_rank={
        "gap_ms": np.float64(1.5), "steps": np.int64(3)}))
    assert read_manifest(str(tmp_path)).slow_rank == {"gap_ms": 1.5, "steps": 3}


def test_a_version_1_manifest_of_ddp_check_reads(tmp_path: Path) -> None:
    _write_doc(tmp_path, V1_DDP_CHECK)
    m = read_manifest(str(tmp_path))
    assert (m.version, m.source, m.world_size, m.backend) == (1, SOURCE_DDP_CHECK, 2, "gloo")
    assert m.profile.every == 5 and m.run_id is None and m.live is None
    assert [(e.rank, e.pid, e.host, e.traces) for e in m.ranks] == [
        (0, 4000, "gpu7", ["rank0/step00003.pt.trace.json"]),
        (1, 4001, "gpu7", ["rank1/step00003.pt.trace.json"])]
    assert collector_notes(m) == [] and collected_steps(str(tmp_path), m) is None


def test_a_version_1_manifest_of_torchlens_run_reads(tmp_path: Path) -> None:
    _write_doc(tmp_path, V1_TORCHLENS_RUN)
    write_steps(str(tmp_path), 0, [{"step": 0, "t0": 1732400002.0, "t1": 1732400002.1}])
    m = read_manifest(str(tmp_path))
    assert (m.version, m.source, m.run_id, m.exit_code) == (1, SOURCE_RUN, "8c1f0e27a4b9d3e1", 0)
    assert m.rank(1).state == "finished" and m.rank(1).last_heartbeat == 1732400099.5
    assert m.nodes == [NodeEntry(node=0, host="gpu7", ranks=[0, 1])]
    assert m.live.frames == 14 and m.slow_rank["rank"] == 1
    assert m.restarts[0].label == "restart 1: rank 1 failed"
    notes = collector_notes(m)
    assert [n.code for n in notes] == ["collector_note", "lost_node", "run_ended", "restart",
                                       "collector_note"]
    assert [str(n) for n in notes] == [
        "torchlens run (every step of every rank): rank 1 is the straggler: its data "
        "loading takes 40.0 ms per step",
        "lost node 1 (gpu8) at step 7",
        "how the run ended: finished: every rank said goodbye (12 steps or more each) (exit code 0)",
        "restart 1: rank 1 failed at step 5",
        "a note"]
    steps = collected_steps(str(tmp_path), m)
    assert steps.started == 1732400001.5 and steps.ranks[0]["t1"] == [1732400002.1]
    assert steps.ranks[1]["t1"] == []  # no steps.jsonl: an empty rank


@pytest.mark.parametrize("content, why", [
    (None, "no such file"),
    ('{"format": "torchlens-run", "ranks": [', "not valid JSON"),
    ('{"format": "torchlens-run", "version": 3, "world_size": 2}',
     "manifest version 3, written by a newer torchlens (this one reads up to 2)"),
    ('{"format": "torchlens-run", "version": "one", "world_size": 2}',
     "its version 'one' is not a version number"),
    ('{"format": "torchlens-run", "version": 2, "world_size": 2, "ranks": [{"rank": "x"}]}',
     "Expected `int`, got `str` - at `$.ranks[0].rank`"),
    ('{"format": "torchlens-run", "version": 2}', "missing required field `world_size`"),
    ('{"format": "something-else"}', "not a torchlens run manifest (format 'something-else'"),
    ("[1, 2]", "not a torchlens run manifest (format 'list'"),
], ids=["missing", "garbled", "newer", "bad-version", "wrong-type", "no-world-size",
        "foreign", "not-an-object"])
def test_a_bad_manifest_is_one_line_naming_the_file(tmp_path: Path, content, why) -> None:
    if content is not None:
        _write_doc(tmp_path, content)
    with pytest.raises(InputError) as caught:
        read_manifest(str(tmp_path))
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"{tmp_path / MANIFEST}: ")
    assert why in text
    assert isinstance(caught.value, ManifestError)


def test_discover_names_a_newer_manifest_and_still_places_the_traces(tmp_path: Path) -> None:
    _write_doc(tmp_path, {"format": "torchlens-run", "version": 9, "world_size": 2})
    run = discover(tmp_path)
    assert [(p.kind, Path(p.path).name) for p in run.problems] == [
        ("unreadable", MANIFEST), ("no traces", tmp_path.name)]
    assert "written by a newer torchlens" in run.problems[0].message


def test_rank_records_round_trip_and_a_cut_last_line_is_skipped(tmp_path: Path) -> None:
    run_dir = str(tmp_path)
    write_steps(run_dir, 3, [StepRecord(step=0, t0=1.0, t1=1.5),
                             b'{"step": 1, "t0": 2.0, "t1": 2.5}'])
    with open(tmp_path / "rank3" / "steps.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"step": 2, "t0"')  # a file cut while being written
    assert read_steps(run_dir, 3) == [StepRecord(step=0, t0=1.0, t1=1.5),
                                      StepRecord(step=1, t0=2.0, t1=2.5)]
    write_summaries(run_dir, 3, [{"step": 0, "ops": []}])
    assert read_summaries(run_dir, 3) == [{"step": 0, "ops": []}]
    assert read_steps(run_dir, 4) == [] and read_summaries(run_dir, 4) == []
    (tmp_path / "rank3" / "step00001.pt.trace.json").write_text("{}")
    assert rank_traces(run_dir, 3) == ["rank3/step00001.pt.trace.json"]


def test_a_manifest_with_a_changed_byte_outside_utf8_names_the_byte(tmp_path: Path) -> None:
    data = json.dumps({"format": "torchlens-run", "version": 2, "world_size": 2,
                       "verdict": "rank 1 slow"}).encode()
    at = data.index(b"slow")
    (tmp_path / MANIFEST).write_bytes(data[:at] + b"\xa5" + data[at + 1:])
    with pytest.raises(ManifestError) as caught:
        read_manifest(str(tmp_path))
    assert f"not UTF-8 text (byte {at})" in str(caught.value)
