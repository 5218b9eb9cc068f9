"""logp, logp_entropy and entropy on given logits against float64, fuzzed.

Shapes from empty to odd vocabularies, every float dtype, logit scales from near-uniform to
a dominant target, float, 0-d and per-row temperatures, ignored, out-of-range, NaN and -inf
rows, strided views, `rows=`, `mask=`, `dtype=`, K tokens a row, and calls under autocast
(which must change nothing: the ops compute in float32 whatever autocast says)."""

from __future__ import annotations

import pytest
import torch
from fuzzing import (
    FLOATS,
    autocast,
    fuzz,
    generator,
    grads,
    on_device,
    per_row,
    snapshot,
    tally,
    temperature,
    unchanged,
)
from hypothesis import strategies as st

import rlk
from rlk._runtime.spec import specs
from rlk.ops.entropy import reference as entropy_reference
from rlk.ops.logp import reference
from rlk.testing.compare import assert_matches, assert_within_one_ulp

AUTOCAST = st.sampled_from([None, None, torch.bfloat16, torch.float16])


@st.composite
def logits_calls(draw, dtypes=(*FLOATS, torch.float64)):
    gen = generator(draw)
    dtype = draw(st.sampled_from(dtypes))
    lead = draw(st.sampled_from([(0,), (1,), (3,), (7,), (2, 3), (4, 5)]))
    vocab = draw(st.sampled_from([1, 2, 5, 17, 64, 257, 1031]))
    scale = draw(st.sampled_from([0.01, 1.0, 3.0, 8.0]))
    rows = int(torch.tensor(lead).prod())
    logits = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * scale
    tokens = torch.randint(0, vocab, (rows,), generator=gen)
    if rows and draw(st.booleans()):  # the target dominates the row
        logits[torch.arange(rows), tokens] += draw(st.sampled_from([10.0, 30.0, 60.0]))
    special = draw(st.sampled_from(["none", "ignore", "out-of-range", "nan", "-inf"]))
    if rows and special != "none":
        row = draw(st.integers(0, rows - 1))
        if special == "ignore":
            tokens[row] = -100
        elif special == "out-of-range":
            tokens[row] = draw(st.sampled_from([vocab, vocab + 7, -3]))
        elif special == "nan":
            logits[row, draw(st.integers(0, vocab - 1))] = float("nan")
        else:
            logits[row] = float("-inf")
    if draw(st.booleans()):  # a view with a row stride wider than V and a column stride of 2
        wide = torch.full((rows, 2 * vocab + 3), 1e4, dtype=torch.float64)
        wide[:, : 2 * vocab : 2] = logits
        logits = wide[:, : 2 * vocab : 2]
    logits = logits.to(dtype).reshape(*lead, vocab)
    select = None
    if len(lead) == 1 and rows and draw(st.booleans()):
        count = draw(st.integers(0, rows))
        select = torch.randperm(rows, generator=gen)[:count]
    mask = None
    if draw(st.booleans()):  # mask= as trainers pass it: any dtype, nonzero = a real token
        mask = (torch.rand(lead, generator=gen) > 0.3).to(
            draw(st.sampled_from([torch.bool, torch.int64, torch.float32])))
    return logits, tokens.reshape(lead), temperature(draw, gen, lead), select, mask, special


def _selected(logits, tokens, temp, select, mask):
    """The flattened rows a call computes, with mask= folded into the tokens."""
    flat = logits.reshape(-1, logits.shape[-1])
    flat_tokens = tokens.reshape(-1).clone()
    if mask is not None:
        flat_tokens[mask.reshape(-1) == 0] = -100
    temp = per_row(temp, tuple(tokens.shape))
    if select is not None:
        flat, flat_tokens = flat[select], flat_tokens[select]
        temp = temp[select] if isinstance(temp, torch.Tensor) else temp
    return flat, flat_tokens, temp


def _call(with_entropy, call, dtype, cast):
    """The op on the fuzzed device; its outputs and the leaf its gradient lands on."""
    logits, tokens, temp, select, mask, special = call
    leaf = on_device(logits).detach().clone().requires_grad_(special in ("none", "ignore"))
    args = [on_device(t) for t in (tokens, temp, select, mask)]
    before = snapshot(logits=leaf, tokens=args[0], temperature=args[1], rows=args[2],
                      mask=args[3])
    op = rlk.logp_entropy if with_entropy else rlk.logp
    with autocast(cast):
        result = op(leaf, args[0], temperature=args[1], rows=args[2], mask=args[3], dtype=dtype)
    unchanged(before, logits=leaf, tokens=args[0], temperature=args[1], rows=args[2],
              mask=args[3])
    return (result if with_entropy else (result,)), leaf


