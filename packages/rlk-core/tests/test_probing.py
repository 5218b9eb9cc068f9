"""rlk.backend's probe helpers: a module found without importing it, an NVIDIA device named."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from rlk.backend import module_found, nvidia_device_reason


def test_a_module_is_found_without_being_imported():
    name = "xml.dom.pulldom"  # nothing rlk or pytest imports
    assert name not in sys.modules
    assert module_found(name)
    assert name not in sys.modules


def test_sys_modules_answers_first(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "rlk_injected_library", types.ModuleType("x"))
    assert module_found("rlk_injected_library")
    monkeypatch.setitem(sys.modules, "rlk_injected_library", None)  # a blocked import
    assert not module_found("rlk_injected_library")


@pytest.mark.parametrize("name", ["rlk_no_such_module", "rlk_no_such_package.child", ""])
def test_a_missing_or_malformed_name_is_not_found(name: str):
    assert not module_found(name)


def test_device_reasons_name_the_library(monkeypatch: pytest.MonkeyPatch):
    assert nvidia_device_reason(torch.device("cpu"), "Lib") == (
        "no CUDA device (Lib runs on NVIDIA GPUs; asked for cpu)")
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert nvidia_device_reason(torch.device("cuda"), "Lib") == (
        "no CUDA device (this torch is a ROCm build; Lib supports NVIDIA only)")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert nvidia_device_reason(torch.device("cuda"), "Lib") == (
        "no CUDA device (torch.cuda.is_available() is False)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert nvidia_device_reason(torch.device("cuda", 2), "Lib") == (
        "no CUDA device cuda:2 (torch sees 2)")
    assert nvidia_device_reason(torch.device("cuda", 1), "Lib") is None
    assert nvidia_device_reason(torch.device("cuda"), "Lib") is None
