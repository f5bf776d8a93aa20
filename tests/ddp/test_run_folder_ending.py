"""A %ddp_check --profile run folder says how each rank ended: a rank that raised
is ``failed`` with its exception in the manifest, as ``torchlens run`` writes it
(a new-user walk found the crash missing from the folder and its report)."""

from __future__ import annotations

import json

import pytest

from torchlens.frontends.ddp.api import ddp_check

from . import profiled
from .conftest import assert_clean

pytestmark = pytest.mark.usefixtures("no_leftovers")


def test_a_crashed_rank_is_failed_in_the_manifest(tmp_path):
    run = tmp_path / "run"
    res = ddp_check(profiled.crashing, world_size=2, backend="gloo", profile=True, steps=12,
                    run_dir=str(run), live=False)
    entries = json.loads((run / "manifest.json").read_text())["ranks"]
    failed = [e for e in entries if e.get("state") == "failed"]
    assert failed, entries
    assert any("RuntimeError" in (e.get("error") or "") for e in failed), failed
    assert_clean(res)
