"""The layer rules of /work/shared/DESIGN.md ("Layers"), read from the imports.

Every ``.py`` under ``torchlens/`` is parsed with ``ast``; every import counts,
at module level or inside a function (or under ``TYPE_CHECKING``), with
relative imports resolved to absolute module names. A failure lists each
offending (file, line, imported module).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "torchlens"

#: layer -> (allowed torchlens prefixes or None for "any", forbidden prefixes)
RULES: dict[str, tuple[tuple[str, ...] | None, tuple[str, ...]]] = {
    "torchlens.model": (("torchlens.model",), ()),
    "torchlens.formats": (("torchlens.model", "torchlens.formats"), ()),
    "torchlens.capture": (None, ("torchlens.render", "torchlens.frontends",
                                 "torchlens.analysis")),
    "torchlens.analysis": (None, ("torch", "torchlens.capture", "torchlens.render",
                                  "torchlens.frontends")),
    "torchlens.render": (None, ("torchlens.capture", "torchlens.frontends")),
}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: Path, root: Path = PACKAGE) -> str:
    """``torchlens/a/b.py`` -> ``torchlens.a.b``; a package's ``__init__`` -> the package."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(source: str, module: str, is_package: bool,
            known: set[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in ``source``.

    ``from X import y`` names ``X.y`` when that is a module of ours (in
    ``known``), else ``X``; ``from . import y`` likewise after resolving the dots.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub if sub in known else target))
    return sorted(set(found))


def violations(layer: str, module: str, found: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The imports in ``found`` that break ``layer``'s rule."""
    allowed, forbidden = RULES[layer]
    bad = []
    for line, name in found:
        if any(_under(name, f) for f in forbidden):
            bad.append((line, name))
        elif allowed is not None and _under(name, "torchlens") and not any(
                _under(name, a) for a in allowed):
            bad.append((line, name))
    return bad


def _all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_checker_catches_a_violation():
    source = (
        "import numpy\n"
        "from ..model import Profile\n"
        "def f():\n"
        "    from .. import render\n"
        "    from ..frontends.cli import main\n"
        "    import torch.cuda\n"
    )
    known = {"torchlens.render", "torchlens.frontends", "torchlens.frontends.cli"}
    found = imports(source, "torchlens.analysis.x", False, known)
    assert found == [(1, "numpy"), (2, "torchlens.model"), (4, "torchlens.render"),
                     (5, "torchlens.frontends.cli"), (6, "torch.cuda")]
    assert violations("torchlens.analysis", "torchlens.analysis.x", found) == [
        (4, "torchlens.render"), (5, "torchlens.frontends.cli"), (6, "torch.cuda")]
    # the model may import only itself; a package's own ``from . import``
    found = imports("from . import store\nfrom ..analysis import ops\nimport torchlens\n",
                    "torchlens.model", True, {"torchlens.model.store"})
    assert found == [(1, "torchlens.model.store"), (2, "torchlens.analysis"),
                     (3, "torchlens")]
    assert violations("torchlens.model", "torchlens.model", found) == [
        (2, "torchlens.analysis"), (3, "torchlens")]


@pytest.mark.parametrize("layer", sorted(RULES))
def test_layer_imports(layer):
    modules = _all_modules()
    known = set(modules)
    offending = []
    for name, path in modules.items():
        if not _under(name, layer):
            continue
        found = imports(path.read_text(encoding="utf-8"), name,
                        path.name == "__init__.py", known)
        offending += [f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}"
                      for line, imported in violations(layer, name, found)]
    assert not offending, f"{layer} breaks its layer rule:\n  " + "\n  ".join(offending)
