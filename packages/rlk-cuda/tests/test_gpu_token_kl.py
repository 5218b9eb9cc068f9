"""rlk.token_kl on CUDA tensors: its estimators against the cuda policy_loss kernel's KL.

token_kl runs policy_loss's native estimator code on the inputs' device; the cuda kernel
implements the same estimators in CUDA. With zero advantages, kl_coef=1 and token-sum, the
kernel's loss is the masked sum of token_kl and its gradient token_kl's gradient.
"""

from __future__ import annotations

import pytest
import rlk
import torch

pytestmark = pytest.mark.gpu
ESTIMATORS = ["k1", "k2", "k3", "abs", "k1+", "k3+", "abs+"]


@pytest.mark.parametrize("clamp", [None, 10.0])
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_kl_is_the_cuda_kernels_kl(estimator: str, clamp: float | None,
                                         dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(6)
    logp = (-torch.rand(64, 300, generator=gen) * 4).to(dtype)
    ref = logp.float() + torch.randn(64, 300, generator=gen)
    ref[0, :4] = logp[0, :4].float() + torch.tensor([-21.0, 21.0, 12.0, -12.0])  # clamps bind
    mask = torch.rand(64, 300, generator=gen) > 0.2
    mask[0, :4] = True
    logp, ref, mask = logp.cuda(), ref.cuda(), mask.cuda()
    options = rlk.PolicyLossOptions(kl_coef=1.0, kl_estimator=estimator, kl_clamp=clamp,
                                    agg="token-sum")
    leaf = logp.clone().requires_grad_(True)
    with rlk.use_backends("cuda", strict=True):
        loss, _ = rlk.policy_loss(leaf, logp.float(), torch.zeros(64, device="cuda"), mask,
                                  ref_logp=ref, options=options)
    (want_grad,) = torch.autograd.grad(loss, leaf)
    kl_leaf = logp.clone().requires_grad_(True)
    kl = rlk.token_kl(kl_leaf, ref, options=options)
    (got_grad,) = torch.autograd.grad(kl[mask].sum(), kl_leaf)
    assert kl.device.type == "cuda" and kl.dtype == torch.float32
    torch.testing.assert_close(kl.detach()[mask].double().sum(), loss.double(), rtol=1e-5,
                               atol=1e-4)
    grad_tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5  # rounded to logp's dtype
    torch.testing.assert_close(got_grad.float(), want_grad.float(), rtol=grad_tolerance,
                               atol=1e-5)
