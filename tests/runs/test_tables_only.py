"""``load_run(..., tables_only=True)``, what ``torchlens analyze`` reads
(10x HTA's speed at 8 ranks): the workers skip the report's joint
timeline and ``run.diff()``'s op totals, which neither the text nor the
``--json`` document shows; every table stays the same, and a diff of such a
run says what is missing instead of comparing nothing."""

from __future__ import annotations

import msgspec
import pytest

from torchlens.frontends.runs.api import load_run
from torchlens.model import InputError


def test_tables_only_gives_the_same_document_without_timeline_or_op_totals(two_ranks):
    full = load_run(str(two_ranks), workers=1)
    lean = load_run(str(two_ranks), workers=1, tables_only=True)
    assert lean.to_json() == full.to_json()
    assert lean.findings() == full.findings()
    for figs in lean.figures.values():
        assert all("lanes" not in msgspec.to_builtins(f) and "op_totals" not in
                   msgspec.to_builtins(f) for f in figs)
    with pytest.raises(InputError, match="tables_only"):
        lean.diff(full)
    with pytest.raises(InputError, match="tables_only"):
        full.diff(lean)
