"""The layering rules of the package hold (import-linter contracts in pyproject.toml)."""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.tools import tool

REPO = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    return tool(name, "it comes with the 'test' extra")


def test_import_contracts_are_kept() -> None:
    result = subprocess.run(
        [_tool("lint-imports")], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_code_is_lint_clean_and_formatted() -> None:
    ruff = _tool("ruff")
    paths = ["gpustation", "tests", "bench"]
    check = subprocess.run([ruff, "check", *paths], cwd=REPO, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    fmt = subprocess.run(
        [ruff, "format", "--check", *paths], cwd=REPO, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stdout


# ---- no import circles ---------------------------------------------------------------------

PACKAGE = REPO / "gpustation"


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Every module of the package: its dotted name -> (file, is a package)."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, types: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs: at its top and inside functions; those under
    TYPE_CHECKING too where ``types``."""
    for node in ast.iter_child_nodes(tree):
        if not types and isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), types)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node, types)


def import_graph(root: Path, types: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a name from a package counts as
    the package; ``from pkg import sub`` as the submodule)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8")), types):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
                continue
            target = node.module or ""
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    edges.add(sub)
                elif target in modules:
                    edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other round a circle (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & group):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    raise AssertionError(f"no circle through {start}")  # pragma: no cover - a group has one


def named_imports() -> dict[str, set[str]]:
    """The imports made by name at run time (importlib): the commands, the backends
    and the screens whose binding ids a ``[keys]`` table may name."""
    from gpustation.cli import COMMANDS, DASHBOARD
    from gpustation.telemetry.registry import registrations
    from gpustation.tui.keyids import BINDING_MODULES

    return {
        "gpustation.cli": {*COMMANDS.values(), DASHBOARD},
        "gpustation.telemetry.registry": {r.module for r in registrations()},
        "gpustation.tui.keyids": set(BINDING_MODULES),
    }


def test_no_import_cycles() -> None:
    """No module of the package imports itself back through others (type-only
    imports left out; imports inside functions count: they run too, and so do
    the imports made by name)."""
    graph = import_graph(PACKAGE)
    for module, named in named_imports().items():
        assert named <= graph.keys(), named - graph.keys()
        graph[module] = graph[module] | named
    found = cycles(graph)
    circles = [" -> ".join(_circle(graph, g)) + f" ({len(g)} modules)" for g in found]
    assert not found, "import circles:\n" + "\n".join(circles)


def test_the_import_graph_sees_a_circle(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "a.py").write_text("from pkg.sub import b\n")
    (root / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    (root / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    )
    graph = import_graph(root)
    assert cycles(graph) == [{"pkg.a", "pkg.sub.b"}]
    assert _circle(graph, {"pkg.a", "pkg.sub.b"}) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    (root / "sub" / "b.py").write_text("")
    assert cycles(import_graph(root)) == []
    (root / "a.py").write_text("from pkg import c\n")
    assert cycles(import_graph(root, types=True)) == [{"pkg.a", "pkg.c"}]


def test_no_import_cycles_in_the_tui_even_for_types() -> None:
    """The dashboard's screens, panes and controllers depend one way, annotations
    included: a pane is handed what it needs rather than reaching back to its screen."""
    graph = import_graph(PACKAGE, types=True)
    tui = {m: edges for m, edges in graph.items() if m.startswith("gpustation.tui")}
    found = cycles({m: edges & tui.keys() for m, edges in tui.items()})
    circles = [" -> ".join(_circle(graph, g)) + f" ({len(g)} modules)" for g in found]
    assert not found, "import circles:\n" + "\n".join(circles)
