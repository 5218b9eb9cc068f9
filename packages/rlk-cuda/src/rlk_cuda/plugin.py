"""Entry point of the `cuda` backend (group `rlk.backends`): registration only, no CUDA work."""

from __future__ import annotations

import rlk
import torch
from rlk.ops.logp import one_token_per_row
from rlk.registry import Check, Registry

from rlk_cuda import __version__
from rlk_cuda.probe import probe

RLK_PLUGIN_API = "1.0"
BACKEND = "cuda"
PRIORITY = 200
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

FLOAT32 = (torch.float32,)
# policy_loss reads logp (its main input) in any float dtype, float64 included
ANY_FLOAT = (*DTYPES, torch.float64)

# op -> (forward target, backward target or None, properties, dtypes of the main input)
KERNELS: dict[str, tuple[str, str | None, tuple[str, ...], tuple[torch.dtype, ...]]] = {
    "logp": ("rlk_cuda.logp:forward", "rlk_cuda.logp:backward", ("batch_invariant",), DTYPES),
    "logp_entropy": (
        "rlk_cuda.logp:forward",
        "rlk_cuda.logp:backward",
        ("batch_invariant",),
        DTYPES,
    ),
    "entropy": (
        "rlk_cuda.logp:entropy_forward",
        "rlk_cuda.logp:entropy_backward",
        ("batch_invariant",),
        DTYPES,
    ),
    "sample": ("rlk_cuda.sample:sample", None, ("batch_invariant",), DTYPES),
    "linear_logp": ("rlk_cuda.linear:forward", "rlk_cuda.linear:backward", (), DTYPES),
    "linear_logp_entropy": ("rlk_cuda.linear:forward", "rlk_cuda.linear:backward", (), DTYPES),
    "linear_policy_loss": ("rlk_cuda.linear_policy_loss:forward", None, (), DTYPES),
    "group_advantages": ("rlk_cuda.advantages:forward", None, (), FLOAT32),
    "policy_loss": ("rlk_cuda.policy_loss:forward", "rlk_cuda.policy_loss:backward", (),
                    ANY_FLOAT),
}


# op -> the check of calls its kernels decline
CHECKS: dict[str, Check] = {"logp": one_token_per_row}


@rlk.hookimpl
def rlk_register(registry: Registry) -> None:
    """Declare the backend and every kernel whose op this version of rlk-core defines."""
    registry.add_backend(BACKEND, priority=PRIORITY, probe=probe, version=__version__)
    for op, (forward, backward, properties, dtypes) in KERNELS.items():
        if op not in registry.known_ops:
            continue
        registry.add_kernel(
            op,
            BACKEND,
            forward,
            backward=backward,
            devices=("cuda",),
            dtypes=dtypes,
            check=CHECKS.get(op),
            properties=properties,
        )
