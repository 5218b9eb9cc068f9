"""What trainers pass to the logp family (issue #15 item 2): output dtype, float64 logits,
mask=, (..., K) gathers, 0-d tensor and NumPy temperatures, and the entropy-only op."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlk
from rlk.ops.entropy import reference as entropy_reference
from rlk.ops.logp import reference
from rlk.testing.compare import assert_within_one_ulp

GEN = torch.Generator().manual_seed(11)


def _data(*lead: int, vocab: int = 40, dtype=torch.float32):
    logits = (torch.randn(*lead, vocab, generator=GEN) * 3).to(dtype)
    tokens = torch.randint(0, vocab, lead, generator=GEN)
    return logits, tokens


def _close(actual, expected, atol=2e-5, rtol=1e-5):
    torch.testing.assert_close(actual.double(), expected, atol=atol, rtol=rtol, equal_nan=True)


def _trl_selective_log_softmax(logits, index):
    """TRL 1.16's documented equivalent of selective_log_softmax (trl/trainer/utils.py)."""
    log_probs = logits.log_softmax(-1)
    if index.ndim == logits.ndim - 1:
        return torch.gather(log_probs, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
    return torch.gather(log_probs, dim=-1, index=index)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dtype_gives_the_output_dtype_from_the_float32_result(dtype):
    logits, tokens = _data(3, 4, dtype=torch.bfloat16)
    result = rlk.logp(logits, tokens, dtype=dtype)
    assert result.dtype == dtype
    assert torch.equal(result, rlk.logp(logits, tokens).to(dtype))
    logp, entropy = rlk.logp_entropy(logits, tokens, dtype=dtype)
    assert logp.dtype == entropy.dtype == dtype
    assert rlk.entropy(logits, dtype=dtype).dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_is_within_one_ulp_of_the_correctly_rounded_value(dtype):
    """Issue #31 F5, the documented contract: `dtype=` rounds the float32 result once more,
    and float32's own few ulps of error can sit across a rounding boundary of `dtype`, so
    an output may be one ulp of `dtype` from the float64 value rounded to it (here 1 entropy
    in 20,000 float16 rows; none would be exact without float64 arithmetic)."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(20000, 50, generator=gen) * 3).to(torch.float16)
    tokens = torch.randint(0, 50, (20000,), generator=gen)
    truths = reference.logp_entropy(logits.double(), tokens)
    for got, truth in zip(rlk.logp_entropy(logits, tokens, dtype=dtype), truths, strict=True):
        assert got.dtype == dtype
        assert_within_one_ulp("dtype= output", got, truth)


def test_dtype_matches_trl_selective_log_softmax_in_the_input_dtype():
    logits, tokens = _data(2, 5, dtype=torch.bfloat16)
    leaf = logits.clone().requires_grad_(True)
    ours = rlk.logp(leaf, tokens, dtype=logits.dtype)
    assert ours.dtype == torch.bfloat16
    trl = _trl_selective_log_softmax(logits.float(), tokens).to(torch.bfloat16)
    torch.testing.assert_close(ours, trl, atol=0.02, rtol=0.01)
    ours.float().sum().backward()
    assert leaf.grad is not None and leaf.grad.dtype == torch.bfloat16


def test_float64_logits_are_computed_in_float64():
    logits, tokens = _data(3, 7, dtype=torch.float64)
    logits = logits * 1e-9 + 5.0  # differences float32 cannot resolve
    temperature = torch.rand(3, 7, generator=GEN, dtype=torch.float64) + 0.5
    leaf = logits.clone().requires_grad_(True)
    logp, entropy = rlk.logp_entropy(leaf, tokens, temperature=temperature)
    assert logp.dtype == entropy.dtype == torch.float64
    want_logp, want_entropy = reference.logp_entropy(logits, tokens, temperature=temperature)
    _close(logp, want_logp, atol=1e-12, rtol=1e-12)
    _close(entropy, want_entropy, atol=1e-12, rtol=1e-12)
    g_logp, g_entropy = torch.randn(3, 7, generator=GEN), torch.randn(3, 7, generator=GEN)
    (logp * g_logp + entropy * g_entropy).sum().backward()
    want = reference.logp_entropy_grad(logits, tokens, g_logp, g_entropy,
                                       temperature=temperature)
    assert leaf.grad is not None and leaf.grad.dtype == torch.float64
    torch.testing.assert_close(leaf.grad, want, atol=1e-12, rtol=1e-9)
    assert rlk.logp(logits, tokens, dtype=torch.float32).dtype == torch.float32


def test_float64_falls_back_with_the_reason_in_explain(fresh_rlk):
    fresh_rlk.setenv("RLK_TESTBACKEND", "1")
    logits, tokens = _data(4, vocab=10, dtype=torch.float64)
    selection = rlk.explain("logp", logits, tokens)
    assert selection.backend == "native"
    assert selection.rejected["testbackend"] == "does not take float64 (takes float32)"
    assert rlk.explain("logp", logits.float(), tokens).backend == "testbackend"
    _close(rlk.logp(logits, tokens), reference.logp_entropy(logits, tokens)[0], atol=1e-12)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32])
def test_mask_excludes_tokens_as_ignore_index_does(mask_dtype):
    logits, tokens = _data(3, 5)
    keep = torch.rand(3, 5, generator=GEN) > 0.4
    ignored = tokens.masked_fill(~keep, -100)
    leaf_a, leaf_b = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    got_logp, got_entropy = rlk.logp_entropy(leaf_a, tokens, mask=keep.to(mask_dtype))
    want_logp, want_entropy = rlk.logp_entropy(leaf_b, ignored)
    assert torch.equal(got_logp, want_logp) and torch.equal(got_entropy, want_entropy)
    assert (got_logp[~keep] == 0).all() and (got_entropy[~keep] == 0).all()
    (got_logp + got_entropy).sum().backward()
    (want_logp + want_entropy).sum().backward()
    assert leaf_a.grad is not None and torch.equal(leaf_a.grad, leaf_b.grad)
    assert (leaf_a.grad[~keep] == 0).all()


def test_mask_hides_out_of_range_tokens_from_the_range_check(fresh_rlk):
    logits, tokens = _data(4, vocab=6)
    tokens[2] = 99  # a padding id outside the vocabulary
    keep = torch.tensor([True, True, False, True])
    rlk.check_inputs(True)
    result = rlk.logp(logits, tokens, mask=keep)
    assert result[2] == 0 and torch.isfinite(result).all()
    with pytest.raises(ValueError, match=r"tokens\[2\] = 99"):
        rlk.logp(logits, tokens)


@pytest.mark.parametrize("k", [1, 3])
def test_k_tokens_per_row_gather_like_trl(k):
    logits, _ = _data(2, 3)
    index = torch.randint(0, 40, (2, 3, k), generator=GEN)
    index[0, 1, 0] = index[0, 1, -1]  # a token twice in one row
    leaf = logits.clone().requires_grad_(True)
    result = rlk.logp(leaf, index)
    assert result.shape == (2, 3, k)
    trl_leaf = logits.clone().requires_grad_(True)
    want = _trl_selective_log_softmax(trl_leaf.double(), index)
    _close(result, want)
    upstream = torch.randn(2, 3, k, generator=GEN)
    (result * upstream).sum().backward()
    (want * upstream).sum().backward()
    assert leaf.grad is not None and trl_leaf.grad is not None
    torch.testing.assert_close(leaf.grad, trl_leaf.grad, atol=1e-6, rtol=1e-4)


def test_k_tokens_with_mask_rows_out_and_temperature():
    logits, _ = _data(5)
    index = torch.randint(0, 40, (5, 4), generator=GEN)
    keep = torch.rand(5, 4, generator=GEN) > 0.3
    rows = torch.tensor([4, 0, 2])
    out = torch.full((3, 4), float("nan"))
    rlk.logp(logits, index, mask=keep, rows=rows, temperature=0.8, out=out)
    want = reference.logp_entropy(logits, index.masked_fill(~keep, -100), temperature=0.8)[0]
    _close(out, want[rows])
    assert rlk.logp(logits, index[:, :0]).shape == (5, 0)


def test_k_tokens_are_refused_by_logp_entropy_and_declined_by_one_token_backends():
    logits, _ = _data(3)
    index = torch.zeros(3, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"tokens must have shape \(3,\)"):
        rlk.logp_entropy(logits, index)
    from rlk.ops.logp.op import one_token_per_row

    assert one_token_per_row(tokens=index.reshape(3, 2)) is not None
    assert one_token_per_row(tokens=index[:, 0]) is None


@pytest.mark.parametrize("value", [np.float32(0.7), np.float64(0.7), torch.tensor(0.7),
                                   torch.tensor(0.7, dtype=torch.float64)])
def test_numpy_and_0d_tensor_temperatures_equal_a_float(value):
    logits, tokens = _data(2, 3)
    want = rlk.logp(logits, tokens, temperature=float(np.float32(0.7)))
    torch.testing.assert_close(rlk.logp(logits, tokens, temperature=value), want)
    got = rlk.entropy(logits, temperature=value)
    torch.testing.assert_close(got, rlk.entropy(logits, temperature=float(np.float32(0.7))))


def test_numpy_integers_are_ints():
    logits, tokens = _data(3)
    tokens[1] = 7
    result = rlk.logp(logits, tokens, ignore_index=np.int64(7))
    assert result[1] == 0
    with pytest.raises(TypeError, match="ignore_index must be an int, got bool"):
        rlk.logp(logits, tokens, ignore_index=True)


def test_entropy_matches_the_reference_with_every_option():
    logits, _ = _data(2, 6)
    temperature = torch.rand(2, 6, generator=GEN) + 0.3
    keep = torch.rand(2, 6, generator=GEN) > 0.3
    leaf = logits.clone().requires_grad_(True)
    result = rlk.entropy(leaf, temperature=temperature, mask=keep)
    assert result.shape == (2, 6) and result.dtype == torch.float32
    want = entropy_reference.entropy(logits, temperature=temperature, mask=keep)
    _close(result, want)
    upstream = torch.randn(2, 6, generator=GEN)
    (result * upstream).sum().backward()
    tokens = torch.zeros(2, 6, dtype=torch.int64).masked_fill(~keep, -1)
    want_grad = reference.logp_entropy_grad(logits, tokens, torch.zeros(2, 6), upstream,
                                            temperature=temperature, ignore_index=-1)
    assert leaf.grad is not None
    torch.testing.assert_close(leaf.grad.double(), want_grad, atol=1e-6, rtol=1e-4)
    assert (leaf.grad[~keep] == 0).all()
    rows = torch.tensor([11, 3])
    out = torch.empty(2, dtype=torch.bfloat16)
    assert rlk.entropy(logits, temperature=temperature, rows=rows, out=out) is out
    torch.testing.assert_close(out, want.reshape(-1)[rows].to(torch.bfloat16))


def test_entropy_equals_logp_entropy_and_compiles_without_graph_breaks():
    logits, tokens = _data(3, 4)
    _, entropy = rlk.logp_entropy(logits, tokens, temperature=0.9)
    assert torch.equal(rlk.entropy(logits, temperature=0.9), entropy)

    def loss(x):
        return rlk.entropy(x, temperature=0.9).sum()

    eager = logits.clone().requires_grad_(True)
    loss(eager).backward()
    compiled = logits.clone().requires_grad_(True)
    torch.compile(loss, fullgraph=True)(compiled).backward()
    assert compiled.grad is not None and eager.grad is not None
    torch.testing.assert_close(compiled.grad, eager.grad)


def test_entropy_op_is_registered_and_exported():
    assert "entropy" in rlk.__all__
    for name in ("entropy", "entropy_out", "entropy_backward"):
        assert hasattr(torch.ops.rlk, name)
    assert rlk.explain("entropy", torch.randn(2, 5)).backend == "native"
