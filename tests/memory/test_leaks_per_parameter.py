"""Memory made once per parameter (a gradient, optimizer state) is not a leak on a
loaded snapshot, even where its line frees temporaries between parameters; memory
kept every step still is."""

from __future__ import annotations

import pickle

import pytest
from gpumem_fixtures import SNAPSHOTS

from torchlens.frontends.memory.api import load_gpumem
from torchlens.render.memory.report import summary_line, text_report

LORA_BACKWARD = SNAPSHOTS / "ftcourse_older_format.pickle"


@pytest.mark.skipif(not LORA_BACKWARD.exists(), reason="shared snapshots missing")
def test_gradients_made_once_per_parameter_are_listed_not_flagged():
    # a LoRA fine-tune's backward: each adapter's gradient is made once, layer after
    # layer, on a line that frees its temporaries in between
    r = load_gpumem(str(LORA_BACKWARD))
    a = r.analysis()
    grads = next(s for s in a.survivors if s.site == "(no Python stack)")
    assert grads.count == 89 and grads.per_parameter == 88
    assert not grads.flagged
    assert r.leaks() == []
    assert "possible leak" not in summary_line(r.profile, a)
    assert "possible leaks" not in text_report(r.profile, a)


def _block(address: int, size: int) -> dict:
    return {"address": address, "size": size, "requested_size": size,
            "state": "active_allocated", "frames": []}


def _loop(kept_size: int, param_sizes: list[int], steps: int = 4) -> dict:
    """A loop whose line 7 makes a temporary and keeps one ``kept_size`` tensor a step
    (line 6 runs in between), with parameters of ``param_sizes`` alive before the window."""
    trace, addr, kept = [], 1 << 30, []
    for step in range(steps):
        for line, size, keep in ((6, 4096, False), (7, 4096, False), (7, kept_size, True)):
            frames = [{"filename": "train.py", "line": line, "name": "step"}]
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                          "frames": frames, "time_us": 100 * step})
            if keep:
                kept.append(_block(addr, size))
            else:
                for action in ("free_requested", "free_completed"):
                    trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                                  "frames": frames, "time_us": 100 * step + 50})
            addr += 1 << 20
    params = [_block(4096 * (i + 1), size) for i, size in enumerate(param_sizes)]
    return {"segments": [{"device": 0, "address": 0, "total_size": 1 << 31, "stream": 0,
                          "segment_type": "large", "allocated_size": 0, "active_size": 0,
                          "blocks": params + kept}],
            "device_traces": [trace]}


@pytest.mark.parametrize(("kept", "params", "flagged"), [
    (1 << 16, [1 << 16] * 4, False),  # one tensor per parameter: state, not a leak
    (1 << 16, [1 << 17] * 4, True),  # no parameter of that size: kept every step
    (1 << 16, [1 << 16] * 2, True),  # more kept than parameters of that size
    (512, [512] * 8, True),  # a scalar loss kept every step, beside small biases
], ids=["per-parameter", "other-size", "more-than-parameters", "scalar-loss"])
def test_only_memory_beyond_one_per_parameter_counts(tmp_path, kept, params, flagged):
    path = tmp_path / "loop.pickle"
    path.write_bytes(pickle.dumps(_loop(kept, params)))
    r = load_gpumem(str(path))
    assert [s.site for s in r.leaks()] == (["train.py:7"] if flagged else [])
    row = next(s for s in r.analysis().survivors if s.site == "train.py:7")
    assert row.count == 4
