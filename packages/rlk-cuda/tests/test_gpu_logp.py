"""logp / logp_entropy kernels against float64 references on random data, outputs poisoned."""

from __future__ import annotations

import pytest
import torch
from rlk.testing.poison import poisoned_allocations
from tests_reference import logp_entropy, logp_entropy_grad

from rlk_cuda import logp as kernels

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-5, torch.float16: 2e-5}
GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _inputs(rows: int, vocab: int, dtype: torch.dtype, seed: int, scale: float = 4.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=gen, device="cuda") * scale).to(dtype)
    tokens = torch.randint(0, vocab, (rows,), generator=gen, device="cuda")
    return logits, tokens


def _close(got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    assert got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan()), "NaN pattern differs"
    err = (got.double() - want).abs().nan_to_num(0.0).max().item()
    assert err <= atol, f"max abs error {err:.3g} > {atol:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1, 7, 1000, 4099, 32768, 151936])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_forward_matches_float64(dtype: torch.dtype, vocab: int, with_entropy: bool) -> None:
    rows = 64 if vocab < 100000 else 16
    logits, tokens = _inputs(rows, vocab, dtype, seed=vocab)
    tokens[3] = -100
    with poisoned_allocations():
        lp, ent, lse = kernels.forward(logits, tokens, 1.0, -100, None, None, with_entropy)
    want_lp, want_ent = logp_entropy(logits, tokens, 1.0, -100)
    _close(lp, want_lp, TOL[dtype])
    if with_entropy:
        assert ent is not None
        _close(ent, want_ent, 5e-5 * max(1.0, float(want_ent.abs().max())))
    live = tokens != -100
    want_lse = torch.logsumexp(logits.double(), 1)
    _close(lse[live], want_lse[live], 5e-5 * max(1.0, float(want_lse.abs().max())))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [3001, 70001])  # one block per row / rows split in segments
def test_temperature_rows_out_and_strides(dtype: torch.dtype, vocab: int) -> None:
    logits, tokens = _inputs(48, vocab, dtype, seed=11)
    wide = torch.randn(48, vocab + 9, device="cuda").to(dtype)
    wide[:, 3 : vocab + 3] = logits  # rows start unaligned and have a row stride != V
    view = wide[:, 3 : vocab + 3]
    temp = torch.rand(48, device="cuda") * 1.5 + 0.25
    rows = torch.tensor([5, 0, 47, 5, 20], device="cuda")
    out = torch.full((5,), float("nan"), device="cuda")
    with poisoned_allocations():
        lp, ent, _ = kernels.forward(view, tokens, temp, -100, rows, out, True)
    assert lp.data_ptr() == out.data_ptr()
    want_lp, want_ent = logp_entropy(logits, tokens, temp, -100)
    _close(lp, want_lp[rows], TOL[dtype])
    assert ent is not None
    _close(ent, want_ent[rows], 1e-4)
    transposed = logits.t().contiguous().t()  # column stride != 1: copied, same answer
    lp2, _, _ = kernels.forward(transposed, tokens, 0.7, -100, None, None, False)
    _close(lp2, logp_entropy(logits, tokens, 0.7, -100)[0], TOL[dtype])


def test_special_rows() -> None:
    logits, tokens = _inputs(6, 513, torch.float32, seed=3)
    logits[0, 17] = float("nan")
    logits[1] = float("-inf")
    logits[2, :500] = float("-inf")  # a few finite values only
    tokens[3] = 513  # out of range: NaN, no read out of bounds
    tokens[4] = -7
    tokens[5] = -100
    lp, ent, _ = kernels.forward(logits, tokens, 1.0, -100, None, None, True)
    assert lp[0].isnan() and ent is not None and ent[0].isnan()
    assert lp[1].isnan() and ent[1].isnan()
    assert lp[3].isnan() and lp[4].isnan()
    assert lp[5] == 0 and ent[5] == 0
    want_lp, want_ent = logp_entropy(logits[2:3], tokens[2:3], 1.0, -100)
    _close(lp[2:3], want_lp, 1e-5)
    _close(ent[2:3], want_ent, 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [32000, 151936])