@pytest.mark.parametrize("with_entropy", [False, True], ids=["logp", "logp_entropy"])
@fuzz(call=logits_calls(), cast=AUTOCAST)
def test_logp_family_against_float64(with_entropy, call, cast):
    tally("logp_entropy" if with_entropy else "logp")
    logits, tokens, temp, select, mask, _ = call
    spec = specs()["logp_entropy" if with_entropy else "logp"]
    outputs, leaf = _call(with_entropy, call, None, cast)
    expected_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    assert all(out.dtype == expected_dtype for out in outputs), [o.dtype for o in outputs]
    flat, flat_tokens, flat_temp = _selected(logits, tokens, temp, select, mask)
    want = reference.logp_entropy(flat, flat_tokens, temperature=flat_temp)
    for name, got, truth in zip(("logp", "entropy"), outputs, want, strict=False):
        assert_matches(name, got.reshape(-1), truth, spec.tolerances[logits.dtype])
    if not leaf.requires_grad or flat.shape[0] == 0:
        return
    upstream, (grad,) = grads(outputs, [leaf], seed=7)
    full, full_tokens, full_temp = _selected(logits, tokens, temp, None, mask)
    grad_logp = upstream[0].reshape(-1)
    grad_entropy = upstream[1].reshape(-1) if with_entropy else None
    if select is not None:  # the upstream gradient lands on the selected rows only
        grad_logp = torch.zeros(full.shape[0]).index_copy(0, select, grad_logp)
        if grad_entropy is not None:
            grad_entropy = torch.zeros(full.shape[0]).index_copy(0, select, grad_entropy)
    expected = reference.logp_entropy_grad(full, full_tokens, grad_logp, grad_entropy,
                                           temperature=full_temp)
    assert spec.grad_tolerances is not None
    assert_matches("grad_logits", grad.reshape(expected.shape), expected,
                   spec.grad_tolerances[logits.dtype])


@pytest.mark.parametrize(("with_entropy", "dtype"), [
    pytest.param(with_entropy, dtype, id=f"{op}-{str(dtype).removeprefix('torch.')}")
    for with_entropy, op in ((False, "logp"), (True, "logp_entropy")) for dtype in FLOATS])
@fuzz(call=logits_calls(), cast=AUTOCAST)
def test_dtype_output_is_the_float64_truth_rounded_once(with_entropy, dtype, call, cast):
    """`dtype=`: the float64 truth rounded to `dtype`; in a half dtype within one of its ulps
    (the float32 result's own error may straddle a rounding boundary: issue #31 F5)."""
    tally(("logp_entropy" if with_entropy else "logp") + " dtype=")
    logits, tokens, temp, select, mask, _ = call
    spec = specs()["logp_entropy" if with_entropy else "logp"]
    outputs, _ = _call(with_entropy, call, dtype, cast)
    assert all(out.dtype == dtype for out in outputs), [o.dtype for o in outputs]
    flat, flat_tokens, flat_temp = _selected(logits, tokens, temp, select, mask)
    want = reference.logp_entropy(flat, flat_tokens, temperature=flat_temp)
    for name, got, truth in zip(("logp", "entropy"), outputs, want, strict=False):
        if dtype == torch.float32:
            assert_matches(name, got.reshape(-1), truth, spec.tolerances[dtype])
        else:
            assert_within_one_ulp(name, got.reshape(-1), truth, spec.tolerances[dtype].atol)


@fuzz(call=logits_calls())
def test_logp_gathers_k_tokens_a_row(call):
    """tokens [..., K] (TRL's selective_log_softmax): each column as its own logp call."""
    tally("logp K tokens")
    logits, tokens, temp, _, _, _ = call
    if logits.shape[-1] < 2 or logits.numel() == 0:
        return
    gen = torch.Generator().manual_seed(3)
    many = torch.randint(0, logits.shape[-1], (*tokens.shape, 3), generator=gen)
    many[..., 0] = tokens.clamp(min=0, max=logits.shape[-1] - 1)
    got = rlk.logp(on_device(logits), on_device(many), temperature=on_device(temp))
    flat = logits.reshape(-1, logits.shape[-1])
    want = reference.logp_entropy(flat, many.reshape(-1, 3),
                                  temperature=per_row(temp, tuple(tokens.shape)))[0]
    assert got.shape == many.shape
    assert_matches("logp", got.reshape(-1, 3), want, specs()["logp"].tolerances[logits.dtype])


@fuzz(call=logits_calls(), cast=AUTOCAST)
def test_entropy_against_float64(call, cast):
    tally("entropy")
    logits, tokens, temp, select, mask, special = call
    spec = specs()["entropy"]
    leaf = on_device(logits).detach().clone().requires_grad_(special in ("none", "ignore"))
    args = [on_device(t) for t in (temp, select, mask)]
    before = snapshot(logits=leaf, temperature=args[0], rows=args[1], mask=args[2])
    with autocast(cast):
        got = rlk.entropy(leaf, temperature=args[0], rows=args[1], mask=args[2])
    unchanged(before, logits=leaf, temperature=args[0], rows=args[1], mask=args[2])
    flat = logits.reshape(-1, logits.shape[-1])
    flat_temp = per_row(temp, tuple(tokens.shape))
    flat_mask = None if mask is None else mask.reshape(-1)
    if select is not None:
        flat = flat[select]
        flat_temp = flat_temp[select] if isinstance(flat_temp, torch.Tensor) else flat_temp
        flat_mask = None if flat_mask is None else flat_mask[select]
    want = entropy_reference.entropy(flat, temperature=flat_temp, mask=flat_mask)
    assert_matches("entropy", got.reshape(-1), want, spec.tolerances[logits.dtype])
