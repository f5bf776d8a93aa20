"""Who may import whom (docs/ARCHITECTURE.md), read from the imports.

Every ``.py`` under ``torchlens/`` is parsed with ``ast``; every import counts,
at module level or inside a function (or under ``TYPE_CHECKING``), with
relative imports resolved to absolute module names. A failure lists each
offending (file, line, imported module). The rules:

- layers (``RULES``): model, formats, capture, analysis and render import
  only what lies below them;
- private names: a module of ``PRIVATE_RULE_SCOPES`` (every layer) uses no
  other module's private (underscore-prefixed) name, imported or reached as
  an attribute (``private_uses``);
- front-end rooms: a domain's folder in frontends/ imports only the shared
  front-end modules and itself (``SHARED_FRONTENDS``), and no front-end
  modules import each other round a circle (here annotations under
  ``TYPE_CHECKING`` do not count: they run nothing);
- below the front ends, no modules import each other round a circle by any
  import at all, annotations and imports inside functions included
  (``STRICT_CYCLE_LAYERS``);
- domains import one way (``DOMAIN_USES``) in capture/, analysis/ and render/.
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


def _from_target(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from X import y`` reads, relative dots resolved."""
    if not node.level:
        return node.module or ""
    base = (module if is_package else module.rpartition(".")[0]).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(source: str, module: str, is_package: bool,
            known: set[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in ``source``.

    ``from X import y`` names ``X.y`` when that is a module of ours (in
    ``known``), else ``X``; ``from . import y`` likewise after resolving the dots.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, module, is_package)
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


# ------------------------------------------------------- private names stay home
#: every layer: a name another module needs is made public where it is defined
PRIVATE_RULE_SCOPES = ("torchlens.model", "torchlens.formats", "torchlens.render",
                       "torchlens.analysis", "torchlens.capture", "torchlens.frontends")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, ``module.name``) for each private name of another torchlens module
    that ``source`` uses: ``from torchlens.x import _y`` (relative imports
    resolved), ``import torchlens._x``, and ``m._y`` where ``m`` names a
    torchlens module or object imported in ``source``."""
    found: list[tuple[int, str]] = []
    bound: dict[str, str] = {}  # local name -> what it was imported as
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _under(alias.name, "torchlens"):
                    continue
                if any(_private(part) for part in alias.name.split(".")):
                    found.append((node.lineno, alias.name))
                if alias.asname:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, module, is_package)
            if not _under(target, "torchlens"):
                continue
            for alias in node.names:
                if _private(alias.name) or any(_private(p) for p in target.split(".")):
                    found.append((node.lineno, f"{target}.{alias.name}"))
                bound[alias.asname or alias.name] = f"{target}.{alias.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in bound and _private(node.attr)):
            found.append((node.lineno, f"{bound[node.value.id]}.{node.attr}"))
    return sorted(set(found))


def _private_offenders(scope: str) -> list[str]:
    out = []
    for name, path in _all_modules().items():
        if _under(name, scope):
            out += [f"{path.relative_to(PACKAGE.parent)}:{line} uses {used}"
                    for line, used in private_uses(path.read_text(encoding="utf-8"), name,
                                                   path.name == "__init__.py")]
    return out


def test_private_rule_catches_each_form():
    source = (
        "import numpy._core\n"
        "import torchlens.render.html as h\n"
        "from torchlens.render.ddp.heartbeats import _columns, plot\n"
        "from ..ddp import heartbeats as hb\n"
        "from . import _shared\n"
        "from torchlens.model.units import __all__, plural\n"
        "import torchlens._private\n"
        "def f(x):\n"
        "    hb._mib(x); h.render(x); x._own; plot._cache; hb.__name__\n"
        "    from torchlens.render.tables import _field\n"
    )
    assert private_uses(source, "torchlens.render.ranks.bands", False) == [
        (3, "torchlens.render.ddp.heartbeats._columns"),
        (5, "torchlens.render.ranks._shared"),
        (7, "torchlens._private"),
        (9, "torchlens.render.ddp.heartbeats._mib"),
        (9, "torchlens.render.ddp.heartbeats.plot._cache"),
        (10, "torchlens.render.tables._field"),
    ]
    # a module's own names, other packages' private names, and dunders are fine
    clean = "import numpy as np\nnp._NoValue\n_x = 1\nfrom typing import _T\n"
    assert private_uses(clean, "torchlens.render.x", False) == []


@pytest.mark.parametrize("scope", PRIVATE_RULE_SCOPES)
def test_no_module_uses_another_modules_private_names(scope):
    assert sum(_under(name, scope) for name in _all_modules()) > 3, scope  # it reads modules
    offending = _private_offenders(scope)
    assert not offending, (
        f"{scope}: modules use other modules' private (underscore) names; make the name "
        "public where it is defined, or move it to where both can use it:\n  "
        + "\n  ".join(offending))


# ------------------------------------------------------- front ends never judge
#: what a front end may take from ``torchlens.model.findings``: the line a
#: result hands out and the reader of a finding a saved file holds
FRONTEND_FINDING_NAMES = {"FindingLine", "as_finding"}
#: the rules that judge a run: a front end calls the kinds' entry points in
#: analysis (``analysis.runs.verdict.folder_verdict``, ``analysis.ddp.profiled.
#: profiled_slow_rank``, ...), never these
JUDGES = {"slow_rank", "weak", "slow_rank_finding", "memory_creep", "creep_finding",
          "collector_notes", "failure_finding", "folder_slow_rank", "verdict_findings",
          "leading_findings", "straggler_rows", "findings", "checklist"}


def judging(source: str) -> list[tuple[int, str]]:
    """Where ``source`` builds a finding (a call of ``Finding``), imports what
    only analysis may (a severity, ``Finding`` itself) from the findings
    module, or imports one of ``JUDGES``: (line, what)."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else ""
            if name == "Finding":
                bad.append((node.lineno, "Finding("))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchlens"):
            for alias in node.names:
                if (node.module == "torchlens.model.findings"
                        and alias.name not in FRONTEND_FINDING_NAMES) or alias.name in JUDGES:
                    bad.append((node.lineno, f"{node.module}.{alias.name}"))
    return bad


