"""rlk.integrations without the frameworks: lazy imports, version ranges, patch bookkeeping.

The adapters against the real TRL and verl are tested in tests/integrations (the
`integrations` nox session).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import types

import pytest

from rlk.integrations import UnsupportedVersionError, _patching, trl, verl


@pytest.mark.parametrize("adapter", ["trl", "verl"])
def test_importing_an_adapter_imports_no_framework(adapter: str) -> None:
    code = (f"import sys, rlk.integrations.{adapter}; "
            "print(sorted(m for m in ('trl', 'verl', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("adapter", "distribution", "outside"), [
    (trl, "trl", "1.15.2"), (trl, "trl", "1.17.0.dev0"), (verl, "verl", "0.8.0"),
    (verl, "verl", "0.10.0"),
])
def test_a_version_outside_the_range_names_the_range(monkeypatch: pytest.MonkeyPatch,
                                                     adapter, distribution: str,
                                                     outside: str) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda name: outside)
    low, high = adapter.SUPPORTED
    span = f"{distribution}>={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"
    with pytest.raises(UnsupportedVersionError, match=f"supports {span}.*found {distribution} "
                                                      f"{outside}"):
        adapter.patch()
    assert not adapter.is_patched()


@pytest.mark.parametrize("adapter", [trl, verl])
def test_a_missing_framework_raises_import_error(monkeypatch: pytest.MonkeyPatch,
                                                 adapter) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(ImportError, match="is not installed"):
        adapter.patch()


def test_release_reads_the_numeric_part() -> None:
    assert _patching.release("1.16.0") == (1, 16, 0)
    assert _patching.release("0.9.1.post2") == (0, 9, 1)
    with pytest.raises(UnsupportedVersionError, match="cannot read"):
        _patching.release("unknown")


@pytest.fixture
def fake_framework(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A package `fakefw` whose helper `f` a second module imported by name, and a class."""
    utils = types.ModuleType("fakefw.utils")

    def original(x: int) -> int:
        return x

    utils.f = original  # type: ignore[attr-defined]
    importer = types.ModuleType("fakefw.trainer")
    importer.f = original  # type: ignore[attr-defined]

    class Trainer:
        @staticmethod
        def step() -> str:
            return "framework"

    importer.Trainer = Trainer  # type: ignore[attr-defined]
    for module in (utils, importer):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return types.SimpleNamespace(utils=utils, importer=importer, original=original,
                                 Trainer=Trainer, registry={"vanilla": original})


def test_swap_everywhere_and_restore(fake_framework, monkeypatch: pytest.MonkeyPatch) -> None:
    def replacement(x: int) -> int:
        return -x

    patches = _patching.Patches("fakefw")
    patches.swap_everywhere(fake_framework.utils, "f", replacement)
    patches.swap(fake_framework.Trainer, "step", staticmethod(lambda: "rlk"))
    patches.swap_entry(fake_framework.registry, "vanilla", replacement)
    assert fake_framework.utils.f is fake_framework.importer.f is replacement
    assert fake_framework.Trainer.step() == "rlk"
    assert fake_framework.registry["vanilla"] is replacement
    late = types.ModuleType("fakefw.late")  # imported while patched: bound the replacement
    late.f = fake_framework.utils.f  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, late.__name__, late)

    patches.restore()
    for module in (fake_framework.utils, fake_framework.importer, late):
        assert module.f is fake_framework.original
    assert fake_framework.Trainer.step() == "framework"
    assert isinstance(vars(fake_framework.Trainer)["step"], staticmethod)
    assert fake_framework.registry["vanilla"] is fake_framework.original


def test_a_failing_install_undoes_its_swaps(fake_framework, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.0")

    def install(patches: _patching.Patches) -> None:
        patches.swap_everywhere(fake_framework.utils, "f", abs)
        raise RuntimeError("half-way")

    adapter = _patching.Adapter("fakefw", ((1, 0), (2, 0)), "fakefw 1.0", install)
    with pytest.raises(RuntimeError, match="half-way"):
        adapter.patch()
    assert not adapter.is_patched()
    assert fake_framework.utils.f is fake_framework.importer.f is fake_framework.original
