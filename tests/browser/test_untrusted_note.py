"""The line an untrusted notebook shows instead of a report goes away where
scripts run: the bundle's HTML put into a page as JupyterLab puts a trusted
output (innerHTML into a detached host, each script re-created, then attached),
and, for the untrusted case, with its scripts and iframe dropped."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torchlens.frontends import kinds
from torchlens.model import load_profile

V1 = Path(__file__).resolve().parents[1] / "data" / "v1"
NOTE = "This report needs JavaScript"

#: JupyterLab's renderHTML for a trusted output (rendermime's evalInnerHTMLScriptTags)
AS_LAB_DOES = """(markup) => {
  const host = document.createElement('div');
  host.innerHTML = markup;
  for (const script of Array.from(host.getElementsByTagName('script'))) {
    const clone = document.createElement('script');
    clone.textContent = script.textContent;
    script.parentNode.replaceChild(clone, script);
  }
  document.body.appendChild(host);
  return host.innerText;
}"""


def test_the_note_goes_where_scripts_run_and_stays_where_they_do_not(chromium: Any) -> None:
    bundle = kinds.display_bundle(load_profile(V1 / "gpumem.tlprof"))["text/html"]
    sanitized = re.sub(r"<(script|iframe)\b.*?</\1>", "", bundle, flags=re.S | re.I)
    page = chromium.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.set_content("<!DOCTYPE html><html><body></body></html>")
        assert NOTE not in page.evaluate(AS_LAB_DOES, bundle)
        assert page.locator("iframe").count() == 1
        # two reports in one page: each script removes its own line
        assert NOTE not in page.evaluate(AS_LAB_DOES, bundle + bundle)
        shown = page.evaluate(AS_LAB_DOES, sanitized)
        assert NOTE in shown and page.get_by_text(NOTE).first.is_visible()
    finally:
        page.close()
    assert not errors, errors