def test_judging_checker_catches_each_form():
    source = ("from torchlens.model.findings import WARNING, FindingLine, as_finding\n"
              "from torchlens.analysis.ranks.slow import slow_rank\n"
              "from torchlens.analysis.runs.verdict import folder_verdict\n"
              "import torchlens.model.findings as f\n"
              "x = f.Finding('info', 'said here')\n")
    assert judging(source) == [(1, "torchlens.model.findings.WARNING"),
                               (2, "torchlens.analysis.ranks.slow.slow_rank"),
                               (5, "Finding(")]


def test_front_ends_never_judge():
    """Every verdict and finding a view shows is worked out in analysis; a
    front end loads, dispatches and shows it."""
    offending = [f"{path.relative_to(PACKAGE.parent)}:{line} {what}"
                 for name, path in _all_modules().items() if _under(name, "torchlens.frontends")
                 for line, what in judging(path.read_text(encoding="utf-8"))]
    assert not offending, "front ends judge:\n  " + "\n  ".join(offending)


# ------------------------------------------------------ front ends, one room per domain
FRONTENDS = "torchlens.frontends"
#: a folder of frontends/ per domain: each imports only SHARED_FRONTENDS and itself
FRONTEND_DOMAINS = ("trace", "memory", "ddp", "ranks", "runs", "monitor")
#: what every domain's front end may use: the result base, the registry of kinds,
#: export, and shared/ (running a cell, preloading, BokehJS, the live view of a
#: rank job, publishing to the Jupyter server). ``loading`` (``load`` and ``diff``
#: pick the domain from the input), notebook/, cli/ and server/ may import any domain.
SHARED_FRONTENDS = (FRONTENDS, f"{FRONTENDS}.result", f"{FRONTENDS}.kinds",
                    f"{FRONTENDS}.export", f"{FRONTENDS}.shared")


def frontend_room(module: str) -> str | None:
    """The domain of a front-end module (``torchlens.frontends.ranks.watch`` -> ``ranks``),
    ``"shared"`` for a shared module, else None (loading, notebook/, cli/, server/)."""
    if any(module == s or module.startswith(s + ".") for s in SHARED_FRONTENDS[1:]):
        return "shared"
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[2] in FRONTEND_DOMAINS else None


