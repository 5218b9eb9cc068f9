"""linear_logp orchestration against float64 references, with several chunks in each loop."""

from __future__ import annotations

import pytest
import torch
from tests_reference import logp_entropy

from rlk_cuda import linear_logp as linear

pytestmark = pytest.mark.gpu

# rows of one float32 logits block: the default (one block at these sizes), and a size that
# leaves several blocks and a short last one
BLOCK_ROWS = pytest.mark.parametrize("block_rows", [linear._BLOCK_ROWS, 48])


@BLOCK_ROWS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_linear_forward_backward(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, with_bias: bool, with_entropy: bool,
    block_rows: int,
) -> None:
    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", "0.25")  # several vocabulary chunks
    monkeypatch.setattr(linear, "_BLOCK_ROWS", block_rows)
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, h, v = 300, 64, 3000
    hidden = (torch.randn(n, h, generator=gen, device="cuda") / 4).to(dtype)
    weight = (torch.randn(v, h, generator=gen, device="cuda") / 4).to(dtype)
    bias = (torch.randn(v, generator=gen, device="cuda") / 4).to(dtype) if with_bias else None
    tokens = torch.randint(0, v, (n,), generator=gen, device="cuda")
    tokens[::7] = -100
    temp = 0.8
    lp, ent, lse = linear.forward(hidden, weight, tokens, bias, temp, -100, with_entropy, None,
                                  None)

    h64 = hidden.double().requires_grad_(True)
    w64 = weight.double().requires_grad_(True)
    b64 = bias.double().requires_grad_(True) if bias is not None else None
    logits = h64 @ w64.t() + (b64 if b64 is not None else 0)
    want_lp, want_ent = logp_entropy(logits, tokens, temp, -100)
    tol = 1e-4  # float32 logits whatever the inputs' dtype
    assert (lp.double() - want_lp).abs().max() < tol
    if with_entropy:
        assert ent is not None and (ent.double() - want_ent).abs().max() < tol * 10

    g = torch.randn(n, device="cuda")
    ge = torch.randn(n, device="cuda") if with_entropy else None
    total = (want_lp * g.double()).sum() + ((want_ent * ge.double()).sum() if ge is not None else 0)
    grads = torch.autograd.grad(total, [t for t in (h64, w64, b64) if t is not None])
    got = linear.backward(
        g, ge, hidden, weight, tokens, bias, temp, -100, None, lse, ent, (True, True, with_bias),
        None,
    )
    # grad_hidden in float32 (the op rounds it once, to its caller's dtype), the others in
    # their inputs' dtype
    dtypes = [torch.float32, dtype, dtype][: len(grads)]
    for mine, want, want_dtype in zip([t for t in got if t is not None], grads, dtypes,
                                      strict=True):
        assert mine.dtype == want_dtype
        scale = max(1.0, float(want.abs().max()))
        gtol = 1e-4 if dtype == torch.float32 else 3e-2
        assert (mine.double() - want).abs().max() < gtol * scale


def _head(n: int, h: int, v: int, dtype: torch.dtype, std: float = 2.0, seed: int = 1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, device="cuda").to(dtype)
    weight = (torch.randn(v, h, generator=gen, device="cuda") * std / h**0.5).to(dtype)
    tokens = torch.randint(0, v, (n,), generator=gen, device="cuda")
    return hidden, weight, tokens


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_float32_logits_put_logp_and_entropy_within_1e4_of_float64(
    dtype: torch.dtype, temperature: float
) -> None:
    """Issue #16's precision target (bf16 logits chunks were 0.02 off at these logits)."""
    import rlk
    from rlk.ops.linear_logp import reference

    hidden, weight, tokens = _head(512, 1024, 32768, dtype)
    with rlk.use_backends("cuda", strict=True):
        logp, entropy = rlk.linear_logp_entropy(hidden, weight, tokens, temperature=temperature)
    want_logp, want_entropy = reference.linear_logp_entropy(
        hidden, weight, tokens, temperature=temperature
    )
    assert (logp.double() - want_logp).abs().max() < 1e-4
    assert (entropy.double() - want_entropy).abs().max() < 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [1000, 3001, 70000])  # segmented, odd (scalar path), whole-row
