"""A folder of per-rank snapshots as one result: the per-rank table, the
imbalance named with its category and site, every rank on one chart, through
``torchlens.load(FOLDER)`` and ``torchlens report FOLDER``, without changing how a
folder of traces is read."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

import torchlens
from torchlens.frontends.cli.main import main
from torchlens.frontends.kinds import report_html, text
from torchlens.frontends.memory.ranks import MemoryRanksResult
from torchlens.frontends.runs.api import RunResult
from torchlens.model import InputError, load_profile

MIB = 1 << 20
DATA = Path(__file__).resolve().parents[1] / "data" / "cuda"
TORCH = "/opt/venv/lib/python3.12/site-packages/torch/nn/modules/module.py"
TRAIN = {"filename": "/nonexistent/proj/train.py", "line": 30, "name": "main"}
PARAM = [{"filename": TORCH, "line": 900, "name": "_apply"}, TRAIN]
ACT = [{"filename": "/nonexistent/proj/model.py", "line": 88, "name": "forward"},
       {"filename": TORCH, "line": 1750, "name": "_call_impl"}, TRAIN]
PARAMS, ACTS = 64 * MIB, 3  # parameters, and activations kept per forward


def _snapshot(act_size: int) -> bytes:
    """Parameters, then ``ACTS`` activations of ``act_size`` kept, then freed."""
    trace, t = [], 0

    def add(action: str, addr: int, size: int, frames: list) -> None:
        nonlocal t
        t += 100
        trace.append({"action": action, "addr": addr, "size": size, "time_us": t,
                      "frames": frames, "stream": 0})

    add("alloc", 0x10000000, PARAMS, PARAM)
    for i in range(ACTS):
        add("alloc", 0x20000000 + i * 0x10000000, act_size, ACT)
    for i in range(ACTS):
        add("free_requested", 0x20000000 + i * 0x10000000, act_size, ACT)
        add("free_completed", 0x20000000 + i * 0x10000000, act_size, ACT)
    def segment(addr: int, size: int, state: str, frames: list) -> dict:
        return {"device": 0, "address": addr, "total_size": size, "stream": 0,
                "segment_type": "large", "allocated_size": size * (state != "inactive"),
                "active_size": size * (state != "inactive"),
                "blocks": [{"address": addr, "size": size, "requested_size": size,
                            "state": state, "frames": frames}]}

    # at the dump: the parameters still allocated, the activations' blocks cached
    segments = [segment(0x10000000, PARAMS, "active_allocated", PARAM)]
    segments += [segment(0x20000000 + i * 0x10000000, act_size, "inactive", [])
                 for i in range(ACTS)]
    return pickle.dumps({"segments": segments, "device_traces": [trace]})


#: rank 2 runs a batch twice the others' size
SIZES = {0: 32 * MIB, 1: 32 * MIB, 2: 64 * MIB, 3: 32 * MIB}


def _flat(folder: Path) -> Path:
    folder.mkdir()
    for rank, size in SIZES.items():
        (folder / f"rank{rank}.pickle").write_bytes(_snapshot(size))
    return folder


def test_flat_folder_names_the_rank_and_what_it_holds_more_of(tmp_path):
    r = torchlens.load(_flat(tmp_path / "snaps"))
    assert isinstance(r, MemoryRanksResult)
    table = r.ranks()
    # expected from the sizes written above: parameters plus every activation
    peaks = {rank: PARAMS + ACTS * size for rank, size in SIZES.items()}
    assert table["peak"].to_dict() == peaks
    assert set(table["top_category"]) == {"activation"}
    median = sorted(peaks.values())[len(peaks) // 2 - 1 : len(peaks) // 2 + 1]
    above = peaks[2] - sum(median) / 2
    assert above == ACTS * 32 * MIB
    im = r.figures.imbalance
    assert im.rank == 2 and im.above_median == above
    assert im.category.name == "activation" and im.category.extra == above
    assert im.site.name.endswith("model.py:88") and im.site.extra == above
    assert r.figures.verdict.code == "memory_ranks"
    assert r.verdict.startswith("rank 2 peaks 96.0 MiB above the median of 4 ranks")
    assert ": activation at " in r.verdict and "model.py:88" in r.verdict
    assert "rank 2 peaks" in text(r.profile, r.analysis())


def test_rank_folders_like_ddp_check_oom_snapshots(tmp_path):
    root = tmp_path / "run"
    for rank, size in SIZES.items():
        (root / f"rank{rank}").mkdir(parents=True)
        (root / f"rank{rank}" / "oom.pickle").write_bytes(_snapshot(size))
    r = torchlens.load(str(root))
    assert list(r.ranks().index) == [0, 1, 2, 3]
    assert r.ranks().loc[2, "source"] == str(Path("rank2") / "oom.pickle")
    page = report_html(r.profile, r.analysis())
    assert "Allocated memory of every rank" in page and page.index("Imbalance") < page.index(
        "Per rank")
    # a run folder holding traces stays a run; its OOM snapshots load on request
    shutil.copy(DATA / "cuda_torchprof.json.gz", root / "rank0" / "step00001.pt.trace.json.gz")
    assert isinstance(torchlens.load(str(root)), RunResult)
    assert torchlens.load_snapshots(str(root)).figures.imbalance.rank == 2


def test_report_command_and_saved_result(tmp_path, capsys):
    folder = _flat(tmp_path / "snaps")
    out = tmp_path / "r.html"
    assert main(["report", str(folder), "-o", str(out)]) == 0
    assert "rank 2 peaks" in out.read_text()
    loaded = torchlens.load(folder)
    saved = loaded.save(str(tmp_path / "r.tlprof"))
    again = load_profile(saved)
    assert again.kind == "memranks" and again.payload.analysis.imbalance.rank == 2
    assert again.payload.analysis == loaded.figures


def test_bad_rank_files_are_named_not_fatal(tmp_path, capsys):
    folder = _flat(tmp_path / "snaps")
    (folder / "rank1.pickle").write_bytes(b"\x80\x04not a pickle")
    r = torchlens.load(folder)
    assert list(r.ranks().index) == [0, 2, 3]
    assert any(n.startswith("rank 1: ") and "(left out)" in n for n in r.figures.notes)
    (folder / "snapshot_rank-3.pkl").write_bytes(_snapshot(MIB))
    with pytest.raises(InputError, match="two snapshots for rank 3"):
        torchlens.load(folder)
    assert main(["report", str(folder)]) == 2
    assert "two snapshots for rank 3" in capsys.readouterr().err


def test_balanced_ranks_pass(tmp_path):
    folder = tmp_path / "even"
    folder.mkdir()
    for rank in range(3):
        (folder / f"rank_{rank}.pickle").write_bytes(_snapshot(32 * MIB))
    r = torchlens.load(folder)
    assert r.verdict.startswith("3 ranks peak within 0 B of the median")


def test_two_ranks_compare_with_each_other_not_their_mean(tmp_path, capsys):
    """The walk: "rank 1 peaks 2.1 GiB above the median of 2 ranks (22.4 GiB vs 20.3
    GiB)": the median of two is their mean, a figure no rank had."""
    folder = tmp_path / "two"
    folder.mkdir()
    for rank, size in ((0, 32 * MIB), (1, 64 * MIB)):
        (folder / f"rank{rank}.pickle").write_bytes(_snapshot(size))
    r = torchlens.load(folder)
    low, high = PARAMS + ACTS * 32 * MIB, PARAMS + ACTS * 64 * MIB  # 160 and 256 MiB
    assert r.verdict.startswith("rank 1 peaks 96.0 MiB above rank 0 (256.0 MiB vs 160.0 MiB)")
    assert "median" not in r.verdict
    out = text(r.profile, r.analysis())
    assert "-96.0 MiB" in out and "+96.0 MiB" in out
    page = report_html(r.profile, r.analysis())
    assert "vs the other rank" in page and "vs median" not in page
    assert r.figures.imbalance.above == high - low