def frontend_violations(module: str, found: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The imports of front-end ``module`` that leave its room: a domain's front end
    imports only the shared modules and its own domain; a shared module only shared ones."""
    room = frontend_room(module)
    if room is None:
        return []
    bad = []
    for line, name in found:
        if not _under(name, FRONTENDS) or name == FRONTENDS:
            continue
        other = frontend_room(name)
        if other != "shared" and other != room:
            bad.append((line, name))
    return bad


def test_frontend_checker_catches_a_crossing():
    found = [(1, "torchlens.frontends.result"), (2, "torchlens.frontends.ranks.watch"),
             (3, "torchlens.frontends.ddp.api"), (4, "torchlens.frontends.loading"),
             (5, "torchlens.frontends.shared.cells"), (6, "torchlens.render.ddp.report"),
             (7, "torchlens.frontends.cli.main")]
    assert frontend_violations("torchlens.frontends.ddp.api", found) == [
        (2, "torchlens.frontends.ranks.watch"), (4, "torchlens.frontends.loading"),
        (7, "torchlens.frontends.cli.main")]
    assert frontend_violations("torchlens.frontends.shared.preload", found) == [
        (2, "torchlens.frontends.ranks.watch"), (3, "torchlens.frontends.ddp.api"),
        (4, "torchlens.frontends.loading"), (7, "torchlens.frontends.cli.main")]
    assert frontend_violations("torchlens.frontends.cli.main", found) == []


def test_frontend_domains_import_only_shared_modules_and_themselves():
    modules = _all_modules()
    known = set(modules)
    rooms = {frontend_room(n) for n in modules if _under(n, FRONTENDS)}
    assert set(FRONTEND_DOMAINS) | {"shared"} <= rooms  # every room exists and is read
    offending = []
    for name, path in modules.items():
        if not _under(name, FRONTENDS):
            continue
        found = imports(path.read_text(encoding="utf-8"), name, path.name == "__init__.py",
                        known)
        offending += [f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}"
                      for line, imported in frontend_violations(name, found)]
    assert not offending, ("a front end imports another domain's front end (move what both "
                           "need to frontends/shared or to a lower layer):\n  "
                           + "\n  ".join(offending))


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(source: str, module: str, is_package: bool,
                    known: set[str]) -> set[str]:
    """The modules of ``known`` that ``source`` imports when it runs: at module level
    or inside a function, not under ``if TYPE_CHECKING:`` (annotations only)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(name for _, name in imports(ast.unparse(node), module,
                                                     is_package, known))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return {name for name in found if name in known and name != module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of two or more modules that import each other round a circle
    (the strongly connected components of ``graph``), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_cycle_finder():
    known = {"p.a", "p.b", "p.c"}
    assert runtime_imports("import p.b\nif TYPE_CHECKING:\n    import p.c\n"
                           "def f():\n    from p import c\n", "p.a", False, known) == {"p.b", "p.c"}
    assert runtime_imports("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    import p.c\nelse:\n    import p.b\n", "p.a", False,
                           known) == {"p.b"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"c"}}) == []


def test_no_import_cycle_among_frontends():
    modules = {n: p for n, p in _all_modules().items() if _under(n, FRONTENDS)}
    known = set(modules)
    graph = {n: runtime_imports(p.read_text(encoding="utf-8"), n, p.name == "__init__.py",
                                known) for n, p in modules.items()}
    assert sum(map(len, graph.values())) > 30  # it reads the imports
    circles = cycles(graph)
    assert not circles, "front-end modules import each other in a circle:\n  " + "\n  ".join(
        " <-> ".join(c) for c in circles)


#: the layers below the front ends, where no two modules may import each other round
#: a circle by any import at all: one inside a function or under ``TYPE_CHECKING`` (an
#: annotation of the other's class) still means neither can be read without the other
STRICT_CYCLE_LAYERS = ("torchlens.model", "torchlens.formats", "torchlens.capture",
                       "torchlens.analysis", "torchlens.render")


def _strict_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    known = set(modules)
    return {n: {m for _, m in imports(p.read_text(encoding="utf-8"), n,
                                      p.name == "__init__.py", known)
                if m in known and m != n}
            for n, p in modules.items()}


def test_strict_cycle_check_counts_annotations_and_late_imports(tmp_path):
    pkg = tmp_path / "torchlens" / "model"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from torchlens.model.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from torchlens.model.a import A\n")
    (pkg / "c.py").write_text("import torchlens.model.a\n")
    modules = {module_name(p, tmp_path / "torchlens"): p for p in sorted(pkg.glob("*.py"))}
    assert cycles(_strict_graph(modules)) == [["torchlens.model.a", "torchlens.model.b"]]