def test_batch_invariant(dtype: torch.dtype, vocab: int) -> None:
    logits, tokens = _inputs(40, vocab, dtype, seed=5)
    full, ent, _ = kernels.forward(logits, tokens, 1.3, -100, None, None, True)
    for r in (0, 17, 39):
        one, ent1, _ = kernels.forward(
            logits[r : r + 1], tokens[r : r + 1], 1.3, -100, None, None, True
        )
        assert torch.equal(one, full[r : r + 1]) and ent1 is not None and ent is not None
        assert torch.equal(ent1, ent[r : r + 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_backward_matches_float64(dtype: torch.dtype, with_entropy: bool, inplace: bool) -> None:
    logits, tokens = _inputs(32, 5003, dtype, seed=21, scale=2.0)
    tokens[1] = -100
    temp = torch.rand(32, device="cuda") + 0.5
    _lp, ent, lse = kernels.forward(logits, tokens, temp, -100, None, None, with_entropy)
    g = torch.randn(32, device="cuda")
    ge = torch.randn(32, device="cuda") if with_entropy else None
    want = logp_entropy_grad(logits, tokens, temp, -100, g, ge)
    source = logits.clone()
    with poisoned_allocations():
        grad = kernels.backward(g, ge, source, tokens, temp, -100, None, lse, ent, inplace)
    assert grad.dtype == dtype and grad.shape == logits.shape
    if inplace:
        assert grad.data_ptr() == source.data_ptr()
    assert torch.all(grad[1] == 0)
    _close(grad.float(), want, GRAD_TOL[dtype] * max(1.0, float(want.abs().max())))


def test_backward_rows_repeated_and_inplace() -> None:
    logits, tokens = _inputs(20, 999, torch.float32, seed=8)
    rows = torch.tensor([3, 9, 3, 14], device="cuda")
    _lp, ent, lse = kernels.forward(logits, tokens, 1.0, -100, rows, None, True)
    g = torch.randn(4, device="cuda")
    ge = torch.randn(4, device="cuda")
    full_g = torch.zeros(20, device="cuda").index_add_(0, rows, g)
    full_ge = torch.zeros(20, device="cuda").index_add_(0, rows, ge)
    want = logp_entropy_grad(logits, tokens, 1.0, -100, full_g, full_ge)
    for inplace in (False, True):
        source = logits.clone()
        grad = kernels.backward(g, ge, source, tokens, 1.0, -100, rows, lse, ent, inplace)
        _close(grad, want, 1e-5)


def test_out_of_range_token_gradient_is_nan() -> None:
    logits, tokens = _inputs(4, 100, torch.float32, seed=2)
    tokens[2] = 100
    _lp, _, lse = kernels.forward(logits, tokens, 1.0, -100, None, None, False)
    grad = kernels.backward(
        torch.ones(4, device="cuda"), None, logits, tokens, 1.0, -100, None, lse, None, False
    )
    assert grad[2].isnan().all() and not grad[[0, 1, 3]].isnan().any()


@pytest.mark.parametrize("vocab", [3001, 40001])
def test_backward_unaligned_view(vocab: int) -> None:
    """Rows of the logits and of the fresh gradient start at different alignments."""
    logits, tokens = _inputs(12, vocab, torch.bfloat16, seed=13)
    wide = torch.randn(12, vocab + 5, device="cuda").to(torch.bfloat16)
    wide[:, 1 : vocab + 1] = logits
    view = wide[:, 1 : vocab + 1]
    _, ent, lse = kernels.forward(view, tokens, 1.0, -100, None, None, True)
    g, ge = torch.randn(12, device="cuda"), torch.randn(12, device="cuda")
    with poisoned_allocations():
        grad = kernels.backward(g, ge, view, tokens, 1.0, -100, None, lse, ent, False)
    want = logp_entropy_grad(logits, tokens, 1.0, -100, g, ge)
    _close(grad.float(), want, 1e-2 * max(1.0, float(want.abs().max())))


def test_entropy_gradient_with_negative_infinity() -> None:
    logits, tokens = _inputs(8, 2000, torch.float32, seed=17)
    logits[:, 100:900] = float("-inf")
    tokens[:] = 5
    _, ent, lse = kernels.forward(logits, tokens, 1.0, -100, None, None, True)
    g, ge = torch.randn(8, device="cuda"), torch.randn(8, device="cuda")
    grad = kernels.backward(g, ge, logits, tokens, 1.0, -100, None, lse, ent, False)
    want = logp_entropy_grad(logits, tokens, 1.0, -100, g, ge)
    assert not grad.isnan().any()
    _close(grad, want, 1e-5)


@pytest.mark.parametrize("vocab", [1001, 70001])
def test_bits_do_not_depend_on_row_alignment(vocab: int) -> None:
    """With V odd the rows of one tensor start at every alignment; alone, each is aligned."""
    logits, tokens = _inputs(9, vocab, torch.bfloat16, seed=19)
    full, ent, _ = kernels.forward(logits, tokens, 0.9, -100, None, None, True)
    assert ent is not None
    for r in range(9):
        one, ent1, _ = kernels.forward(
            logits[r : r + 1].clone(), tokens[r : r + 1], 0.9, -100, None, None, True
        )
        assert ent1 is not None
        assert torch.equal(one, full[r : r + 1]) and torch.equal(ent1, ent[r : r + 1])
