"""HTML fragments: escaping, options, sorting markup."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from render_fixtures import HOSTILE, hostile_trace

from torchlens.analysis.trace import ops
from torchlens.model import InputError, OpDisplay
from torchlens.model.findings import Figure, Finding
from torchlens.model.units import MISSING, format_duration, format_percent
from torchlens.render import findings, tables


def _ops() -> pd.DataFrame:
    return pd.DataFrame({
        "name": [HOSTILE, "aten::mm", "aten::add"],
        "calls": [3, 10, 1],
        "self_cpu_us": [50.0, 900.0, 5.0],
        "total_cpu_us": [2000.0, 1000.0, 5.0],
        "device_us": [0.0, 300.0, float("nan")],
        "kernels": [0, 10, 0],
        "input_shapes": [f"[[1]] {HOSTILE}", "[[4,4]]", ""],
        "flops": [float("nan"), 2.5e9, 0.0],
    })


def _html(df: pd.DataFrame, display: OpDisplay, has_gpu: bool) -> str:
    return tables.op_table_html(df, ops.top_ops(df, display.sort, display.top), display, has_gpu)


def test_op_table_escapes_names_and_shapes() -> None:
    html = _html(_ops(), OpDisplay(shapes=True, flops=True), has_gpu=True)
    assert HOSTILE not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "input shapes" in html and "FLOPs" in html and "2.50 GFLOP" in html


def test_op_table_columns_follow_options_and_gpu() -> None:
    html = _html(_ops(), OpDisplay(), has_gpu=False)
    assert "device time" not in html and "input shapes" not in html and "FLOPs" not in html
    assert "device time" in _html(_ops(), OpDisplay(), has_gpu=True)


@pytest.mark.parametrize("key, first", [("calls", "aten::mm"), ("self_cpu", "aten::mm"),
                                        ("total_cpu_us", HOSTILE), (None, HOSTILE),
                                        ("name", HOSTILE)])  # "<" sorts first
def test_top_ops_sort_and_top(key: str | None, first: str) -> None:
    shown = ops.top_ops(_ops(), key, 2)
    assert len(shown) == 2 and shown.iloc[0]["name"] == first


def test_unknown_sort_key_is_an_input_error() -> None:
    with pytest.raises(InputError, match="unknown sort key 'bogus'"):
        ops.top_ops(_ops(), "bogus", 20)


def test_sortable_markup() -> None:
    html = _html(_ops(), OpDisplay(), has_gpu=False)
    assert 'class="tl-sort ops"' in html and 'data-v="900.0"' in html
    assert "addEventListener" in tables.SORT_JS and "http" not in tables.SORT_JS


def test_op_table_from_analysis_on_hostile_trace() -> None:
    df = ops.op_table(hostile_trace(), group_by_shapes=True)
    html = _html(df, OpDisplay(shapes=True), has_gpu=True)
    assert HOSTILE not in html and "k<b>" not in html


def test_fragments_escape_everything() -> None:
    env = {"host": HOSTILE, "gpus": [{"name": HOSTILE}], "env": {HOSTILE: HOSTILE}}
    hint = Finding("warning", HOSTILE, (Figure(HOSTILE, HOSTILE),), HOSTILE, HOSTILE)
    steps = pd.DataFrame({"step": [HOSTILE], "dur_us": [10.0], "kernel_us": [4.0]})
    kernels = pd.DataFrame({"name": [HOSTILE], "calls": [1], "total_us": [3.0],
                            "mean_us": [3.0], "max_us": [3.0], "streams": ["7"],
                            "is_comm": [False]})
    parts = [tables.environment_html(env), findings.findings_html([hint]),
             tables.step_table_html(steps), tables.kernel_table_html(kernels),
             tables.unmeasured_html([HOSTILE]),
             tables.error_html({"type": "E", "message": HOSTILE, "traceback": HOSTILE})]
    for html in parts:
        assert HOSTILE not in html and "&lt;img" in html


def test_a_cell_without_a_figure_says_the_missing_word() -> None:
    duration = tables.Column("dur_us", "time", format_duration)
    assert tables.cell_text(duration, 12_300) == "12.3 ms"
    # a missing figure reads as the one word every view writes for it, never a blank
    assert tables.cell_text(duration, float("nan")) == tables.cell_text(duration, None) == MISSING
    html = tables.html_table([{"dur_us": float("nan")}, {"dur_us": 950.0}], [duration])
    assert ">950.0 µs<" in html and f">{MISSING}<" in html and "nan" not in html


def test_hint_figures_are_formatted(traces_dir) -> None:
    """Hint tables showed raw floats (0.7639053309591854)."""
    from torchlens.analysis.trace.hints import find_hints
    from torchlens.analysis.trace.steps import step_breakdown
    from torchlens.formats.kineto import load_trace

    trace = load_trace(traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz")
    found = find_hints(trace, ops.op_table(trace), step_breakdown(trace))
    idle = next(h for h in found if h.title == "GPU idle between launches")
    html = findings.findings_html(found)
    assert not re.search(r"\d\.\d{5,}", html)
    assert format_percent(100 * idle.value("gpu_idle_share")) in html
    assert format_duration(idle.value("largest_gap_us")) in html
    assert "largest_gap_us" not in html and "largest gap" in html
    shown = [(findings.figure_name(f), findings.figure_text(f)) for f in (
        Figure("sync_us", 1500.0, "µs"), Figure("syncs", 24), Figure("by_name", {"a": 3}),
        Figure("ratio", 5.51234, "x"), Figure("bytes_per_step", 3 << 20, "B"),
        Figure("median_ms", 0.7681, "ms"))]
    # a figure reads as its sentence writes it: ratios to one decimal, a
    # duration in the unit that suits it (the sentence's "(768.1 µs)")
    assert shown == [("sync", "1.5 ms"), ("syncs", "24"), ("by name", "a 3"),
                     ("ratio", "5.5x"), ("bytes per step", "3.0 MiB"),
                     ("median", "768.1 µs")]


def test_step_table_hides_gpu_columns_on_a_cpu_trace() -> None:
    steps = pd.DataFrame({"step": [1, 2], "start_us": [0.0, 10.0], "dur_us": [10.0, 10.0],
                          **{k: [0.0, 0.0] for k in ("kernel_us", "memcpy_us", "memset_us",
                                                     "runtime_us", "dataloader_us", "comm_us")},
                          "cpu_exec_us": [8.0, 9.0], "other_us": [2.0, 1.0]})
    cpu = tables.step_table_html(steps, has_gpu=False)
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", cpu)
    assert headers == ["step", "step time", "dataloader", "CPU exec", "other"]
    gpu = re.findall(r"<th[^>]*>([^<]*)</th>", tables.step_table_html(steps, has_gpu=True))
    assert {"kernel", "memcpy", "memset", "runtime", "communication"} <= set(gpu)


def test_step_chart_stacks_the_roles_of_each_step(traces_dir) -> None:
    from torchlens.analysis.trace.steps import step_breakdown
    from torchlens.formats.kineto import load_trace
    from torchlens.render.trace.steps_chart import build_step_chart

    steps = step_breakdown(load_trace(traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz"))
    fig = build_step_chart(steps, has_gpu=True)
    data = fig.renderers[0].data_source.data
    roles = [item.label.value for item in fig.legend[0].items]
    assert len(roles) == 8 and len(set(data["color"])) == 8  # a colour per role, named
    assert data["step"][:len(steps)] == [f"step {s}" for s in steps.step]
    # stacked: each role's bar starts where the one below ends, the last ends at the step's time
    top = pd.DataFrame({"step": data["step"], "top": data["top"]}).groupby("step", sort=False)
    assert list(top.top.max()) == pytest.approx(list(steps.dur_us / 1e3))  # a bar is its step
    assert data["bottom"][len(steps):] == pytest.approx(data["top"][:-len(steps)])
    cpu = build_step_chart(steps.assign(**{k: 0.0 for k in tables.GPU_STEP_COLUMNS}), False)
    assert len(cpu.legend[0].items) == 3
    assert build_step_chart(steps.head(0), True) is None


def test_long_kernel_names_are_cut_with_the_whole_name_on_hover() -> None:
    """300-character CUDA kernel names made the report 13,700 px wide."""
    from html import unescape

    name = "void cutlass::Kernel<" + ", ".join(["float"] * 60) + ">(" + HOSTILE + ")"
    kernels = pd.DataFrame({"name": [name, "short_k"], "calls": [1, 2],
                            "total_us": [3.0, 1.0], "mean_us": [3.0, 0.5],
                            "max_us": [3.0, 0.5], "streams": ["7", "7"],
                            "is_comm": [False, False]})
    html = tables.kernel_table_html(kernels)
    cells = re.findall(r'<td title="([^"]*)">([^<]*)</td>', html)
    assert len(cells) == 1  # only the long name is cut
    full, shown = (unescape(x) for x in cells[0])
    assert full == name and len(shown) == tables.NAME_CHARS and shown.endswith("…")
    assert name.startswith(shown[:-1])
    assert HOSTILE not in html and "<td>short_k</td>" in html


def test_a_long_table_scrolls_in_its_own_box_and_says_so() -> None:
    from torchlens.render.tables import FOLD_ROWS, Column, html_table

    cols = [Column("step", "step", numeric=False)]
    short = str(html_table([{"step": f"ProfilerStep#{i}"} for i in range(FOLD_ROWS)], cols))
    long = str(html_table([{"step": f"ProfilerStep#{i}"} for i in range(115)], cols))
    assert "tl-fold" not in short and "rows: the table scrolls" not in short
    assert 'class="tl-table tl-fold"' in long and "115 rows: the table scrolls" in long
    assert long.count("<tr>") == 116  # every row is still there, header and 115
