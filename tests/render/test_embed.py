"""Embedding a report's figures: the page Bokeh's ``components`` writes, for less
work per shown result (every notebook cell that shows a report pays it).
"""

from __future__ import annotations

from typing import Any

import bokeh.embed
import pytest
import torch
from bokeh.core.validation.check import check_integrity
from bokeh.model import Model

import torchlens
from torchlens.frontends import kinds
from torchlens.render import embed
from torchlens.render.page import stable_ids


@pytest.fixture(scope="module")
def gpumem_profile() -> Any:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(16, 64)
    with torchlens.gpumem() as result:
        for _ in range(3):
            model(x).sum().backward()
    return result.profile


@pytest.fixture(params=["trace", "gpumem"])
def profile(request, hostile_profile, gpumem_profile) -> Any:
    return hostile_profile if request.param == "trace" else gpumem_profile


def _figures(profile: Any) -> list[Any]:
    figures: list[Any] = []
    kinds._resolve(kinds.kind_of(profile).report)(profile, kinds._or_analyze(profile, None),
                                                   figures)
    assert figures
    return figures


def test_embedded_figures_are_what_bokeh_components_writes(profile) -> None:
    ours = embed.components(_figures(profile))[:2]
    script, divs = bokeh.embed.components(_figures(profile))
    # ids differ between two builds; the page renames them in order (stable_ids)
    assert stable_ids(ours[0] + "".join(ours[1])) == stable_ids(script + "".join(divs))


def test_report_figures_pass_bokehs_validation(profile) -> None:
    """The page skips Bokeh's per-render validation: the figures must pass it here."""
    figures = _figures(profile)
    issues = check_integrity(set().union(*(f.references() for f in figures)))
    assert not issues.error and not issues.warning, issues


def test_a_warm_report_walks_each_figure_once(profile, monkeypatch) -> None:
    """Each walk of a figure's models reads every property of every model: the
    warm cell's report spent most of its time in five walks per figure."""
    kinds.report_html(profile, packed=True)  # a warm cell: not the process's first report
    walks: dict[str, int] = {}
    real = Model.references

    def counted(self: Model) -> set[Model]:
        walks[self.id] = walks.get(self.id, 0) + 1
        return real(self)

    def callbacks_walk(models: Any) -> bool:  # components' check for Python callbacks
        for m in models:
            walks[m.id] = walks.get(m.id, 0) + 1
        return False

    monkeypatch.setattr(Model, "references", counted)
    monkeypatch.setattr("bokeh.embed.util.submodel_has_python_callbacks", callbacks_walk)
    kinds.report_html(profile, packed=True)
    assert walks and max(walks.values()) == 1, walks


def test_a_shown_report_reads_bokehjs_from_disk_once(profile, monkeypatch) -> None:
    """Inlining BokehJS read its 1.3 MB files three times per shown report."""
    from bokeh.resources import Resources

    reads: list[str] = []
    real = Resources._inline

    def counted(path: Any) -> str:
        reads.append(str(path))
        return real(path)

    monkeypatch.setattr(Resources, "_inline", staticmethod(counted))
    first = kinds.report_html(profile, packed=True)
    reads.clear()
    assert kinds.report_html(profile, packed=True) == first
    assert reads == []


def test_bokehjs_holds_the_bundles_the_figures_need() -> None:
    """The inlined BokehJS follows the figures: WebGL's bundle only for a WebGL plot."""
    from bokeh.plotting import figure

    from torchlens.render.page import _bokehjs

    def plot(backend: str) -> Any:
        fig = figure(output_backend=backend)
        fig.line([0, 1], [0, 1])
        return fig

    def bokehjs(backend: str) -> str:
        models = embed.components([plot(backend)])[2]  # the models the page hands on
        return _bokehjs(models, packed=False)

    assert "BEGIN bokeh-gl" in bokehjs("webgl")
    assert "BEGIN bokeh-gl" not in bokehjs("canvas")
    assert "BEGIN bokeh-gl" in bokehjs("webgl")


def test_gpumem_figures_carry_no_glyph_copies(gpumem_profile) -> None:
    """No tool selects and no legend mutes in the gpumem figures: BokehJS derives
    the non-selection and muted copies itself, so none is built and serialized
    (Bokeh's glyph methods made two per renderer: 142 models in the warm cell's report)."""
    from bokeh.models import GlyphRenderer

    figures = _figures(gpumem_profile)
    renderers = [m for f in figures for m in f.references() if isinstance(m, GlyphRenderer)]
    assert len(renderers) >= 5
    assert all(r.nonselection_glyph == "auto" and r.muted_glyph == "auto" for r in renderers)
    assert all(legend.click_policy != "mute" for f in figures for legend in f.legend)


def test_trace_figures_carry_no_invisible_grid(hostile_profile) -> None:
    """A grid whose lines are not drawn paints nothing: it only cost every shown
    report a model to build, walk and serialize."""
    from bokeh.models import Grid

    figures = _figures(hostile_profile)
    grids = [m for f in figures for m in f.references() if isinstance(m, Grid)]
    assert len(grids) == len(figures)  # one drawn grid each: time or ms lines
    assert all(g.grid_line_color is not None for g in grids)


@pytest.mark.parametrize("broken", ["moved", "reshaped"])
def test_a_bokeh_whose_internals_moved_still_gets_the_same_page(profile, monkeypatch,
                                                              broken) -> None:
    """The fast path reads Bokeh internals; a Bokeh release that moves them (the CI
    installs the latest) must still give the page ``components`` writes, not an error."""
    if broken == "moved":
        monkeypatch.setattr(embed, "RenderItem", None)
    else:
        def reshaped(*_: Any, **__: Any) -> Any:
            raise TypeError("RenderItem() got an unexpected keyword argument 'roots'")

        monkeypatch.setattr(embed, "RenderItem", reshaped)
    figures = _figures(profile)
    script, divs, models = embed.components(figures)
    want_script, want_divs = bokeh.embed.components(_figures(profile))
    assert stable_ids(script + "".join(divs)) == stable_ids(want_script + "".join(want_divs))
    assert set(figures) <= models  # the bundle check gets every model
