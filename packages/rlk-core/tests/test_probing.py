"""rlk.backend's probe helpers: a module found without importing it, a distribution's
version read and compared, an NVIDIA device named."""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest
import torch

from rlk.backend import (
    installed_version,
    module_found,
    nvidia_device_reason,
    release,
    version_range,
)


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


def test_installed_version_reads_metadata_without_importing():
    assert installed_version("torch") == importlib.metadata.version("torch")
    assert installed_version("rlk-no-such-distribution") is None


@pytest.mark.parametrize(("version", "expected"), [
    ("1.16.0", (1, 16, 0)), ("0.9.1.post2", (0, 9, 1)), ("4.7", (4, 7, 0)),
    ("2.13.0+cpu", (2, 13, 0)), (" 3", (3, 0, 0)), ("1.2.3.4", (1, 2, 3)),
    ("unknown", None), ("", None), ("v1.2", None),
])
def test_release_reads_the_leading_numbers(version: str, expected: tuple[int, ...] | None):
    assert release(version) == expected


def test_releases_compare_with_ranges_of_any_length():
    dsl, trl_dev = release("4.7"), release("1.17.0.dev0")
    assert dsl is not None and (4, 7, 0) <= dsl < (4, 8, 0)
    assert trl_dev is not None and not (1, 16) <= trl_dev < (1, 17)
    assert release("1.2.3.4", parts=4) == (1, 2, 3, 4)


def test_version_range_is_written_as_pip_does():
    assert version_range((1, 16), (1, 17)) == ">=1.16,<1.17"
    assert version_range((0, 6, 5), (0, 7, 0)) == ">=0.6.5,<0.7.0"


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