def test_backward_kernel_reads_float32_logits_and_writes_the_gemm_dtype(
    dtype: torch.dtype, vocab: int
) -> None:
    """launch_backward(grad in bf16/fp16, float32 logits) equals the float32 gradient rounded."""
    from rlk_cuda.logp import launch_backward

    gen = torch.Generator(device="cuda").manual_seed(2)
    logits = torch.randn(37, vocab, generator=gen, device="cuda") * 3
    tokens = torch.randint(0, vocab, (37,), generator=gen, device="cuda")
    tokens[5] = -100
    g = torch.randn(37, generator=gen, device="cuda")
    ge = torch.randn(37, generator=gen, device="cuda")
    lse = torch.logsumexp(logits / 0.9, dim=1)
    p = torch.softmax(logits / 0.9, dim=1)
    entropy = -(p * torch.log_softmax(logits / 0.9, dim=1)).sum(1)
    wide = torch.empty_like(logits)
    narrow = torch.empty(37, vocab, dtype=dtype, device="cuda")
    for out in (wide, narrow):
        launch_backward(out, logits, tokens, g, ge, lse, entropy, 0.9, -100, 0, vocab)
    assert torch.equal(narrow, wide.to(dtype))


def test_soft_cap_kernel_and_its_chain_rule() -> None:
    from rlk_cuda.linear_logp import soft_cap

    gen = torch.Generator(device="cuda").manual_seed(3)
    raw = torch.randn(9, 5000, generator=gen, device="cuda") * 40
    capped = raw.clone()
    soft_cap(capped, 30.0)
    torch.testing.assert_close(capped, torch.tanh(raw / 30.0), atol=2e-6, rtol=0)
    grad = torch.randn(9, 5000, generator=gen, device="cuda").to(torch.bfloat16)
    want = (grad.float() * (1 - torch.tanh(raw / 30.0) ** 2) / 30.0).to(torch.bfloat16)
    soft_cap(capped, 30.0, grad)
    torch.testing.assert_close(grad, want, atol=1e-6, rtol=1e-2)


def test_accumulate_mm_adds_in_float32() -> None:
    from rlk_cuda.linear_logp import accumulate_mm

    gen = torch.Generator(device="cuda").manual_seed(4)
    a = torch.randn(64, 300, generator=gen, device="cuda").to(torch.bfloat16)
    b = torch.randn(300, 48, generator=gen, device="cuda").to(torch.bfloat16)
    acc = torch.full((64, 48), 1000.0, device="cuda")
    accumulate_mm(acc, a, b)
    want = 1000.0 + a.double() @ b.double()
    assert (acc.double() - want).abs().max() < 1e-3  # bf16 partial sums would be ~4 off


@BLOCK_ROWS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softcap_temperature_and_scale_through_the_public_op(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, block_rows: int
) -> None:
    import rlk
    from rlk.ops.linear_logp import reference

    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", "0.25")
    monkeypatch.setattr(linear, "_BLOCK_ROWS", block_rows)
    hidden, weight, tokens = _head(200, 64, 3001, dtype, std=8.0)
    tokens[::9] = -100
    temperature = torch.rand(200, device="cuda") + 0.5
    options = {"softcap": 5.0, "logit_scale": 1.5, "temperature": temperature}
    leaves = [t.clone().requires_grad_(True) for t in (hidden, weight)]
    with rlk.use_backends("cuda", strict=True):
        logp, entropy = rlk.linear_logp_entropy(*leaves, tokens, **options)
    want_logp, want_entropy = reference.linear_logp_entropy(hidden, weight, tokens, **options)
    assert (logp.double() - want_logp).abs().max() < 1e-4
    assert (entropy.double() - want_entropy).abs().max() < 1e-4
    g = torch.randn(200, device="cuda")
    (logp * g + entropy).sum().backward()
    want = reference.linear_logp_entropy_grad(hidden, weight, tokens, g, torch.ones_like(g),
                                              **options)
    gtol = 1e-4 if dtype == torch.float32 else 3e-2
    for leaf, expected in zip(leaves, want, strict=False):
        scale = max(1.0, float(expected.abs().max()))
        assert (leaf.grad.double() - expected).abs().max() < gtol * scale


@BLOCK_ROWS
@pytest.mark.parametrize("softcap", [None, 4.0])
def test_nan_hidden_state_in_an_ignored_row_gives_no_weight_gradient(
        monkeypatch: pytest.MonkeyPatch, softcap: float | None, block_rows: int) -> None:
    """Issue #19 item 7 on cuda: 0 * NaN in the weight-gradient GEMM; issue #31 S2: the soft
    cap's chain rule turned the ignored row's zero gradient into NaN."""
    import rlk

    monkeypatch.setattr(linear, "_BLOCK_ROWS", block_rows)

    hidden, weight, tokens = _head(64, 32, 500, torch.bfloat16)
    tokens[3] = -100
    hidden[3] = float("nan")
    h, w = (t.clone().requires_grad_(True) for t in (hidden, weight))
    with rlk.use_backends("cuda", strict=True):
        rlk.linear_logp(h, w, tokens, softcap=softcap).sum().backward()
    assert torch.isfinite(w.grad).all() and torch.isfinite(h.grad).all()
    assert (h.grad[3] == 0).all()


