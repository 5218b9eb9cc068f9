"""Registration through the entry point, and a lazy FlashInfer import."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import torch

from rlk.registry import Registry
from rlk_flashinfer import plugin
from rlk_flashinfer.probe import probe


def test_registers_backend_and_sample_kernel():
    registry = Registry(["sample", "logp"])
    plugin.rlk_register(registry)
    backend = registry.backends["flashinfer"]
    assert (backend.priority, backend.probe, backend.version) == (150, probe, "0.1.0")
    (kernel,) = registry.kernels["sample"]
    assert kernel.target == "rlk_flashinfer.sampler:sample"  # imported on selection
    assert kernel.devices == ("cuda",)
    assert kernel.dtypes == (torch.float32, torch.bfloat16, torch.float16)
    assert registry.kernels["logp"] == []
    assert plugin.RLK_PLUGIN_API == "2.1"  # it uses the probe helpers 2.1 added


def test_entry_point_names_the_plugin_module():
    points = metadata.entry_points(group="rlk.backends")
    assert [p.value for p in points if p.name == "flashinfer"] == ["rlk_flashinfer.plugin"]


def test_import_and_registration_do_not_import_flashinfer_or_triton():
    code = (
        "import sys, rlk, rlk_flashinfer, rlk_flashinfer.plugin;"
        "rlk.backends();"
        "assert 'flashinfer' not in sys.modules, 'flashinfer imported eagerly';"
        "assert 'triton' not in sys.modules, 'triton imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rlk_lists_the_backend_with_its_reason_on_cpu():
    import rlk

    records = {record.name: record for record in rlk.backends("cpu")}
    assert records["flashinfer"].priority == 150
    assert records["flashinfer"].status == "unavailable"
    reason = records["flashinfer"].reason
    assert reason.startswith(("no CUDA device", "flashinfer is not installed",
                              "triton is not installed"))
