"""A ``torchlens run`` folder with a spool and no manifest is rebuilt only when
its command is gone: while that command runs, reading the folder says so and
leaves the spool alone (the command writes the folder from it at its end)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchlens.formats.run_folder import spool
from torchlens.frontends.ranks.registry import process_start
from torchlens.frontends.runs.api import load_run
from torchlens.model import InputError
from torchlens.model.messages import Hello


def _spooled(run: Path, pid: int, pid_start: float | None) -> Path:
    folder = run / ".spool"
    folder.mkdir(parents=True)
    spool.write_command(str(folder), spool.SpoolCommand(
        pid=pid, pid_start=pid_start, host=os.uname().nodename, run_id="r1"))
    spool.write_hello(str(folder), 0, Hello(rank=0, world_size=1, t=1.0))
    (folder / "slot0.steps.jsonl").write_text(
        '[{"step":0,"t0":1.0,"t1":1.1,"phases":{}}, {"step":1,"t0":1.1,"t1":1.2,"phases":{}}]\n')
    return folder


def test_a_running_command_s_folder_is_named_running_and_left_alone(tmp_path: Path) -> None:
    folder = _spooled(tmp_path / "run", os.getpid(), process_start(os.getpid()))
    with pytest.raises(InputError, match="still running"):
        load_run(str(tmp_path / "run"))
    assert (folder / "slot0.steps.jsonl").exists()
    assert not (tmp_path / "run" / "manifest.json").exists()


def test_a_dead_command_s_folder_is_rebuilt_with_what_was_spooled(tmp_path: Path) -> None:
    # this process's pid with another start time: a pid reused, the command is gone
    _spooled(tmp_path / "run", os.getpid(), 12.0)
    manifest = spool.rebuild(str(tmp_path / "run"))
    assert manifest is not None and [e.rank for e in manifest.ranks] == [0]
    assert manifest.ranks[0].steps == 2
    assert manifest.stopped.startswith("unknown: torchlens run ended before it wrote")
    assert "2 step records of 1 rank," in manifest.notes[0]
    lines = (tmp_path / "run" / "rank0" / "steps.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert not (tmp_path / "run" / ".spool").exists()


def test_a_rebuild_on_a_full_disk_is_one_line_and_leaves_the_spool(tmp_path: Path,
                                                                    monkeypatch) -> None:
    import errno

    from torchlens.formats.run_folder import manifest as manifest_file

    folder = _spooled(tmp_path / "run", os.getpid(), 12.0)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    # the disk fills as the manifest is written: no half-written file is left behind
    real_open = open

    def failing_open(path, mode="r", *args, **kwargs):
        if str(path).endswith(".tmp") and "w" in mode:
            fh = real_open(path, mode, *args, **kwargs)
            fh.write = full
            return fh
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(manifest_file, "open", failing_open, raising=False)
    with pytest.raises(InputError, match="rebuilding it from its spool failed "
                                         r"\(No space left on device\); free space"):
        load_run(str(tmp_path / "run"))
    assert (folder / "slot0.steps.jsonl").exists()
    assert not [p.name for p in (tmp_path / "run").iterdir() if p.name.endswith(".tmp")]
