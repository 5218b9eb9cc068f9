"""The logp kernels at their edges (issues #15 item 2 and #19 items 5, 6, 8): a dominant token
at large logits / T, the smallest temperature, bad per-row temperatures, repeated and missing
rows, the entropy-only op, and the calls the kernels decline (K tokens, float64 logits)."""

from __future__ import annotations

import pytest
import rlk
import torch
from rlk._runtime.temperature import MIN_TEMPERATURE
from rlk.testing.poison import poisoned_allocations
from tests_reference import logp_entropy, logp_entropy_grad

from rlk_cuda import entropy as entropy_kernels
from rlk_cuda import logp as kernels

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# the documented gradient tolerance (docs/ops/logp.md): |got - want| <= atol + rtol |want|
GRAD_TOLERANCE = {torch.float32: (1e-6, 1e-4), torch.bfloat16: (1e-6, 8e-3),
                  torch.float16: (1e-6, 1e-3)}


def _within(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = GRAD_TOLERANCE[dtype]
    excess = (got.double() - want).abs() - (atol + rtol * want.abs())
    assert excess.max().item() <= 0, f"misses the tolerance by {excess.max().item():.3e}"


def _dominant(rows: int, vocab: int, level: float, margin: float, dtype: torch.dtype, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = level + torch.randn(rows, vocab, generator=gen, device="cuda")
    tokens = torch.randint(0, vocab, (rows,), generator=gen, device="cuda")
    lead = margin + torch.rand(rows, generator=gen, device="cuda")
    logits[torch.arange(rows, device="cuda"), tokens] = logits.amax(dim=1) + lead
    return logits.to(dtype), tokens


CASES = [  # (rows, vocab, level, margin, temperature): 1 - p(token) ~ 1e-3 .. 1e-5
    (1, 4, None, None, 1.0),  # the issue's [70, 63, 62, 60], token 0
    (64, 300, 60.0, 9.0, 1.0),
    (32, 32768, 30.0, 12.0, 1.0),  # one 256-thread block per row
    (16, 151936, 40.0, 18.0, 1.0),  # rows split in segments
    (64, 64, 2.0, 1.0, 0.125),
    (64, 70001, 5.0, 1.5, 0.25),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("with_entropy", [False, True])
def test_dominant_token_gradient_meets_the_tolerance(dtype, case, with_entropy) -> None:
    rows, vocab, level, margin, temperature = case
    if level is None:
        logits = torch.tensor([[70.0, 63.0, 62.0, 60.0]], device="cuda").to(dtype)
        tokens = torch.zeros(1, dtype=torch.int64, device="cuda")
    else:
        logits, tokens = _dominant(rows, vocab, level, margin, dtype, seed=vocab)
    _lp, ent, lse = kernels.forward(logits, tokens, temperature, -100, None, None, with_entropy)
    assert lse.dtype == torch.float64
    g = torch.randn(rows, device="cuda")
    ge = torch.randn(rows, device="cuda") if with_entropy else None
    want = logp_entropy_grad(logits, tokens, temperature, -100, g, ge)
    with poisoned_allocations():
        grad = kernels.backward(g, ge, logits, tokens, temperature, -100, None, lse, ent, False)
    _within(grad, want, dtype)
    want_lp, _ = logp_entropy(logits, tokens, temperature, -100)
    torch.testing.assert_close(_lp.double(), want_lp, atol=2e-5, rtol=1e-5)


def test_lse_is_float64_logsumexp() -> None:
    logits = (torch.randn(32, 151936, device="cuda") * 3).to(torch.bfloat16)
    tokens = torch.zeros(32, dtype=torch.int64, device="cuda")
    _, _, lse = kernels.forward(logits, tokens, 0.7, -100, None, None, False)
    want = torch.logsumexp(logits.double() / 0.7, dim=1)
    torch.testing.assert_close(lse, want, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_entropy_op_matches_float64_and_logp_entropy(dtype) -> None:
    gen = torch.Generator(device="cuda").manual_seed(4)
    logits = (torch.randn(48, 40001, generator=gen, device="cuda") * 3).to(dtype)
    keep = torch.rand(48, generator=gen, device="cuda") > 0.2
    temperature = torch.rand(48, generator=gen, device="cuda") + 0.5
    rows = torch.tensor([7, 0, 7, 47], device="cuda")
    with poisoned_allocations():
        entropy, lse = entropy_kernels.forward(logits, temperature, keep, rows, None)
    tokens = torch.zeros(48, dtype=torch.int64, device="cuda").masked_fill(~keep, -1)
    _, want = logp_entropy(logits, tokens, temperature, -1)
    torch.testing.assert_close(entropy.double(), want[rows], atol=1e-4, rtol=1e-5)
    g = torch.randn(4, generator=gen, device="cuda")
    grad = entropy_kernels.backward(g, logits, temperature, keep, rows, lse, entropy, False)
    full = torch.zeros(48, device="cuda").index_add_(0, rows, g)
    want_grad = logp_entropy_grad(logits, tokens, temperature, -1, torch.zeros_like(full), full)
    torch.testing.assert_close(grad.double(), want_grad,
                               atol=1e-6, rtol=GRAD_TOLERANCE[dtype][1])
    with rlk.use_backends("cuda", strict=True):
        _, paired = rlk.logp_entropy(logits, torch.zeros(48, dtype=torch.int64, device="cuda"),
                                     temperature=temperature)
        assert torch.equal(rlk.entropy(logits, temperature=temperature), paired)


def test_smallest_temperature_is_finite_and_sample_is_greedy() -> None:
    logits = torch.randn(16, 3000, device="cuda") * 3
    top = logits.argmax(dim=1)
    with rlk.use_backends("cuda", strict=True):
        at_top = rlk.logp(logits, top, temperature=MIN_TEMPERATURE)
        entropy = rlk.entropy(logits, temperature=MIN_TEMPERATURE)
        drawn = rlk.sample(logits, temperature=MIN_TEMPERATURE, seed=1)
    assert torch.equal(at_top, torch.zeros_like(at_top))
    assert torch.equal(entropy, torch.zeros_like(entropy))
    assert torch.equal(drawn.tokens, top)
    assert torch.equal(drawn.logp, torch.zeros_like(drawn.logp))


def test_bad_per_row_temperature_poisons_its_row_only() -> None:
    logits = torch.randn(4, 5000, device="cuda")
    tokens = torch.randint(0, 5000, (4,), device="cuda")
    temperature = torch.tensor([0.7, -1.0, float("inf"), 0.0], device="cuda")
    with rlk.use_backends("cuda", strict=True):
        logp, entropy = rlk.logp_entropy(logits, tokens, temperature=temperature)
    assert torch.isfinite(logp[0]) and torch.isfinite(entropy[0])
    assert logp[1:].isnan().all() and entropy[1:].isnan().all()


def test_repeated_and_missing_rows_through_the_op() -> None:
    logits = torch.randn(6, 2000, device="cuda")
    tokens = torch.randint(0, 2000, (6,), device="cuda")
    leaf = logits.clone().requires_grad_(True)
    rows = torch.tensor([4, 1, 4, 9], device="cuda")  # 9 is not a row: NaN, no gradient
    with rlk.use_backends("cuda", strict=True):
        result = rlk.logp(leaf, tokens, rows=rows)
    assert result[3].isnan() and torch.isfinite(result[:3]).all()
    result[:3].sum().backward()
    upstream = torch.zeros(6, device="cuda").index_add_(0, rows[:3], torch.ones(3, device="cuda"))
    want = logp_entropy_grad(logits, tokens, 1.0, -100, upstream, None)
    assert leaf.grad is not None
    _within(leaf.grad, want, torch.float32)


def test_declined_calls_fall_back_with_their_reason() -> None:
    logits = torch.randn(3, 100, device="cuda")
    several = torch.randint(0, 100, (3, 4), device="cuda")
    selection = rlk.explain("logp", logits, several)
    assert selection.backend == "native"
    assert "one token per row" in selection.rejected["cuda"]
    wide = logits.double()
    selection = rlk.explain("logp", wide, several[:, 0])
    assert selection.backend == "native"
    assert selection.rejected["cuda"].startswith("does not take float64")
    want = logp_entropy(wide, several[:, 0], 1.0, -100)[0]
    torch.testing.assert_close(rlk.logp(wide, several[:, 0]), want, atol=1e-12, rtol=1e-12)