def test_zero_width_hidden_gives_the_bias_softmax() -> None:
    """Issue #19 item 12 on cuda: H = 0 makes the logits the bias."""
    import rlk

    tokens = torch.tensor([0, 3, -100], device="cuda")
    bias = torch.randn(5, device="cuda")
    leaves = [t.requires_grad_(True) for t in (torch.zeros(3, 0, device="cuda"),
                                               torch.zeros(5, 0, device="cuda"), bias.clone())]
    with rlk.use_backends("cuda", strict=True):
        logp = rlk.linear_logp(leaves[0], leaves[1], tokens, bias=leaves[2])
        logp.sum().backward()
    want = torch.log_softmax(bias.double(), 0)[[0, 3]]
    assert (logp[:2].double() - want).abs().max() < 1e-6 and logp[2] == 0
    assert leaves[0].grad.shape == (3, 0) and leaves[1].grad.shape == (5, 0)
    assert torch.isfinite(leaves[2].grad).all()


@pytest.mark.parametrize("with_bias", [False, True])
def test_a_float32_weight_under_autocast_gets_its_gradient_unrounded(
        monkeypatch: pytest.MonkeyPatch, with_bias: bool) -> None:
    """Mixed precision's float32 master weight (TRL's default): the GEMMs run in bfloat16,
    the weight's gradient comes back float32 without the 2^-9 rounding of a bfloat16 one
    (issue #26's GPU parity: TRL's fused head keeps it). It rounds to the bfloat16 weight's
    gradient, and it is closer to float64 over the same operands."""
    import rlk

    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", "1")  # several vocabulary chunks
    hidden, weight, tokens = _head(2048, 256, 5000, torch.float32)
    # bf16 values: the cast path rounds a float32 bias, so the two calls share operands
    bias = torch.randn(5000, device="cuda").bfloat16().float() if with_bias else None
    grad = torch.randn(2048, device="cuda")

    def weight_grads(weight: torch.Tensor, bias: torch.Tensor | None) -> list[torch.Tensor]:
        leaves = [weight.clone().requires_grad_(True)]
        leaves += [] if bias is None else [bias.clone().requires_grad_(True)]
        with rlk.use_backends("cuda", strict=True), torch.autocast("cuda", dtype=torch.bfloat16):
            logp = rlk.linear_logp(hidden, leaves[0], tokens, bias=None if bias is None
                                   else leaves[1])
        return list(torch.autograd.grad(logp, leaves, grad))

    mixed = weight_grads(weight, bias)
    reduced = weight_grads(weight.bfloat16(), None if bias is None else bias.bfloat16())
    h64, w64 = hidden.bfloat16().double(), weight.bfloat16().double().requires_grad_(True)
    b64 = None if bias is None else bias.bfloat16().double().requires_grad_(True)
    want_lp, _ = logp_entropy(h64 @ w64.t() + (0 if b64 is None else b64), tokens, 1.0, -100)
    wants = torch.autograd.grad((want_lp * grad.double()).sum(),
                                [w64] + ([] if b64 is None else [b64]))
    for kept, rounded, want in zip(mixed, reduced, wants, strict=True):
        assert kept.dtype == torch.float32 and rounded.dtype == torch.bfloat16
        step = rounded.float().abs() * 2.0**-7 + 1e-30  # one bfloat16 step
        assert ((kept.bfloat16().float() - rounded.float()).abs() <= step).all()
        assert (kept.double() - want).norm() < 0.8 * (rounded.double() - want).norm()


def test_a_float32_weight_is_copied_one_vocabulary_chunk_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under autocast the forward reads a float32 weight through reduced copies of one chunk
    each, and a copy goes before the next is made: the peak holds one copy more than with a
    bfloat16 weight of the same values (whose chunks are views), not two (issue #26: patched
    TRL's memory at most TRL's)."""
    import rlk

    # 4096-column chunks of 2048-row blocks, pinned: a larger default block would narrow the
    # chunks until two copies fit the bound below
    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", "64")
    monkeypatch.setattr(linear, "_BLOCK_ROWS", 2048)
    hidden, weight, tokens = _head(4096, 2048, 65536, torch.float32)
    hidden = hidden.bfloat16()
    copy_bytes = 4096 * 2048 * 2  # one chunk of the weight in bfloat16: 16 MiB

    def peak(weight: torch.Tensor) -> int:
        rlk.linear_logp(hidden, weight, tokens)  # warm: the same allocations as measured
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            rlk.linear_logp(hidden, weight, tokens)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    with rlk.use_backends("cuda", strict=True), torch.autocast("cuda", dtype=torch.bfloat16):
        views, copies = peak(weight.bfloat16()), peak(weight)
    assert copies - views <= copy_bytes + 2**20, (views, copies)
