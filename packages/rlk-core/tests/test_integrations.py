"""rlk.integrations without the frameworks: lazy imports, version ranges, patch bookkeeping.

The adapters against the real TRL and verl are tested in tests/integrations (the
`integrations` nox session).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import types

import pytest
import torch

import rlk
from rlk.backend import version_range
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
    span = re.escape(f"{distribution}{version_range(*adapter.SUPPORTED)}")
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


@pytest.mark.parametrize("adapter", [trl, verl])
def test_an_unreadable_version_is_refused(monkeypatch: pytest.MonkeyPatch, adapter) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "unknown")
    with pytest.raises(UnsupportedVersionError, match=r"cannot read \w+'s version 'unknown'"):
        adapter.patch()
    assert not adapter.is_patched()


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


def test_the_package_modules_are_scanned_again_only_when_sys_modules_changes(
        fake_framework, monkeypatch: pytest.MonkeyPatch) -> None:
    """A patch and its restore ask for the package's modules once per swap; scanning
    sys.modules each time cost TRL's patched() 13-37 ms a block (the trl-grpo bench timed
    it). The list is kept while nothing is imported or removed, and never goes stale."""
    patches = _patching.Patches("fakefw")
    first = patches._modules()
    assert set(first) == {fake_framework.utils, fake_framework.importer}
    assert patches._modules() is first
    late = types.ModuleType("fakefw.late")
    monkeypatch.setitem(sys.modules, late.__name__, late)
    assert late in patches._modules()
    # one module removed and another added: the same size, a different newest entry
    monkeypatch.delitem(sys.modules, "fakefw.utils")
    other = types.ModuleType("fakefw.other")
    monkeypatch.setitem(sys.modules, other.__name__, other)
    assert set(patches._modules()) == {fake_framework.importer, late, other}


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


def _head_batch(seed: int = 0) -> dict:
    """A shifted [B, L - 1] batch whose last T positions are completions, some unlabelled."""
    gen = torch.Generator().manual_seed(seed)
    batch, positions, length, width, vocab = 3, 6, 4, 8, 11
    labelled = torch.rand(batch, length, generator=gen) > 0.3
    labelled[:, 0] = True
    completion = torch.randint(0, vocab, (batch, length), generator=gen)
    every_label = torch.zeros(batch, positions, dtype=torch.int64)  # TRL's clamp(min=0)
    every_label[:, -length:] = torch.where(labelled, completion, 0)
    mask = labelled & (torch.rand(batch, length, generator=gen) > 0.2)  # a tool mask too
    policy = dict(old_logp=-2.0 - torch.rand(batch, length, generator=gen), mask=mask,
                  advantages=torch.randn(batch, generator=gen),
                  options=rlk.PolicyLossOptions(agg="seq-mean-token-mean", clip_high=0.28))
    return dict(hidden=torch.randn(batch, positions, width, generator=gen, requires_grad=True),
                weight=torch.randn(vocab, width, generator=gen) * 0.5, labelled=labelled,
                completion=completion, every_label=every_label, policy=policy,
                head=dict(bias=None, temperature=0.9, softcap=None, logit_scale=1.0))


def _fused(x: dict) -> trl._FusedLoss:
    batch, positions, _ = x["hidden"].shape
    return trl._FusedLoss(tokens=x["completion"], labelled=x["labelled"],
                          positions=batch * positions, policy=x["policy"])


def test_the_fused_loss_reads_either_layout_of_trls_head() -> None:
    """TRL's head scores every shifted position (CPU) or the labelled ones only (Triton
    devices); both place the same completion rows, and the head gets its log-probs back
    in its own layout."""
    x = _head_batch()
    hidden, length = x["hidden"], x["completion"].shape[1]
    every = _fused(x)
    every_logp = every.run(hidden.reshape(-1, hidden.shape[-1]), x["weight"],
                           x["every_label"].reshape(-1), x["head"])
    labelled = _fused(x)
    labelled_logp = labelled.run(hidden[:, -length:][x["labelled"]], x["weight"],
                                 x["completion"][x["labelled"]], x["head"])
    assert every.result is not None and labelled.result is not None
    (every_grad,) = torch.autograd.grad(every.result[0], hidden)
    (labelled_grad,) = torch.autograd.grad(labelled.result[0], hidden)
    rows = hidden[:, -length:]
    logp = rlk.linear_logp(rows, x["weight"], x["completion"], temperature=0.9)
    want, _ = rlk.policy_loss(logp, **x["policy"])
    (want_grad,) = torch.autograd.grad(want, hidden)
    for loss, grad in ((every.result[0], every_grad), (labelled.result[0], labelled_grad)):
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-6)
    placed = every_logp.view(hidden.shape[:2])
    assert bool((placed[:, :-length] == 0).all())
    mask = x["policy"]["mask"]
    torch.testing.assert_close(placed[:, -length:][mask], logp.detach()[mask])
    torch.testing.assert_close(labelled_logp, placed[:, -length:][x["labelled"]])


def test_the_fused_loss_refuses_what_it_cannot_place() -> None:
    x = _head_batch()
    hidden, length = x["hidden"].detach(), x["completion"].shape[1]
    with pytest.raises(RuntimeError, match="scored 5 rows"):
        _fused(x).run(hidden.reshape(-1, hidden.shape[-1])[:5], x["weight"],
                      x["every_label"].reshape(-1)[:5], x["head"])
    with pytest.raises(RuntimeError, match="other tokens"):
        _fused(x).run(hidden.reshape(-1, hidden.shape[-1]), x["weight"],
                      (x["every_label"] + 1).reshape(-1), x["head"])
    once = _fused(x)
    rows = hidden[:, -length:][x["labelled"]]
    once.run(rows, x["weight"], x["completion"][x["labelled"]], x["head"])
    with pytest.raises(RuntimeError, match="ran twice"):
        once.run(rows, x["weight"], x["completion"][x["labelled"]], x["head"])
