"""A report shown in a notebook that Jupyter does not trust (reopened after an
edit elsewhere, a colleague's copy): the sanitizer drops scripts and the
iframe, so the output says why it is empty and what to do; where scripts run
(tests/browser/test_untrusted_note.py), that line is removed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchlens.frontends import kinds
from torchlens.model import load_profile

V1 = Path(__file__).resolve().parents[1] / "data" / "v1"
LINE = ("This report needs JavaScript, which Jupyter does not run in an untrusted notebook: "
        "trust it (Command Palette: Trust Notebook) or re-run the cell.")


def untrusted_view(markup: str) -> str:
    """What a sanitizer leaves to read: no scripts, no iframes, the text of the rest."""
    markup = re.sub(r"<script\b.*?</script>", "", markup, flags=re.S | re.I)
    markup = re.sub(r"<iframe\b.*?</iframe>", "", markup, flags=re.S | re.I)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", markup)).strip()


@pytest.mark.parametrize("kind", ["torchprof", "gpumem", "ddp_check"])
def test_an_untrusted_notebook_says_why_the_report_is_blank(kind: str) -> None:
    bundle = kinds.display_bundle(load_profile(V1 / f"{kind}.tlprof"))["text/html"]
    assert untrusted_view(bundle) == LINE
