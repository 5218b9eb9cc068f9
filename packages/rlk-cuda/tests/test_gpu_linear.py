"""linear_logp orchestration against float64 references, with several chunks in each loop."""

from __future__ import annotations

import pytest
import torch
from tests_reference import logp_entropy

from rlk_cuda import linear

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_linear_forward_backward(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, with_bias: bool, with_entropy: bool
) -> None:
    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", "0.25")  # several row and vocabulary chunks
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, h, v = 300, 64, 3000
    hidden = (torch.randn(n, h, generator=gen, device="cuda") / 4).to(dtype)
    weight = (torch.randn(v, h, generator=gen, device="cuda") / 4).to(dtype)
    bias = (torch.randn(v, generator=gen, device="cuda") / 4).to(dtype) if with_bias else None
    tokens = torch.randint(0, v, (n,), generator=gen, device="cuda")
    tokens[::7] = -100
    temp = 0.8
    lp, ent, lse = linear.forward(hidden, weight, tokens, bias, temp, -100, with_entropy, None)

    h64 = hidden.double().requires_grad_(True)
    w64 = weight.double().requires_grad_(True)
    b64 = bias.double().requires_grad_(True) if bias is not None else None
    logits = h64 @ w64.t() + (b64 if b64 is not None else 0)
    want_lp, want_ent = logp_entropy(logits, tokens, temp, -100)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert (lp.double() - want_lp).abs().max() < tol
    if with_entropy:
        assert ent is not None and (ent.double() - want_ent).abs().max() < tol * 10

    g = torch.randn(n, device="cuda")
    ge = torch.randn(n, device="cuda") if with_entropy else None
    total = (want_lp * g.double()).sum() + ((want_ent * ge.double()).sum() if ge is not None else 0)
    grads = torch.autograd.grad(total, [t for t in (h64, w64, b64) if t is not None])
    got = linear.backward(
        g, ge, hidden, weight, tokens, bias, temp, -100, None, lse, ent, (True, True, with_bias)
    )
    for mine, want in zip([t for t in got if t is not None], grads, strict=True):
        assert mine.dtype == dtype
        scale = max(1.0, float(want.abs().max()))
        gtol = 1e-4 if dtype == torch.float32 else 3e-2
        assert (mine.double() - want).abs().max() < gtol * scale
