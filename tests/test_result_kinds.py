"""Typed payloads, files of the previous format, and the registry of kinds.

tests/data/v1 holds one small .tlprof of each kind written by torchlens with
format version 1 (untyped ``options``/``extra``), and the text view that
version showed for each (``*.expected.txt``; its figures rewritten once, when
every view took the one rule per unit of ``model/units.py``). They
must load, upgrade to the typed payload, and render the same.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from torchlens.frontends import kinds
from torchlens.frontends.export import export_profile
from torchlens.model import (
    PAYLOADS,
    DdpRun,
    GpumemPayload,
    InputError,
    MemoryOptions,
    OpDisplay,
    Profile,
    ProfilerOptions,
    TorchprofPayload,
    TracePayload,
    load_profile,
)
from torchlens.model.collectives import Fingerprint
from torchlens.model.payloads import HangInfo

V1 = Path(__file__).parent / "data" / "v1"
SECTIONS = {
    "torchprof": ["hints-main", "ops-main", "steps-main", "timeline-main", "environment"],
    "trace": ["hints-main", "ops-main", "steps-main", "timeline-main"],
    "gpumem": ["summary", "simulate", "timeline", "sites", "leaks", "fragmentation"],
    "ddp_check": ["checklist", "ranks-plot", "ranks", "collectives"],
}


@pytest.mark.parametrize("kind", sorted(SECTIONS))
def test_version_1_files_load_and_render_as_before(kind: str) -> None:
    profile = load_profile(V1 / f"{kind}.tlprof")
    assert profile.kind == kind and isinstance(profile.payload, PAYLOADS[kind])
    expected = (V1 / f"{kind}.expected.txt").read_text()
    assert kinds.text(profile) == expected
    html = kinds.report_html(profile)
    for anchor in SECTIONS[kind]:
        assert f'id="{anchor}"' in html, anchor


def test_version_1_options_become_the_typed_payload() -> None:
    tp = load_profile(V1 / "torchprof.tlprof").payload
    # captured with top=5 and shapes: the display and the recording option both kept
    assert tp.display == OpDisplay(top=5, sort="total_cpu_us", shapes=True)
    assert tp.recorded.record_shapes and tp.steps_marked == 3 and tp.timings["stop_s"] > 0
    gm = load_profile(V1 / "gpumem.tlprof").payload
    assert gm.measured_on == "cpu" and gm.simulate and gm.top == 5 and len(gm.runs) == 1
    run = load_profile(V1 / "ddp_check.tlprof")
    assert run.payload.world_size == 2 and run.payload.outcome == "finished"
    assert len(run.payload.fingerprints) == 2 and "heartbeats" in run.tables
    assert "collectives" not in run.tables  # v1's second copy of the fingerprints


@pytest.mark.parametrize("payload", [
    TracePayload(OpDisplay(top=3, sort="self_cpu_us", stack=True)),
    TorchprofPayload(display=OpDisplay(flops=True),
                     recorded=ProfilerOptions(with_flops=True, schedule=(1, 2, 3)),
                     timings={"start_s": 0.1}, profiler_overhead_s=0.2, steps_marked=6),
    GpumemPayload(measured_on="cuda", recorded=MemoryOptions(device=1, stacks=4),
                  stats_before={"num_ooms": 0},
                  runs=[(1, 2), (2, 5)], simulate=True, capacity=1 << 30,
                  alloc_conf="expandable_segments:True"),
    DdpRun(world_size=2, backend="gloo", outcome="hang", pids=[11, 12],
           ranks=[{"pid": 11, "error": None}, None], fingerprints=[[Fingerprint(index=0, op="x")], []],
           exit_codes=[0, None], killed=[1], hang=HangInfo(after_s=3.0, stacks=["a", "b"])),
], ids=lambda p: type(p).__name__)
def test_payload_round_trips_through_a_file(payload, tmp_path) -> None:
    kind = next(k for k, cls in PAYLOADS.items() if isinstance(payload, cls))
    path = Profile(kind=kind, payload=payload).save(str(tmp_path / "p.tlprof"))
    assert load_profile(path).payload == payload


def test_a_profile_refuses_another_kinds_payload() -> None:
    with pytest.raises(TypeError, match="takes a GpumemPayload"):
        Profile(kind="gpumem", payload=TracePayload())
    assert Profile(kind="ddp_check").payload == DdpRun()


def test_unknown_kind_in_a_file_says_upgrade(tmp_path) -> None:
    path = tmp_path / "future.tlprof"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("manifest.json", json.dumps({"format": "torchlens-profile",
                                                 "format_version": 2, "kind": "hologram"}))
    with pytest.raises(InputError, match="kind 'hologram'.*Upgrade torchlens"):
        load_profile(path)


def test_exports_dispatch_by_kind(tmp_path) -> None:
    ddp = load_profile(V1 / "ddp_check.tlprof")
    with pytest.raises(InputError, match=r"cannot export ddp_check results .*\.html, \.tlprof"):
        export_profile(ddp, tmp_path / "x.json")
    assert Path(export_profile(ddp, tmp_path / "r.html")).read_text().startswith("<!DOCTYPE")
    tp = load_profile(V1 / "torchprof.tlprof")
    with pytest.raises(InputError, match="cannot export torchprof results"):
        export_profile(tp, tmp_path / "x.pickle")
    raw = Path(export_profile(tp, tmp_path / "t.json")).read_bytes()
    assert raw == tp.attachments["trace.json"]


def test_numbers_do_not_import_bokeh(tmp_path) -> None:
    """Asking a result for numbers, or for its snapshot file, loads no renderer."""
    code = f"""
import sys
import torchlens
from torchlens.frontends.memory.api import MemoryResult
from torchlens.frontends.result import Result
from torchlens.model import load_profile
mem = MemoryResult(load_profile({str(V1 / 'gpumem.tlprof')!r}))
assert mem.analysis().timeline.peak_allocated > 0 and mem.sites()
mem.export({str(tmp_path / 'snap.pickle')!r})
tp = Result(load_profile({str(V1 / 'torchprof.tlprof')!r}))
assert len(tp.ops()) and len(tp.steps())
loaded = [m for m in ("bokeh", "holoviews", "jinja2") if m in sys.modules]
print(loaded)
assert not loaded, loaded
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "snap.pickle").stat().st_size > 0


def test_ddp_bytes_read_the_same_in_checklist_and_ranks_table() -> None:
    """Tensor bytes said "16 B" in the checklist but "0.0 MiB"
    in the ranks table of the same report."""
    profile = load_profile(V1 / "ddp_check.tlprof")
    memory = next(i for i in kinds.analyze(profile).checklist if i.name == "memory")
    assert "tensor bytes 16 B" in memory.evidence
    html = kinds.report_html(profile)
    ranks = html[html.index('id="ranks"'):html.index('id="collectives"')]
    assert ">16 B<" in ranks and "0.0 MiB" not in ranks
