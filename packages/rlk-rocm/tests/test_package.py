"""Without any build: import, lazy extension errors, registration, plugin API."""

from __future__ import annotations

import pytest
import torch
from rlk.backend import Registry

import rlk_rocm
from rlk_rocm import _ext, plugin, probe

OPS = ("logp", "logp_entropy", "sample", "linear_logp", "linear_logp_entropy", "group_advantages",
       "policy_loss")
FLOAT32_ONLY = ("group_advantages",)
ANY_FLOAT = ("policy_loss",)


def test_version_and_plugin_api() -> None:
    assert rlk_rocm.__version__ == "0.1.0"
    assert plugin.RLK_PLUGIN_API.split(".")[0] == "1"


def test_failed_import_is_remembered_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(name: str) -> None:
        raise ImportError("libamdhip64.so.6: cannot open shared object file")

    monkeypatch.setattr(_ext, "_module", None)
    monkeypatch.setattr(_ext, "_error", None)
    monkeypatch.setattr(_ext.importlib, "import_module", fail)
    with pytest.raises(ImportError, match=r"rlk_rocm extension failed to import: .*libamdhip64"):
        _ext.load()
    assert _ext.import_error() == "ImportError: libamdhip64.so.6: cannot open shared object file"
    assert not _ext.built()
    assert _ext.architectures() == []
    assert _ext.toolkit_version() == "unknown"


def test_registration() -> None:
    registry = Registry(OPS)
    plugin.rlk_register(registry)
    backend = registry.backends["rocm"]
    assert backend.priority == 200
    assert backend.probe is probe.probe
    halves = {torch.float32, torch.bfloat16, torch.float16}
    for op in OPS:
        (kernel,) = registry.kernels[op]
        assert kernel.devices == ("cuda",)
        assert kernel.target.startswith("rlk_rocm.")
        want = {torch.float32} if op in FLOAT32_ONLY else halves
        if op in ANY_FLOAT:
            want = {*halves, torch.float64}
        assert kernel.dtypes is not None and set(kernel.dtypes) == want
    assert "batch_invariant" in registry.kernels["logp"][0].properties
    assert registry.kernels["sample"][0].backward_target is None
    assert registry.kernels["logp_entropy"][0].backward_target == "rlk_rocm.logp:backward"


def test_registration_skips_ops_core_does_not_define() -> None:
    registry = Registry(("logp",))
    plugin.rlk_register(registry)
    assert [k.op for ks in registry.kernels.values() for k in ks] == ["logp"]


def test_backend_lists_with_its_reason_on_this_machine() -> None:
    """Through rlk's own plugin loading: the backend is known, and says why it cannot serve."""
    import rlk

    records = {record.name: record for record in rlk.backends("cuda")}
    if "rocm" not in records:
        pytest.skip("rlk-rocm is not installed as a distribution (no entry point)")
    record = records["rocm"]
    if torch.version.hip is None:
        assert record.status == "unavailable"
        assert str(record.reason).startswith("torch is not a ROCm build")
    else:
        assert record.status in {"ready", "unavailable"}
