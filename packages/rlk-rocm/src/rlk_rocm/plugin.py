"""Entry point of the `rocm` backend (group `rlk.backends`): registration only, no HIP work.

The kernels are rlk-cuda's, compiled as HIP, behind rlk-cuda's own host-side launch modules
(installed here by the build as rlk_rocm.logp, .sample, .linear, .linear_policy_loss, ...).
"""

from __future__ import annotations

import torch

import rlk
from rlk.ops.logp import one_token_per_row
from rlk.registry import Check, Registry
from rlk_rocm import __version__
from rlk_rocm.probe import probe

RLK_PLUGIN_API = "1.0"
BACKEND = "rocm"
PRIORITY = 200
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FLOAT32 = (torch.float32,)
ANY_FLOAT = (*DTYPES, torch.float64)
BATCH_INVARIANT = ("batch_invariant",)

# op -> (forward target, backward target or None, properties, dtypes of the main input).
# The same table as rlk_cuda.plugin's under this package's name (tests/test_parity.py checks).
KERNELS: dict[str, tuple[str, str | None, tuple[str, ...], tuple[torch.dtype, ...]]] = {
    "logp": ("rlk_rocm.logp:forward", "rlk_rocm.logp:backward", BATCH_INVARIANT, DTYPES),
    "logp_entropy": ("rlk_rocm.logp:forward", "rlk_rocm.logp:backward", BATCH_INVARIANT, DTYPES),
    "entropy": ("rlk_rocm.logp:entropy_forward", "rlk_rocm.logp:entropy_backward",
                BATCH_INVARIANT, DTYPES),
    "sample": ("rlk_rocm.sample:sample", None, BATCH_INVARIANT, DTYPES),
    "linear_logp": ("rlk_rocm.linear:forward", "rlk_rocm.linear:backward", (), DTYPES),
    "linear_logp_entropy": ("rlk_rocm.linear:forward", "rlk_rocm.linear:backward", (), DTYPES),
    "linear_policy_loss": ("rlk_rocm.linear_policy_loss:forward", None, (), DTYPES),
    "group_advantages": ("rlk_rocm.advantages:forward", None, (), FLOAT32),
    "policy_loss": ("rlk_rocm.policy_loss:forward", "rlk_rocm.policy_loss:backward", (),
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
