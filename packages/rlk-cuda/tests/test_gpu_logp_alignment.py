"""Rows at any alignment (issue #29 item 1): the forward and backward kernels read rows that
start anywhere with 16-byte loads (csrc/row_vectors.cuh), and give the bits of the same rows
on 16-byte boundaries, in every dtype, for rows in one block and rows split in segments."""

from __future__ import annotations

import pytest
import torch
from rlk.testing.poison import poisoned_allocations
from tests_reference import logp_entropy, logp_entropy_grad

from rlk_cuda import logp as kernels

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
VOCABS = [1001, 32001, 70001, 200001]  # one block a row; 3 and 7 segments (V >= 65536)
GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _rows(count: int, vocab: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(count, vocab, generator=gen, device="cuda") * 3.0).to(dtype)
    tokens = torch.randint(0, vocab, (count,), generator=gen, device="cuda")
    temp = torch.rand(count, generator=gen, device="cuda") + 0.5
    return logits, tokens, temp


def _placed(logits: torch.Tensor, offset: int) -> torch.Tensor:
    """`logits` as a view whose rows all start `offset` elements past a 16-byte boundary (a row
    stride that is a whole number of 16-byte vectors), the buffer around them poisoned."""
    count, vocab = logits.shape
    per_vector = 16 // logits.element_size()
    stride = (vocab + offset + per_vector - 1) // per_vector * per_vector
    buffer = torch.full((count, stride), float("nan"), device="cuda", dtype=logits.dtype)
    view = buffer[:, offset : offset + vocab]
    view.copy_(logits)
    assert (view.data_ptr() - offset * logits.element_size()) % 16 == 0
    return view


def _forward(logits: torch.Tensor, tokens: torch.Tensor, temp: torch.Tensor):
    with poisoned_allocations():
        return kernels.forward(logits, tokens, temp, -100, None, None, True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_forward_bits_at_every_offset(dtype: torch.dtype, vocab: int) -> None:
    """Every element offset within a 16-byte vector (every word shift and sub-word shift of the
    kernels built for any alignment) gives the bits of the aligned rows, which match float64."""
    logits, tokens, temp = _rows(6, vocab, dtype, seed=vocab)
    tokens[2] = -100
    lp, ent, lse = _forward(_placed(logits, 0), tokens, temp)
    want_lp, want_ent = logp_entropy(logits, tokens, temp, -100)
    assert ent is not None
    assert (lp.double() - want_lp).abs().max().item() <= 2e-5
    ent_scale = max(1.0, want_ent.abs().max().item())
    assert (ent.double() - want_ent).abs().max().item() <= 5e-5 * ent_scale
    for offset in range(1, 16 // logits.element_size()):
        lp2, ent2, lse2 = _forward(_placed(logits, offset), tokens, temp)
        assert torch.equal(lp2, lp) and torch.equal(ent2, ent) and torch.equal(lse2, lse), offset


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [32001, 50257, 65537])
def test_contiguous_odd_vocabulary_rows_match_their_aligned_copies(dtype: torch.dtype,
                                                                   vocab: int) -> None:
    """[N, V] with V odd: the rows of one launch start at every alignment; each row's bits are
    those of the same row on a 16-byte boundary, its gradient too."""
    logits, tokens, temp = _rows(9, vocab, dtype, seed=7)
    lp, ent, lse = _forward(logits, tokens, temp)
    aligned = _placed(logits, 0)
    lp0, ent0, lse0 = _forward(aligned, tokens, temp)
    assert torch.equal(lp, lp0) and torch.equal(ent, ent0) and torch.equal(lse, lse0)
    g, ge = torch.randn(9, device="cuda"), torch.randn(9, device="cuda")
    with poisoned_allocations():
        grad = kernels.backward(g, ge, logits, tokens, temp, -100, None, lse, ent, False)
        grad0 = kernels.backward(g, ge, aligned, tokens, temp, -100, None, lse0, ent0, False)
    assert torch.equal(grad, grad0)
    want = logp_entropy_grad(logits, tokens, temp, -100, g, ge)
    err = (grad.double() - want).abs().max().item()
    assert err <= GRAD_TOL[dtype] * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("wide", "vocab"), [(151936, 151665), (32768, 32001), (4096, 4093)])
def test_column_slices_of_wider_rows(dtype: torch.dtype, wide: int, vocab: int) -> None:
    """logits[:, :V] of a padded LM head: aligned rows with an unaligned tail, and a fresh dense
    gradient whose rows start at other alignments than the logits' (the backward's shifts)."""
    full, tokens, temp = _rows(5, wide, dtype, seed=wide)
    tokens = tokens % vocab
    view = full[:, :vocab]
    copy = view.contiguous()
    lp, ent, lse = _forward(view, tokens, temp)
    lp0, ent0, lse0 = _forward(_placed(copy, 0), tokens, temp)
    assert torch.equal(lp, lp0) and torch.equal(ent, ent0) and torch.equal(lse, lse0)
    g, ge = torch.randn(5, device="cuda"), torch.randn(5, device="cuda")
    with poisoned_allocations():
        grad = kernels.backward(g, ge, view, tokens, temp, -100, None, lse, ent, False)
    assert grad.is_contiguous() and grad.shape == view.shape
    reference = kernels.backward(g, ge, _placed(copy, 0), tokens, temp, -100, None, lse0, ent0,
                                 False)
    assert torch.equal(grad, reference)
    want = logp_entropy_grad(copy, tokens, temp, -100, g, ge)
    err = (grad.double() - want).abs().max().item()
    assert err <= GRAD_TOL[dtype] * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [3001, 70001])
def test_backward_bits_at_every_pair_of_offsets(dtype: torch.dtype, vocab: int) -> None:
    """The gradient written at one alignment from logits at another (every element offset of
    the logits against an aligned gradient, through the kernel's launch arguments) equals the
    aligned gradient bit for bit."""
    logits, tokens, temp = _rows(4, vocab, dtype, seed=3)
    _lp, ent, lse = _forward(logits, tokens, temp)
    g, ge = torch.randn(4, device="cuda"), torch.randn(4, device="cuda")
    want = kernels.backward(g, ge, _placed(logits, 0), tokens, temp, -100, None, lse, ent, False)
    for offset in range(1, 16 // logits.element_size()):
        source = _placed(logits, offset)
        for out_offset in (0, offset, (offset + 1) % (16 // logits.element_size())):
            grad = _placed(torch.full_like(logits, float("nan")), out_offset)
            kernels.launch_backward(grad, source, tokens.contiguous(), g, ge, lse, ent, temp,
                                    -100, 0, vocab)
            assert torch.equal(grad, want), (offset, out_offset)