def test_a_rank_snapshot_linked_out_of_the_run_folder_is_refused_in_one_line(tmp_path, capsys,
                                                                            monkeypatch):
    """A run folder's ``rank<N>/oom.pickle`` (or the ``rank<N>`` folder itself) that is
    a link to a file outside it is refused, named, before anything of it is read,
    as the run folder's traces are; a flat folder gathered by links still loads."""
    from torchlens.formats.input_files import RefusedFile

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "oom.pickle").write_bytes(_snapshot(SIZES[1]))
    root = tmp_path / "run"
    for rank in (0, 2):
        (root / f"rank{rank}").mkdir(parents=True)
        (root / f"rank{rank}" / "oom.pickle").write_bytes(_snapshot(SIZES[rank]))
    (root / "rank1").mkdir()
    (root / "rank1" / "oom.pickle").symlink_to(elsewhere / "oom.pickle")
    with pytest.raises(RefusedFile) as refused:
        torchlens.load_snapshots(str(root))
    line = str(refused.value)
    assert "\n" not in line and "rank1/oom.pickle: refused: a link to " in line, line
    assert "outside the run folder" in line and "TORCHLENS_LINK_TARGETS=" in line, line
    assert main(["report", str(root), "-o", str(tmp_path / "r.html")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "rank1/oom.pickle: refused: a link to " in err[0], err
    # a rank folder that is itself a link out of the run folder: the same
    (root / "rank1" / "oom.pickle").unlink()
    (root / "rank1").rmdir()
    (root / "rank1").symlink_to(elsewhere)
    with pytest.raises(RefusedFile, match="outside the run folder"):
        torchlens.load_snapshots(str(root))
    # allowed where the user says links may lead
    monkeypatch.setenv("TORCHLENS_LINK_TARGETS", str(elsewhere))
    assert list(torchlens.load_snapshots(str(root)).ranks().index) == [0, 1, 2]
    monkeypatch.delenv("TORCHLENS_LINK_TARGETS")
    # a flat folder of snapshots gathered by links is read as before
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "rank0.pickle").write_bytes(_snapshot(SIZES[0]))
    (flat / "rank1.pickle").symlink_to(elsewhere / "oom.pickle")
    assert list(torchlens.load(str(flat)).ranks().index) == [0, 1]
