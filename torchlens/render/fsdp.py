"""FSDP's per-rank memory columns, one set of headers for the ``%ddp_check``
ranks table and the ``torchlens run`` report's FSDP section (the words are
``analysis.ddp.fsdp``'s: "how" is measured or modelled)."""

from __future__ import annotations

from torchlens.model.units import format_bytes
from torchlens.render.tables import Column

FSDP_COLUMNS = [Column("fsdp_sharded", "FSDP shards", format_bytes),
                Column("fsdp_gathered", "gathered at once", format_bytes),
                Column("fsdp_gathered_how", "how", str, False),
                Column("allocator_peak", "allocator peak", format_bytes),
                Column("optimizer_state", "optimizer state", format_bytes)]
