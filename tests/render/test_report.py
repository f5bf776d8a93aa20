"""The HTML report and the notebook bundle: every shared trace, escaping, offline."""

from __future__ import annotations

import re
from html import unescape

import pytest
from render_fixtures import HOSTILE

from torchlens.formats.kineto import load_trace
from torchlens.frontends.kinds import display_bundle
from torchlens.frontends.kinds import report_html as render_report
from torchlens.frontends.kinds import summary as summary_line
from torchlens.frontends.kinds import text as text_report
from torchlens.model import Profile, load_profile, save_profile
from torchlens.render.page import stable_ids

TRACES = sorted(
    [
        "a100_ddp_resnet_rank0_nccl.json.gz", "a100_simple_add.json.gz",
        "amd_mi250_rocm.json.gz", "cpu_only_gloo_rank34.json.gz",
        "no_distributed_info.json.gz", "sampled_rank-0.json.gz",
        "sampled_rank-1.json.gz", "triton_compile.json.gz",
        "v100_ddp_sgd_annotations_rank0.json.gz",
    ]
)
NETWORK_REF = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*[\"']?\s*(?:https?:)?//",
                         re.IGNORECASE)
MAX_BYTES = 10 * 1024 * 1024


def _profile(traces_dir, name: str) -> Profile:
    return Profile(kind="trace", title=name, created_at=0.0,
                   traces={"main": load_trace(traces_dir / name)})


@pytest.mark.parametrize("name", TRACES)
def test_every_shared_trace_renders_offline(traces_dir, name: str) -> None:
    html = render_report(_profile(traces_dir, name))
    assert html.startswith("<!DOCTYPE html>") and "Bokeh" in html
    assert not NETWORK_REF.search(html)
    assert len(html.encode()) < MAX_BYTES
    for section in ("ops-main", "hints-main", "environment", "timeline-main"):
        assert f'id="{section}"' in html


def test_largest_trace_report_size(traces_dir) -> None:
    html = render_report(_profile(traces_dir, "v100_ddp_sgd_annotations_rank0.json.gz"))
    assert len(html.encode()) < MAX_BYTES
    assert 'id="kernels-main"' in html  # a GPU trace has the kernel table


def test_hostile_names_are_escaped(hostile_profile) -> None:
    html = render_report(hostile_profile)
    assert HOSTILE not in html
    assert "<script>alert(2)" not in html
    assert "k<b>bold</b>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    for section in ("unmeasured", "error", "ops-main", "timeline-main"):
        assert f'id="{section}"' in html
    assert not NETWORK_REF.search(html)


def test_render_is_deterministic(hostile_profile) -> None:
    assert render_report(hostile_profile) == render_report(hostile_profile)


def test_stable_ids_leave_names_alone() -> None:
    text = '{"id":"p1042","ref":{"id":"p1042"},"name":"p1043","doc":"0c2b8f1e-aaaa-4bbb-8ccc-123456789abc"}'
    assert stable_ids(text) == '{"id":"tl1","ref":{"id":"tl1"},"name":"p1043","doc":"tl2"}'


def test_saved_profile_renders_the_same_report(hostile_profile, tmp_path) -> None:
    path = save_profile(hostile_profile, tmp_path / "r.tlprof")
    assert render_report(load_profile(path)) == render_report(hostile_profile)


def test_bundle_iframe_survives_without_kernel(hostile_profile) -> None:
    bundle = display_bundle(hostile_profile)
    assert set(bundle) == {"text/html", "text/plain"}
    frame = bundle["text/html"]
    assert frame.startswith('<p id="torchlens-needs-js-')  # what an untrusted notebook shows
    frame = frame[frame.index("<iframe"):]
    assert frame.startswith("<iframe srcdoc=\"") and 'sandbox="allow-scripts"' in frame
    srcdoc = re.match(r'<iframe srcdoc="([^"]*)"', frame).group(1)
    # the whole report, escaped; BokehJS packed (each notebook output has its own)
    assert unescape(srcdoc) == render_report(hostile_profile, packed=True)
    assert "calls" in bundle["text/plain"]


def test_text_views(hostile_profile) -> None:
    line = summary_line(hostile_profile)
    assert "\n" not in line and "events" in line
    text = text_report(hostile_profile)
    assert text.splitlines()[0] == line and "self CPU" in text


def _section(html: str, anchor: str) -> str:
    start = html.index(f'id="{anchor}"')
    return html[start:html.index("</section>", start)]


def test_cpu_trace_steps_without_gpu_columns_with_a_chart(traces_dir) -> None:
    """Six always-zero GPU columns in the step table of a CPU trace;
    the step breakdown is also drawn as a stacked bar chart; "1 lanes"."""
    html = render_report(_profile(traces_dir, "no_distributed_info.json.gz"))
    steps = _section(html, "steps-main")
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", steps)
    assert headers[:2] == ["step", "step time"]
    assert not {"kernel", "memcpy", "memset", "runtime", "communication"} & set(headers)
    assert "time per role in each step" in html  # the chart's title, in the Bokeh document
    assert "data-root-id" in steps  # the chart's slot, above the table
    assert " in 1 lanes" not in html and " in 1 lane" in html
    gpu = render_report(_profile(traces_dir, "a100_ddp_resnet_rank0_nccl.json.gz"))
    assert {"kernel", "memcpy", "runtime", "communication"} <= set(
        re.findall(r"<th[^>]*>([^<]*)</th>", _section(gpu, "steps-main")))
