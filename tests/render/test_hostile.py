"""Hostile text in every field that reaches a report, for every kind of result.

Each user-controlled string (titles, sources, environment, op and kernel names,
shapes, stacks, hints, allocation frames, error messages and tracebacks, rank
devices, logs, hang stacks, collectives) is a distinct tagged copy of
``HOSTILE`` (markup, a script end tag and quotes), so each test can say which
field reached which section, escaped. The same profile built with harmless
strings says how many ``<script`` tags the report itself has: the hostile one
must have no more.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import unescape

import pytest
from markupsafe import escape
from render_fixtures import make_trace

from torchlens.frontends import kinds
from torchlens.model import (
    DdpRun,
    GpumemPayload,
    OpDisplay,
    Profile,
    Table,
    TorchprofPayload,
)
from torchlens.model.collectives import Fingerprint
from torchlens.model.findings import Figure, Finding
from torchlens.model.messages import MemoryReading
from torchlens.model.payloads import HangInfo
from torchlens.model.snapshot import normalize_snapshot

PARTS = ("<img src=x onerror=alert(1)>", "</script><script>alert(2)</script>",
         "\"'><svg onload=alert(3)>")
HOSTILE = "".join(PARTS)

Mark = Callable[[str], str]


def hostile(tag: str) -> str:
    return f"[{tag}]{HOSTILE}"


def benign(tag: str) -> str:
    return f"[{tag}]benign"


# ---- one profile of each kind, every text field from ``s(tag)`` --------------------------

def torchprof_profile(s: Mark) -> tuple[Profile, object]:
    def trace(prefix: str):
        return make_trace([
            {"name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 1000,
             "pid": 1, "tid": 1},
            {"name": f"{s(prefix + 'file')}.py(3): {s(prefix + 'func')}",
             "cat": "python_function", "ts": 5, "dur": 600, "pid": 1, "tid": 1},
            {"name": s(prefix + "op"), "cat": "cpu_op", "ts": 10, "dur": 500, "pid": 1,
             "tid": 1, "input_dims": "[[2,3]]" + s(prefix + "shape"), "external_id": 7,
             "flops": 1e9},
            {"name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 20, "dur": 5,
             "pid": 1, "tid": 1, "correlation": 99, "external_id": 7},
            {"name": s(prefix + "kernel"), "cat": "kernel", "ts": 40, "dur": 300, "pid": 0,
             "tid": 7, "device": 0, "stream": 7, "correlation": 99, "external_id": 7},
        ], meta={"source": s(prefix + "meta")})

    profile = Profile(
        kind="torchprof", title=s("title"), created_at=1_700_000_000.0, wall_time_s=0.01,
        source=s("source"),
        environment={"torch": s("env-value"), s("env-key"): {"nested": [s("env-list")]}},
        payload=TorchprofPayload(display=OpDisplay(top=10, shapes=True, flops=True,
                                                   stack=True)),
        traces={"main": trace(""), s("trace-key"): trace("2-")},
        unmeasured=[s("unmeasured")],
        error={"type": s("error-type"), "message": s("error-message"),
               "traceback": s("traceback"), s("error-key"): s("error-value")},
    )
    analysis = kinds.analyze(profile)
    for view in analysis.views:  # hints are analysis text: add one made of user text
        view.hints = [*view.hints, Finding(s("severity"), s("hint-detail"),
                                           (Figure(s("evidence-key"), s("evidence-value")),),
                                           s("hint-advice"), s("hint-title"))]
    return profile, analysis


def _frames(s: Mark, line: int) -> list[dict]:
    return [{"filename": "/x/site-packages/torch/nn/functional.py", "line": 1, "name": "linear"},
            {"filename": f"<{s('frame-file')}.py", "line": line, "name": s("frame-func")}]


def gpumem_profile(s: Mark) -> tuple[Profile, object]:
    """A CPU capture of three passes, each leaving 3 MiB behind, then one 64 MiB
    allocation that the allocator model (40 MiB card) cannot serve: every section."""
    trace, t = [], 0
    for i in range(3):
        small = 0x100000 * (i + 1)
        trace += [
            {"action": "alloc", "addr": 0x1000 * (i + 1), "size": 3 << 20, "stream": 0,
             "time_us": t, "frames": _frames(s, 2)},
            {"action": "alloc", "addr": small, "size": 4096, "stream": 0, "time_us": t + 1,
             "frames": _frames(s, 3)},
            {"action": "free_requested", "addr": small, "size": 4096, "stream": 0,
             "time_us": t + 2, "frames": _frames(s, 3)},
            {"action": "free_completed", "addr": small, "size": 4096, "stream": 0,
             "time_us": t + 3, "frames": _frames(s, 3)},
        ]
        t += 10
    trace.append({"action": "alloc", "addr": 0x9000000, "size": 64 << 20, "stream": 0,
                  "time_us": t, "frames": _frames(s, 4)})
    profile = Profile(
        kind="gpumem", title=s("title"), created_at=1_700_000_000.0, source=s("source"),
        environment={"host": s("env-value"), s("env-key"): s("env-value2")},
        payload=GpumemPayload(measured_on="cpu", simulate=True, capacity=40 << 20,
                              runs=[(0, 9), (10, 19), (20, 29)], repeat=3),
        snapshots={"main": normalize_snapshot({"segments": [], "device_traces": [trace]})},
        unmeasured=[s("unmeasured")],
        error={"type": "OutOfMemoryError", "message": "CUDA out of memory. " + s("oom-message"),
               "traceback": s("traceback")},
    )
    return profile, None


def ddp_profile(s: Mark) -> tuple[Profile, object]:
    """Rank 0 raised, rank 1 died silently and a hang was recorded: every section."""
    error = {"type": s("error-type"), "message": s("error-message"),
             "traceback": s("rank-traceback"), "phase": "step", "t": 1.0}
    rank0 = {"rank": 0, "pid": 11, "device": s("device"),
             "env_start": {"RANK": "0", "WORLD_SIZE": "2"},
             "steps": [{"step": 0, "start": 0.0, "end": 0.5}], "error": error,
             "log": s("log"), "versions": {"torch": s("version")}}
    run = DdpRun(
        world_size=2, backend="gloo", outcome="crashed", steps=1, t0=0.0,
        ranks=[rank0, None],
        fingerprints=[[Fingerprint(index=0, op=s("op"), shapes=[[s("shape"), 2]],  # type: ignore[list-item]
                                   dtypes=[s("dtype")], line=s("line"), t=1.0,
                                   call_s=0.001)], []],
        exit_codes=[1, -6],
        hang=HangInfo(stacks=[s("stack0"), s("stack1")], after_s=3.0,
                      status=[{"phase": s("phase"), "last": None}, None]),
        memory_peak=[MemoryReading(rss=1 << 20, tensor_bytes=4096), None],
    )
    beats = [{"t_rel": 0.1 * i, "rank": i % 2, "phase": s("beat-phase") if i % 3 else "step",
              "collectives": i, "rss": 1 << 20, "tensor_bytes": 4096.0,
              "cuda_allocated": float("nan")} for i in range(6)]
    profile = Profile(
        kind="ddp_check", title=s("title"), created_at=1_700_000_000.0, source=s("source"),
        environment={"host": s("env-value"), s("env-key"): [s("env-list")]}, payload=run,
        tables={"heartbeats": Table.from_records(beats, text=("phase",))},
        unmeasured=[s("unmeasured")],
        error={"type": s("kernel-error-type"), "message": s("kernel-error"),
               "traceback": s("traceback")},
    )
    return profile, None


# ---- what each report must show: section id -> tags whose text it must hold ------------

COMMON = {"environment": ["env-value", "env-key"], "unmeasured": ["unmeasured"],
          "error": ["traceback"]}
EXPECTED: dict[str, tuple[Callable[[Mark], tuple[Profile, object]], dict[str, list[str]]]] = {
    "torchprof": (torchprof_profile, {
        **COMMON,
        "environment": ["env-value", "env-key", "env-list"],
        "error": ["error-type", "error-message", "traceback", "error-key", "error-value"],
        "hints-main": ["severity", "hint-title", "hint-detail", "hint-advice", "evidence-key",
                       "evidence-value"],
        "ops-main": ["op", "shape", "func", "file"],
        "kernels-main": ["kernel"], "steps-main": [], "timeline-main": [],
    }),
    "gpumem": (gpumem_profile, {
        **COMMON,
        "environment": ["env-value", "env-key", "env-value2"],
        "error": ["oom-message", "traceback"],
        "oom": ["frame-file"], "summary": [], "simulate": [], "timeline": [],
        "sites": ["frame-file", "frame-func"], "leaks": ["frame-file", "frame-func"],
        "growth": [], "fragmentation": [],
    }),
    "ddp_check": (ddp_profile, {
        **COMMON,
        "environment": ["env-value", "env-key", "env-list"],
        "error": ["kernel-error-type", "kernel-error", "traceback"],
        "checklist": ["device", "version", "error-type", "error-message", "op", "dtype",
                      "shape", "line", "phase"],
        "stacks": ["stack0", "stack1", "rank-traceback"],
        "ranks-plot": [], "ranks": ["device", "error-type", "error-message"],
        "collectives": ["op", "line", "shape", "dtype"], "logs": ["log"],
    }),
}


def _sections(html: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for anchor, body in re.findall(r'<section id="([^"]*)">(.*?)</section>', html, re.S):
        out[anchor] = out.get(anchor, "") + body
    return out


def _header(html: str) -> str:
    return html[html.index("<body>"):html.index("<section")]


def _assert_clean(html: str) -> None:
    for part in PARTS:
        assert part not in html
    assert "<svg onload" not in html and "<img src=x" not in html  # BokehJS has its own <svg
    assert "alert(2)</script>" not in html
    assert str(escape(HOSTILE)) in html


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def rendered(request) -> tuple[str, Profile, object, str]:
    build, _ = EXPECTED[request.param]
    profile, analysis = build(hostile)
    return request.param, profile, analysis, kinds.report_html(profile, analysis)


def test_hostile_text_never_appears_raw(rendered) -> None:
    kind, _, _, html = rendered
    _assert_clean(html)
    assert str(escape(hostile("title"))) in html[:html.index("</head>")]  # <title>
    header = _header(html)
    for tag in ("title", "source"):
        assert str(escape(hostile(tag))) in header, (kind, tag)


def test_every_section_is_there_with_its_fields_escaped(rendered) -> None:
    kind, _, _, html = rendered
    sections = _sections(html)
    for anchor, tags in EXPECTED[kind][1].items():
        assert anchor in sections, (kind, anchor)
        for tag in tags:
            assert str(escape(hostile(tag))) in sections[anchor], (kind, anchor, tag)


def test_no_script_but_the_reports_own(rendered) -> None:
    kind, _, _, html = rendered
    build, _ = EXPECTED[kind]
    profile, analysis = build(benign)
    plain = kinds.report_html(profile, analysis)
    assert html.count("<script") == plain.count("<script") > 0
    assert html.lower().count("<script") == plain.lower().count("<script")
    assert len(_sections(html)) == len(_sections(plain))


def test_bundle_escapes_the_whole_report(rendered) -> None:
    kind, profile, analysis, html = rendered
    frame = kinds.display_bundle(profile, analysis)["text/html"]
    # the fixed line an untrusted notebook shows (and its remover), then the report
    # and the fixed script that fits the frame to it
    m = re.fullmatch(r'<p id="torchlens-needs-js-[0-9a-f]{12}" class="torchlens-needs-js">'
                     r'<b>[^<>]*</b></p><script>[^<>]*</script>'
                     r'<iframe srcdoc="([^"]*)" sandbox="allow-scripts" [^<>]*></iframe>'
                     r'<script>[^<>]*</script>',
                     frame.strip())
    assert m, frame[:200]
    assert "<" not in m.group(1) and ">" not in m.group(1)
    # the notebook's copy: the same report with BokehJS packed (kinds.display_bundle)
    assert unescape(m.group(1)) == kinds.report_html(profile, analysis, packed=True)
    _assert_clean(unescape(m.group(1)))


def test_text_view_is_plain_text(rendered) -> None:
    kind, profile, analysis, _ = rendered
    text = kinds.text(profile, analysis)
    assert isinstance(text, str) and text
    assert "&lt;" not in text  # text/plain: shown as written, never HTML-escaped
    tag = {"torchprof": "op", "gpumem": "frame-file", "ddp_check": "device"}[kind]
    assert hostile(tag) in text


def test_fragments_escape_a_plain_string_passed_as_a_body() -> None:
    """A section body that is not template output is shown as text, not run."""
    from torchlens.render.page import section

    out = section(HOSTILE, HOSTILE, HOSTILE)
    _assert_clean(out)
    assert out.count("<section") == 1 and out.count('id="') == 1
