"""rlk-core's modules import downward only: no import circle among modules, and none among
folders, with every import counted.

Every `import` statement is an edge wherever it sits: inside a function (it runs later, but
it is still a dependency) and under `if TYPE_CHECKING:` (a type is a dependency too).
Importing `pkg.sub.mod` is an edge to `pkg.sub.mod` and to each package Python initialises
on the way (`pkg.sub`), except the importer's own ancestors, which are initialised before
the importer runs; `from pkg import name` is an edge to `pkg.name` when that is a module,
else to `pkg`.

The folder graph collapses modules into folders: each op folder (`rlk/ops/<op>/`) is one
node, each other subpackage of rlk is one node, and each module at the top of rlk is a node
of its own (docs/architecture.md draws the layers).
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


def _is_package(name: str) -> bool:
    return (ROOT.parent / name.replace(".", "/") / "__init__.py").exists()


def _with_parents(name: str, here: str) -> set[str]:
    """`name` and the packages importing it initialises, less `here`'s own ancestors."""
    parts = name.split(".")
    found = {".".join(parts[:end]) for end in range(1, len(parts) + 1)}
    ancestors = {".".join(here.split(".")[:end]) for end in range(1, here.count(".") + 1)}
    return (found - ancestors) | {name}


def _imported(tree: ast.AST, here: str, known: set[str]) -> set[str]:
    package = here if _is_package(here) else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found |= _with_parents(alias.name, here)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found |= _with_parents(candidate if candidate in known else base, here)
    return {name for name in found if name in known and name != here}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imported(ast.parse(path.read_text()), name, known)
            for name, path in modules.items()}


def folder_of(module: str) -> str:
    """The folder node of a module: `ops/<op>` for an op's modules, the subpackage for the
    rest of a subpackage, the module itself at the top of rlk."""
    parts = module.split(".")[1:]
    if not parts:
        return "rlk"
    if parts[0] == "ops" and len(parts) > 1:
        return f"ops/{parts[1]}"
    if len(parts) > 1 or _is_package(module):
        return parts[0] + "/"
    return parts[0]


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        node = folders.setdefault(folder_of(module), set())
        node.update(folder_of(target) for target in targets)
    for node, targets in folders.items():
        targets.discard(node)
    return folders


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
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


def test_the_module_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_folder_graph_has_no_cycle():
    cycle = find_cycle(folder_graph(import_graph()))
    assert cycle is None, "folder circle: " + " -> ".join(cycle or [])


def test_the_graph_counts_every_import():
    """Lazy and TYPE_CHECKING imports are edges, and so are the packages an import
    initialises: the check would miss circles otherwise."""
    tree = ast.parse("import typing\nif typing.TYPE_CHECKING:\n"
                     "    from rlk.dispatch import Policy\n"
                     "def later():\n    import rlk.cli.doctor\n")
    found = _imported(tree, "rlk.errors", set(_modules()))
    assert {"rlk.dispatch", "rlk.cli.doctor", "rlk.cli"} <= found
    assert "rlk" not in found  # rlk.errors' own package is initialised before it runs


def test_a_cycle_is_found():
    """The checks can fail: a made-up circle between two folders is reported."""
    graph = {"rlk.ops.logp.op": {"rlk._runtime.spec"}, "rlk._runtime.spec": {"rlk.dispatch"},
             "rlk.dispatch": {"rlk.ops.logp.native"}, "rlk.ops.logp.native": set()}
    assert find_cycle(graph) is None
    assert find_cycle(folder_graph(graph)) == ["_runtime/", "dispatch", "ops/logp", "_runtime/"]


def test_no_source_file_is_over_500_lines():
    """Small modules with one job: a file past 500 lines holds more than one."""
    long = {path.relative_to(ROOT).as_posix(): count for path in ROOT.rglob("*.py")
            if (count := len(path.read_text().splitlines())) > 500}
    assert not long, long
