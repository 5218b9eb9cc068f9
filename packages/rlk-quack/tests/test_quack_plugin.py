"""Registration through the entry point, the probe's reasons, and a lazy QuACK import."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

from rlk.registry import Registry
from rlk_quack import kernel, library, plugin
from rlk_quack.probe import probe

SUPPORTED = {"quack-kernels": "0.6.5", "nvidia-cutlass-dsl": "4.7.0"}


def _rlk_cuda_priority() -> int:
    """rlk-cuda's PRIORITY from its source (the tests session does not install it)."""
    source = Path(__file__).resolve().parents[2] / "rlk-cuda/src/rlk_cuda/plugin.py"
    match = re.search(r"^PRIORITY = (\d+)$", source.read_text(), re.MULTILINE)
    assert match, source
    return int(match.group(1))


def test_registers_a_forward_only_linear_logp_kernel_below_rlk_cuda_until_run_on_a_gpu():
    registry = Registry(["linear_logp", "linear_logp_entropy", "logp"])
    plugin.rlk_register(registry)
    backend = registry.backends["quack"]
    assert (backend.probe, backend.version) == (probe, "0.1.0")
    assert backend.priority > _rlk_cuda_priority()  # scoring calls: docs/backends/quack.md
    (served,) = registry.kernels["linear_logp"]
    assert served.target == "rlk_quack.kernel:forward"  # imported on selection
    assert served.backward_target is None  # calls needing a gradient fall through
    assert served.check is kernel.check
    assert served.devices == ("cuda",)
    assert served.dtypes == (torch.bfloat16, torch.float16)
    assert registry.kernels["linear_logp_entropy"] == registry.kernels["logp"] == []
    assert plugin.RLK_PLUGIN_API == "2.1"


def test_an_older_core_without_the_op_gets_the_backend_alone():
    registry = Registry(["logp"])
    plugin.rlk_register(registry)
    assert "quack" in registry.backends and registry.kernels["logp"] == []


def test_entry_point_names_the_plugin_module():
    points = metadata.entry_points(group="rlk.backends")
    assert [p.value for p in points if p.name == "quack"] == ["rlk_quack.plugin"]


def test_import_and_registration_do_not_import_quack_or_the_dsl():
    code = (
        "import sys, rlk, rlk_quack.plugin, rlk_quack.kernel;"
        "rlk.backends();"
        "assert 'quack' not in sys.modules, 'quack imported eagerly';"
        "assert 'cutlass' not in sys.modules, 'the DSL imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rlk_lists_the_backend_with_its_reason_on_cpu():
    import rlk

    record = {r.name: r for r in rlk.backends("cpu")}["quack"]
    assert (record.priority, record.status) == (plugin.PRIORITY, "unavailable")
    assert record.reason.startswith(("quack is not installed", "no CUDA device"))


def test_probe_without_quack_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "quack", None)  # what a failed import leaves
    assert probe(torch.device("cuda")) == (
        "quack is not installed (pip install 'rlk-quack[quack]': docs/backends/quack.md)")


def test_supported_versions_pass():
    assert library.version_reason(SUPPORTED) is None
    assert library.version_reason({"quack-kernels": "0.6.9", "nvidia-cutlass-dsl": "4.7.2"}) is None


@pytest.mark.parametrize(("distribution", "version", "words"), [
    ("quack-kernels", "0.6.4", "quack-kernels 0.6.4 is outside the supported range >=0.6.5,<0.7.0"),
    ("quack-kernels", "0.7.0", "outside the supported range"),
    ("nvidia-cutlass-dsl", "4.8.1", "nvidia-cutlass-dsl 4.8.1 is outside the supported range "
                                    ">=4.7.0,<4.8.0"),
    ("nvidia-cutlass-dsl", "nightly", "outside the supported range"),
    ("nvidia-cutlass-dsl", None, "nvidia-cutlass-dsl is not installed"),
])
def test_unsupported_or_missing_versions_are_named(distribution: str, version: str | None,
                                                    words: str):
    reason = library.version_reason({**SUPPORTED, distribution: version})
    assert reason is not None and words in reason, reason


def test_probe_names_the_device_it_cannot_serve(fake, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(library, "installed_versions", lambda: dict(SUPPORTED))
    assert probe(torch.device("cpu")) == (
        "no CUDA device (QuACK runs on NVIDIA GPUs; asked for cpu)")
    if not torch.cuda.is_available():
        assert probe(torch.device("cuda")).startswith("no CUDA device")


def test_an_older_gpu_is_named_by_its_capability(fake, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(library, "installed_versions", lambda: dict(SUPPORTED))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (8, 0))
    assert probe(torch.device("cuda", 0)) == (
        "device is sm_80; QuACK's GEMM needs sm_90 (Hopper) or sm_100 (Blackwell)")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    assert probe(torch.device("cuda", 0)) is None
    assert probe(torch.device("cuda", 3)) == "no CUDA device cuda:3 (torch sees 1)"


def test_the_kernel_names_the_install_when_quack_is_missing(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "quack", None)
    monkeypatch.delitem(sys.modules, "quack.epilogue.library", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'rlk-quack\[quack\]'"):
        library.load_lse_target()


def test_explain_declines_a_float32_weight_beside_a_bfloat16_hidden(fake, monkeypatch):
    """Through the real dispatcher, on CPU: the kernel served on CPU and the probe passed.
    explain once selected on arguments whose weight core had already cast to bfloat16, so
    `check` could not see the float32 master weight (test_quack_gpu caught it on an H100)."""
    import dataclasses

    import rlk
    from rlk.dispatch import get_dispatcher

    dispatcher = get_dispatcher()
    dispatcher.loader.ensure_loaded()
    on_cpu = [dataclasses.replace(k, devices=("cpu",)) if k.backend == "quack" else k
              for k in dispatcher.registry.kernels["linear_logp"]]
    monkeypatch.setitem(dispatcher.registry.kernels, "linear_logp", on_cpu)
    monkeypatch.setattr(type(dispatcher), "probe", lambda self, backend, device: None)
    hidden = torch.randn(4, 32, dtype=torch.bfloat16)
    weight, tokens = torch.randn(40, 32), torch.randint(0, 40, (4,))
    with torch.no_grad(), rlk.use_backends("quack"):
        assert rlk.explain("linear_logp", hidden, weight.bfloat16(), tokens).backend == "quack"
        chosen = rlk.explain("linear_logp", hidden, weight, tokens)
    assert chosen.backend != "quack"
    assert "float32 weight beside a bfloat16 hidden" in chosen.rejected["quack"]
