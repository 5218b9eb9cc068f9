"""One op table: every op is one line of rlk.op_table.SPECS, and the machinery around the ops
(dispatcher, loader, CLI, kit, native registration) knows them only through it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rlk
from rlk._runtime.spec import specs
from rlk.op_table import OP_NAMES, SPECS

ROOT = Path(rlk.__file__).parent
# Files that may name ops: the op table, each op's own modules, the public exports, and
# code that is per op by nature (benchmark workloads, framework adapters).
OWN_FILES = ("ops/", "bench/", "integrations/", "__init__.py", "distributed.py", "op_table.py")


def test_the_table_is_the_list_of_ops():
    assert tuple(SPECS) == OP_NAMES
    assert list(specs()) == list(OP_NAMES)
    for name, spec in specs().items():
        assert spec.name == name


@pytest.mark.parametrize("name", OP_NAMES)
def test_each_spec_carries_what_the_machinery_needs(name):
    spec = specs()[name]
    assert spec.native is not None, "the native backend registers each spec's native kernel"
    assert spec.operator is not None and spec.torch_op is not None, "the one call path runs it"
    assert spec.output_meta is not None, "kernel results are checked against it"
    assert spec.shape_call is not None and spec.shape_help, "rlk-core explain builds from it"
    if spec.backward_kernel:
        assert spec.grad_meta is not None, "backward kernel results are checked against it"


def test_only_an_ops_own_files_name_it():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(OWN_FILES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in OP_NAMES:
                found.append(f"{relative}:{node.lineno} names op {node.value!r}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", OP_NAMES)
def test_each_op_lives_in_its_own_folder(name):
    """An op's spec sits in rlk/ops/<op>/op.py; an `_entropy` variant shares the folder of
    the op it extends."""
    module = SPECS[name].partition(":")[0]
    folder = name.removesuffix("_entropy")
    assert module == f"rlk.ops.{folder}.op", (name, module)
    assert specs()[name].native.forward.startswith(f"rlk.ops.{folder}.native:"), \
        "its native kernel sits beside it"


@pytest.mark.parametrize("name", OP_NAMES)
def test_each_op_is_exported_from_its_folder(name):
    """The public function of op X is rlk.X (rlk.distributed.X for the distributed ops),
    defined in X's folder."""
    if name.startswith("distributed_"):
        function = getattr(rlk.distributed, name.removeprefix("distributed_"))
    else:
        function = getattr(rlk, name)
        assert name in rlk.__all__
    assert function.__module__ == f"rlk.ops.{name.removesuffix('_entropy')}.op"


def test_bench_workloads_are_named_after_the_ops_they_measure():
    """A workload of one op sits in the module named after the op; a whole trainer step
    (STEPS) names the op it mostly runs. Every workload is listed."""
    from rlk.bench.workloads import MODULES, STEPS, WORKLOADS

    folders = {name.removesuffix("_entropy") for name in OP_NAMES}
    for module in MODULES:
        assert module.__name__.rpartition(".")[2] in folders, module.__name__
    for workload in WORKLOADS.values():
        assert workload.op in OP_NAMES, (workload.name, workload.op)
        owner = next(m for m in (*MODULES, *STEPS) if workload in m.WORKLOADS)
        if owner in MODULES:
            assert owner.__name__.endswith("." + workload.op.removesuffix("_entropy")), \
                (workload.name, owner.__name__)
    assert {w.name for m in (*MODULES, *STEPS) for w in m.WORKLOADS} == set(WORKLOADS)
