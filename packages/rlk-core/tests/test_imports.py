"""rlk-core's modules import downward only: no import circle, lazy imports included.

Every `import` statement counts wherever it sits (a function-level import is still a
dependency); imports under `if TYPE_CHECKING:` do not, since they never run. Importing
`pkg.mod` is an edge to `pkg.mod` (not to `pkg`'s `__init__`); `from pkg import name` is
an edge to `pkg.name` when that is a module, else to `pkg`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rlk

ROOT = Path(rlk.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in ROOT.rglob("*.py")}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, here: str, known: set[str]) -> set[str]:
    found: set[str] = set()
    package = here if here in known and (ROOT.parent / here.replace(".", "/")).is_dir() \
        else here.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name for name in found if name in known and name != here}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imported(ast.parse(path.read_text()), name, known)
            for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    cycle = _cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_graph_sees_lazy_imports():
    """A function-level import is an edge: the check would miss half the circles otherwise."""
    graph = import_graph()
    assert "rlk.ops.logp.op" in graph["rlk.ops.sample.native"]  # imported inside sample()
    assert "rlk.dispatch" in graph["rlk._runtime.spec"]