def test_no_import_cycle_below_the_front_ends():
    """The allocator model (core, expandable, release, state: each takes the
    ``heap.AllocatorHeap`` below them) and the saved profile (profile, tlprof,
    store: ``tlprof`` writes a profile's fields, never a ``Profile``) once imported
    each other; every layer below the front ends stays free of such circles."""
    modules = {n: p for n, p in _all_modules().items()
               if any(_under(n, layer) for layer in STRICT_CYCLE_LAYERS)}
    graph = _strict_graph(modules)
    assert {"torchlens.analysis.memory.allocator.core",
            "torchlens.model.store"} <= set(graph)
    assert sum(map(len, graph.values())) > 300  # it reads the imports
    circles = cycles(graph)
    assert not circles, ("modules import each other in a circle (move what both need "
                         "into a module below them):\n  " + "\n  ".join(
                             " <-> ".join(c) for c in circles))


# ------------------------------------------------------------- domains import one way
#: In capture/, analysis/ and render/, a domain's modules import those of the domains
#: listed here (in any of the three layers) and their own, never the reverse: what two
#: domains both need lives in the lower one (a trace's GPU work and comm overlap in
#: trace/, FSDP's hooks in capture/ranks/).
DOMAIN_USES: dict[str, tuple[str, ...]] = {
    "trace": (),
    "memory": ("trace",),
    "ranks": ("trace", "memory"),
    "ddp": ("trace", "memory", "ranks"),
    "runs": ("trace", "memory", "ranks", "ddp"),
    "monitor": ("trace", "memory", "ranks"),
}
DOMAIN_LAYERS = ("torchlens.capture", "torchlens.analysis", "torchlens.render")
#: a domain's modules outside its folder
DOMAIN_MODULES = {"torchlens.analysis.monitor_metrics": "monitor"}


def domain_of(module: str) -> str | None:
    """``torchlens.analysis.ranks.slow`` -> ``ranks``; None for a module shared by
    every domain (``render.columns``) or outside capture/, analysis/ and render/."""
    for name, domain in DOMAIN_MODULES.items():
        if _under(module, name):
            return domain
    parts = module.split(".")
    if ".".join(parts[:2]) in DOMAIN_LAYERS and len(parts) > 3 and parts[2] in DOMAIN_USES:
        return parts[2]
    return None


def domain_violations(module: str, found: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The imports of ``module`` that reach a domain its own may not use."""
    own = domain_of(module)
    if own is None:
        return []
    return [(line, name) for line, name in found
            if domain_of(name) not in (None, own, *DOMAIN_USES[own])]


def test_domain_checker_catches_a_reverse_import():
    found = [(1, "torchlens.analysis.runs.comm_overlap"), (2, "torchlens.analysis.trace.gpu"),
             (3, "torchlens.render.ddp.heartbeats"), (4, "torchlens.render.columns"),
             (5, "torchlens.capture.ranks.stepper"), (6, "torchlens.analysis.monitor_metrics")]
    assert domain_violations("torchlens.analysis.ranks.summary", found) == [
        (1, "torchlens.analysis.runs.comm_overlap"), (3, "torchlens.render.ddp.heartbeats"),
        (6, "torchlens.analysis.monitor_metrics")]
    assert domain_violations("torchlens.render.ddp.report", found) == [
        (1, "torchlens.analysis.runs.comm_overlap"), (6, "torchlens.analysis.monitor_metrics")]
    assert domain_violations("torchlens.render.tables", found) == []


def test_domains_import_one_way():
    modules = _all_modules()
    known = set(modules)
    assert {domain_of(n) for n in modules} >= set(DOMAIN_USES)  # every domain is read
    offending = []
    for name, path in modules.items():
        if domain_of(name) is None:
            continue
        found = imports(path.read_text(encoding="utf-8"), name, path.name == "__init__.py",
                        known)
        offending += [f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}"
                      for line, imported in domain_violations(name, found)]
    assert not offending, ("a domain imports one it may not use (DOMAIN_USES; move what "
                           "both need to the lower domain):\n  " + "\n  ".join(offending))
