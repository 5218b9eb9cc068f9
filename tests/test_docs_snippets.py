"""Every Python block of the docs, checked against the code it shows.

- A signature block (`rlk.op(args) -> result`, one per function) must match the function:
  the same parameters, of the same kinds, with the same defaults.
- Any other ```python block runs as pasted, in a fresh namespace on the CPU.
- A ```py block is a fragment of a larger program (a training loop around it, a kernel
  file, a rollout with a model): it must compile. Tag a block `py` only when it cannot
  stand alone, and say in the prose what surrounds it.

The backend guide's file blocks (```python title="...") are built into a backend and run
through the conformance kit by test_docs_backend.py.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import rlk

DOCS = Path(__file__).resolve().parents[1] / "docs"
_BLOCK = re.compile(r"^```(python|py)([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_SIGNATURE = re.compile(r"^(rlk(?:\.\w+)+)\((.*?)\)(?:\s*->[^\n]*)?\s*$",
                        re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[str, str, str]]:
    """(page:line, tag, code) of every Python block outside the benchmark results."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        if "benchmarks/results" in page.as_posix():
            continue
        text = page.read_text()
        for match in _BLOCK.finditer(text):
            tag, attributes, code = match.groups()
            if "title=" in attributes:
                continue  # a file of the backend guide
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(DOCS)}:{line}", tag, code))
    return found


def _signatures(code: str) -> list[tuple[str, str]] | None:
    """(function, parameters) of each signature in a block made only of signatures."""
    lines = [line for line in code.splitlines() if not line.strip().startswith("->")]
    text = "\n".join(lines).strip()
    parts = re.split(r"\n(?=rlk\.)", text)
    found = []
    for part in parts:
        match = _SIGNATURE.fullmatch(part.strip())
        if match is None:
            return None
        found.append((match[1], match[2]))
    return found


BLOCKS = _blocks()
SIGNATURES = [(where, name, params) for where, tag, code in BLOCKS
              for name, params in (_signatures(code) or [])]
PROGRAMS = [(where, code) for where, tag, code in BLOCKS
            if tag == "python" and _signatures(code) is None]
FRAGMENTS = [(where, code) for where, tag, code in BLOCKS if tag == "py"]


def _resolve(dotted: str):
    value = rlk
    for part in dotted.split(".")[1:]:
        value = getattr(value, part)
    return value


def _option_default(name: str):
    for options in (rlk.PolicyLossOptions(), rlk.GroupAdvantagesOptions()):
        if hasattr(options, name):
            return getattr(options, name)
    raise AssertionError(f"'{name}' is neither a parameter nor an option")


@pytest.mark.parametrize(("where", "name", "params"), SIGNATURES,
                         ids=[f"{w}:{n}" for w, n, _ in SIGNATURES])
def test_a_documented_signature_is_the_functions(where, name, params):
    documented = ast.parse(f"def f({params}): pass").body[0].args
    actual = inspect.signature(_resolve(name)).parameters
    kinds = inspect.Parameter
    positional = [a.arg for a in documented.args]
    assert positional == [p for p, v in actual.items()
                          if v.kind == kinds.POSITIONAL_OR_KEYWORD], where
    settings = any(v.kind == kinds.VAR_KEYWORD for v in actual.values())
    assert documented.kwarg is None or settings, where
    options = [a.arg for a in documented.kwonlyargs if a.arg not in actual]
    assert documented.kwarg is not None or not settings or options, \
        f"{where}: {name} takes **settings; the docs show neither it nor its options"
    for argument, default in zip(documented.kwonlyargs, documented.kw_defaults, strict=True):
        wanted = ast.literal_eval(default) if default is not None else inspect.Parameter.empty
        if argument.arg in actual:
            assert actual[argument.arg].kind == kinds.KEYWORD_ONLY, (where, argument.arg)
            assert actual[argument.arg].default == wanted, (where, argument.arg)
        else:  # taken through **settings: an option, with the option's default
            assert settings, (where, argument.arg)
            assert _option_default(argument.arg) == wanted, (where, argument.arg)
    undocumented = [p for p, v in actual.items() if v.kind == kinds.KEYWORD_ONLY
                    and p not in {a.arg for a in documented.kwonlyargs}]
    assert not undocumented, (where, undocumented)


@pytest.mark.parametrize(("where", "code"), PROGRAMS, ids=[w for w, _ in PROGRAMS])
def test_a_snippet_runs_as_pasted(fresh_rlk, where, code):
    exec(compile(code, where, "exec"), {"__name__": "__snippet__"})


@pytest.mark.parametrize(("where", "code"), FRAGMENTS, ids=[w for w, _ in FRAGMENTS])
def test_a_fragment_compiles(where, code):
    compile(code, where, "exec")


def test_the_docs_have_snippets_of_each_kind():
    assert len(SIGNATURES) >= 10 and len(PROGRAMS) >= 2
