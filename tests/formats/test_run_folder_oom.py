"""A rank's CUDA out-of-memory in the run folder's manifest: where its allocator
snapshot went or why none was saved, readable by a torchlens that predates the field."""

from __future__ import annotations

from pathlib import Path

import msgspec

from torchlens.capture.ranks.oom import oom_line
from torchlens.formats.run_folder.files import MANIFEST
from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    VERSION,
    Manifest,
    RankEntry,
    read_manifest,
    write_manifest,
)
from torchlens.formats.run_folder.write import RankFiles, write_run_folder
from torchlens.model.messages import OomOutcome

WHY = ("PYTORCH_CUDA_ALLOC_CONF has backend:cudaMallocAsync, which keeps no per-block "
       "state: torch cannot snapshot it (the OOM message is what there is)")


class OlderRankEntry(msgspec.Struct, kw_only=True):
    """A rank entry as a torchlens from before ``oom`` reads it."""

    rank: int
    oom_snapshot: str | None = None


class OlderManifest(msgspec.Struct, kw_only=True):
    format: str
    version: int
    world_size: int
    ranks: list[OlderRankEntry] = []


def test_the_ranks_log_line_and_the_manifest_field_say_the_same() -> None:
    saved, none = OomOutcome(path="/runs/r/rank0/oom.pickle"), OomOutcome(why=WHY)
    assert saved.words() == "CUDA out of memory; allocator snapshot in /runs/r/rank0/oom.pickle"
    assert none.words() == f"CUDA out of memory; no allocator snapshot saved: {WHY}"
    assert oom_line(1, none) == f"torchlens rank 1: {none.words()}"


def test_both_writers_put_the_oom_in_the_manifest_from_the_ranks_outcome(tmp_path: Path) -> None:
    (tmp_path / "rank0").mkdir()
    (tmp_path / "rank0" / "oom.pickle").write_bytes(b"")
    back = write_run_folder(str(tmp_path), Manifest(source=SOURCE_RUN, world_size=2), [
        RankFiles(RankEntry(rank=0), [], oom=OomOutcome(path=str(tmp_path / "rank0" / "oom.pickle"))),
        RankFiles(RankEntry(rank=1), [], oom=OomOutcome(why=WHY))])
    assert read_manifest(str(tmp_path)) == back
    assert back.rank(0).oom_snapshot == "rank0/oom.pickle"
    assert back.rank(1).oom == f"CUDA out of memory; no allocator snapshot saved: {WHY}"


def test_the_oom_field_round_trips_and_an_older_reader_still_reads(tmp_path: Path) -> None:
    words = f"CUDA out of memory; no allocator snapshot saved: {WHY}"
    write_manifest(str(tmp_path), Manifest(
        source=SOURCE_RUN, world_size=2,
        ranks=[RankEntry(rank=0, oom_snapshot="rank0/oom.pickle",
                         oom="CUDA out of memory; allocator snapshot in /r/rank0/oom.pickle"),
               RankEntry(rank=1, oom=words)]))
    back = read_manifest(str(tmp_path))
    assert back.version == VERSION == 2
    assert back.rank(1).oom == words and back.rank(0).oom_snapshot == "rank0/oom.pickle"
    older = msgspec.json.decode((tmp_path / MANIFEST).read_bytes(), type=OlderManifest)
    assert [e.oom_snapshot for e in older.ranks] == ["rank0/oom.pickle", None]


def test_a_manifest_without_the_field_reads_as_no_oom(tmp_path: Path) -> None:
    write_manifest(str(tmp_path), Manifest(source=SOURCE_RUN, world_size=1,
                                           ranks=[RankEntry(rank=0)]))
    assert read_manifest(str(tmp_path)).rank(0).oom is None
