"""Entry point of this package's backend (group `rlk.backends`): registration only, no GPU work.

rlk-cuda and rlk-rocm install this same module: the backend is named by the package's
`BACKEND`, its kernels are the package's own host modules and its probe the package's own.
"""

from __future__ import annotations

import torch
from rlk.backend import Check, Registry, hookimpl, one_token_per_row

from . import BACKEND, __version__
from .probe import probe

RLK_PLUGIN_API = "1.1"
PRIORITY = 200
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FLOAT32 = (torch.float32,)
# policy_loss reads logp (its main input) in any float dtype, float64 included
ANY_FLOAT = (*DTYPES, torch.float64)
BATCH_INVARIANT = ("batch_invariant",)
# the linear ops take a float32 weight beside a reduced hidden (rlk._runtime.head)
FLOAT32_WEIGHT = ("float32_weight",)

# op -> (forward, backward or None, properties, dtypes of the main input), as
# "module:function" inside this package.
KERNELS: dict[str, tuple[str, str | None, tuple[str, ...], tuple[torch.dtype, ...]]] = {
    "logp": ("logp:forward", "logp:backward", BATCH_INVARIANT, DTYPES),
    "logp_entropy": ("logp:forward", "logp:backward", BATCH_INVARIANT, DTYPES),
    "entropy": ("entropy:forward", "entropy:backward", BATCH_INVARIANT, DTYPES),
    "sample": ("sample:sample", None, BATCH_INVARIANT, DTYPES),
    "linear_logp": ("linear_logp:forward", "linear_logp:backward", FLOAT32_WEIGHT, DTYPES),
    "linear_logp_entropy": ("linear_logp:forward", "linear_logp:backward", FLOAT32_WEIGHT, DTYPES),
    "linear_policy_loss": ("linear_policy_loss:forward", None, FLOAT32_WEIGHT, DTYPES),
    "group_advantages": ("group_advantages:forward", None, (), FLOAT32),
    "policy_loss": ("policy_loss:forward", "policy_loss:backward", (), ANY_FLOAT),
}


# op -> the check of calls its kernels decline
CHECKS: dict[str, Check] = {"logp": one_token_per_row}


def target(name: str) -> str:
    """A "module:function" of this package as the registry wants it: fully qualified."""
    return f"{__package__}.{name}"


@hookimpl
def rlk_register(registry: Registry) -> None:
    """Declare the backend and every kernel whose op this version of rlk-core defines."""
    registry.add_backend(BACKEND, priority=PRIORITY, probe=probe, version=__version__)
    for op, (forward, backward, properties, dtypes) in KERNELS.items():
        if op not in registry.known_ops:
            continue
        registry.add_kernel(
            op,
            BACKEND,
            target(forward),
            backward=None if backward is None else target(backward),
            devices=("cuda",),
            dtypes=dtypes,
            check=CHECKS.get(op),
            properties=properties,
        )
