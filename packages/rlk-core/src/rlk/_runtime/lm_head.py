"""The LM head's logits for a block of rows, in float32, and their soft-capping.

Every linear op (linear_logp, linear_logp_entropy, linear_policy_loss) and every backend
builds its logits chunks here, so "exact against float64" means the same thing everywhere:
bfloat16/float16 products are exact in float32, and the GEMM accumulates and writes
float32, so the only rounding before the softmax is the float32 accumulation itself.

Soft-capping (Gemma's final_logit_softcapping) is logits = c * tanh(u / c) for the raw
logits u. Kernels see tanh(u / c) and the temperature T / c: their softmax of
x / (T / c) is then that of the capped logits over T, and the gradient they return
with respect to x needs only the factor (1 - x^2) / c to become the gradient with
respect to u.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from rlk._runtime.temperature import Temperature

_DISPATCH_KEYS = {"cuda": "CUDA", "cpu": "CPU", "xpu": "XPU", "mps": "MPS", "meta": "Meta"}


@functools.cache
def _float32_output_gemm(device_type: str) -> bool:
    """Whether torch has a GEMM of reduced-precision inputs with float32 output on the device
    (`torch.mm(..., out_dtype=torch.float32)`: CUDA builds have one; CPU builds do not)."""
    key = _DISPATCH_KEYS.get(device_type)
    return key is not None and torch._C._dispatch_has_kernel_for_dispatch_key("aten::mm.dtype", key)


def gemm_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype the GEMM operands are read in: the inputs' own where a float32-output GEMM
    exists for them, else float32 (exact upcasts of the same values, float32 products)."""
    if dtype == torch.float32 or _float32_output_gemm(device.type):
        return dtype
    return torch.float32


def gemm_weight(weight: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """The weight as `float32_logits` reads it: in `dtype` (hidden's; the weight's own by
    default, and a float32 weight beside a reduced hidden is cast to it), or a float32 copy
    where the device has no float32-output GEMM for that dtype."""
    return weight.to(gemm_dtype(weight.dtype if dtype is None else dtype, weight.device))


def float32_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None,
                   out: Tensor | None = None) -> Tensor:
    """hidden @ weight.T + bias, accumulated and written in float32.

    `weight` comes from `gemm_weight`; `hidden` (and `bias`) may be in the inputs' dtype.
    `out` (float32, [rows, V]) receives the result when given.
    """
    if out is None:
        out = torch.empty(hidden.shape[0], weight.shape[0], dtype=torch.float32,
                          device=hidden.device)
    operand = hidden.to(weight.dtype)
    if weight.dtype == torch.float32:
        torch.mm(operand, weight.t(), out=out)
    else:
        torch.mm(operand, weight.t(), out_dtype=torch.float32, out=out)
    if bias is not None:
        out.add_(bias)
    return out


def soft_cap_(logits: Tensor, softcap: float | None) -> Tensor:
    """In place: logits -> tanh(logits / softcap), what kernels read (nothing without a cap)."""
    if softcap is not None:
        logits.div_(softcap).tanh_()
    return logits


def soft_cap_slope(capped: Tensor, softcap: float, ignored: Tensor | None = None) -> Tensor:
    """d(tanh(u / c)) / du from x = tanh(u / c): (1 - x^2) / c, as a new tensor; 0 on the
    `ignored` rows ([rows] bool), whose hidden state may be NaN and whose gradient is 0
    (without them, a NaN there turns the rows' zero gradient into NaN)."""
    slope = capped.square().neg_().add_(1.0).div_(softcap)
    return slope if ignored is None else slope.masked_fill_(ignored.unsqueeze(1), 0.0)


def kernel_temperature(temperature: Temperature, softcap: float | None) -> Temperature:
    """The temperature kernels apply to tanh(u / c): T / c (T itself without a cap)."""
    if softcap is None:
        return temperature
    return temperature / softcap
