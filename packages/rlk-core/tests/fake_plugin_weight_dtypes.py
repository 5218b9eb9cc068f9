"""Two backends of the linear ops that record the weight dtype rlk hands them: `keeps` declares
the float32_weight property, `casts` does not. Both compute with the native kernels on the
weight rounded to hidden's dtype, as the property's contract asks."""

from __future__ import annotations

import torch

import rlk
from rlk.ops.linear_logp import native as native_linear_logp
from rlk.ops.linear_policy_loss import native as native_linear_policy_loss

RLK_PLUGIN_API = "2.0"
# (backend, phase, hidden dtype, weight dtype, bias dtype or None), one per kernel call
received: list[tuple[str, str, torch.dtype, torch.dtype, torch.dtype | None]] = []


def _record(backend: str, phase: str, hidden, weight, bias) -> None:
    received.append((backend, phase, hidden.dtype, weight.dtype,
                     None if bias is None else bias.dtype))


def _rounded(hidden, weight, bias):
    """weight and bias in hidden's dtype: what the GEMMs read under the property."""
    return weight.to(hidden.dtype), None if bias is None else bias.to(hidden.dtype)


def _backend(name: str):
    def linear_logp_forward(*, hidden, weight, bias, **rest):
        _record(name, "forward", hidden, weight, bias)
        weight, bias = _rounded(hidden, weight, bias)
        return native_linear_logp.forward(hidden=hidden, weight=weight, bias=bias, **rest)

    def linear_logp_backward(grad_logp, grad_entropy, hidden, weight, tokens, bias, *rest):
        _record(name, "backward", hidden, weight, bias)
        rounded, rounded_bias = _rounded(hidden, weight, bias)
        # the native kernel's gradients are float32, which the property allows
        return native_linear_logp.backward(grad_logp, grad_entropy, hidden, rounded, tokens,
                                           rounded_bias, *rest)

    def linear_policy_loss_forward(*, hidden, weight, bias, **rest):
        _record(name, "forward", hidden, weight, bias)
        weight, bias = _rounded(hidden, weight, bias)
        return native_linear_policy_loss.forward(hidden=hidden, weight=weight, bias=bias,
                                                 **rest)

    return linear_logp_forward, linear_logp_backward, linear_policy_loss_forward


keeps_logp, keeps_logp_backward, keeps_loss = _backend("keeps")
casts_logp, casts_logp_backward, casts_loss = _backend("casts")


@rlk.hookimpl
def rlk_register(registry):
    for backend, properties in (("keeps", ("float32_weight",)), ("casts", ())):
        registry.add_backend(backend, priority=5)
        for op in ("linear_logp", "linear_logp_entropy"):
            registry.add_kernel(op, backend, f"fake_plugin_weight_dtypes:{backend}_logp",
                                backward=f"fake_plugin_weight_dtypes:{backend}_logp_backward",
                                devices=("cpu",), properties=properties)
        registry.add_kernel("linear_policy_loss", backend,
                            f"fake_plugin_weight_dtypes:{backend}_loss", devices=("cpu",),
                            properties=properties)
