"""Backends import from rlk-core only the plugin API (`rlk.backend`) and the user API (`rlk`)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import rlk
import rlk.backend
from rlk._runtime.spec import specs
from rlk.op_table import OP_NAMES
from rlk.registry import resolve

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs/backends/writing-a-backend.md"
BACKEND_SOURCES = {
    "rlk-cuda": REPO / "packages/rlk-cuda/src",
    "rlk-rocm": REPO / "packages/rlk-rocm/src",
    "rlk-flashinfer": REPO / "packages/rlk-flashinfer/src",
    "rlk-quack": REPO / "packages/rlk-quack/src",
    "rlk-vllm": REPO / "packages/rlk-vllm/src",
    "rlk-testbackend": REPO / "tests/plugins/rlk-testbackend/src",
}


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names
                      if alias.name.startswith("rlk.") and alias.name != "rlk.backend"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("rlk.") and node.module != "rlk.backend":
                found.append(node.module)
            elif node.module == "rlk":
                found += [f"rlk.{a.name}" for a in node.names if a.name not in rlk.__all__]
    return [f"{path.relative_to(REPO)}: {name}" for name in found]


@pytest.mark.parametrize("package", sorted(BACKEND_SOURCES))
def test_backends_import_only_the_plugin_api(package):
    violations = [v for path in sorted(BACKEND_SOURCES[package].rglob("*.py"))
                  for v in _private_imports(path)]
    assert not violations, "import rlk.backend instead of:\n" + "\n".join(violations)


def test_the_plugin_api_page_describes_every_name():
    """rlk.backend is read as a page (docs/backends/reference.md renders its docstrings): each
    name it exports has a docstring, its own or, for a constant, the one after it."""
    source = inspect.getsource(rlk.backend)
    for name in rlk.backend.__all__:
        value = getattr(rlk.backend, name)
        if inspect.ismodule(value) or inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), f"rlk.backend.{name} has no docstring"
        else:
            assert re.search(rf'^{name}\b[^\n]*= [^\n]+\n(?:[^\n]+\n)*?"""', source,
                             re.MULTILINE), \
                f"rlk.backend.{name} has no docstring after its assignment"
    assert rlk.backend.API_VERSION == rlk.PLUGIN_API_VERSION


B = rlk.backend
# op -> (forward, backward or None): the Protocol of each kernel `add_kernel` registers
SIGNATURES = {
    "logp": (B.LogpForward, B.LogpBackward),
    "logp_entropy": (B.LogpForward, B.LogpBackward),
    "entropy": (B.EntropyForward, B.EntropyBackward),
    "linear_logp": (B.LinearLogpForward, B.LinearLogpBackward),
    "linear_logp_entropy": (B.LinearLogpForward, B.LinearLogpBackward),
    "linear_policy_loss": (B.LinearPolicyLossForward, None),
    "policy_loss": (B.PolicyLossForward, B.PolicyLossBackward),
    "group_advantages": (B.GroupAdvantagesForward, None),
    "sample": (B.SampleForward, None),
    "token_kl": (B.TokenKlForward, B.TokenKlBackward),
    "distributed_logp": (B.DistributedLogpForward, B.DistributedLogpBackward),
    "distributed_logp_entropy": (B.DistributedLogpForward, B.DistributedLogpBackward),
}


def test_every_op_has_its_signatures():
    assert set(SIGNATURES) == set(OP_NAMES)
    for forward, backward in SIGNATURES.values():
        for protocol in (forward, backward):
            assert protocol is None or protocol.__name__ in rlk.backend.__all__


def _parameters(function) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]


@pytest.mark.parametrize("op", OP_NAMES)
def test_every_op_has_a_kernel_signature_that_native_follows(op):
    """The Protocols on the reference page are what rlk passes: native's kernels take them."""
    forward, backward = SIGNATURES[op]
    native = specs()[op].native
    assert native is not None
    assert _parameters(resolve(native.forward)) == _parameters(forward.__call__)
    if native.backward is None:
        assert backward is None
    else:
        assert backward is not None
        assert _parameters(resolve(native.backward)) == _parameters(backward.__call__)


def _guide_signatures() -> dict[str, list[list[str]]]:
    """Each op heading of the op pages' **Kernel signature** sections, with the parameters
    of its `def`s."""
    text = "".join(page.read_text().split("## Kernel signature", 1)[-1]
                   for page in sorted((REPO / "docs/ops").glob("*.md")))
    found: dict[str, list[list[str]]] = {}
    for section in re.split(r"^### ", text, flags=re.MULTILINE)[1:]:
        names = re.findall(r"`(\w+)`", section.splitlines()[0].split("(")[0])
        defs = [[p.strip() for p in params.replace("\n", " ").split(",") if p.strip()]
                for params in re.findall(r"^def \w+\(([^)]*)\)", section, re.MULTILINE)]
        for name in names:
            found[name] = defs
    return found


@pytest.mark.parametrize("op", OP_NAMES)
def test_the_guides_kernel_signatures_match_the_reference(op):
    forward, backward = SIGNATURES[op]
    expected = [_parameters(forward.__call__)]
    if backward is not None:
        expected.append(_parameters(backward.__call__))
    guide = _guide_signatures()[op]
    if op == "linear_policy_loss":  # the guide points to the op page for its signature
        assert guide == []
        return
    assert guide == expected
