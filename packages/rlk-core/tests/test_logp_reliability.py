"""Defects of issue #19 in the logp family, one regression test each (items 5, 6, 8, 12)."""

from __future__ import annotations

import math

import pytest
import torch

import rlk
from rlk._runtime.temperature import MIN_TEMPERATURE, SHIFT_BELOW, overflow_safe
from rlk.ops.logp import reference

GEN = torch.Generator().manual_seed(19)
# the documented gradient tolerance (docs/ops/logp.md): |got - want| <= atol + rtol |want|
GRAD_TOLERANCE = {torch.float32: (1e-6, 1e-4), torch.bfloat16: (1e-6, 8e-3),
                  torch.float16: (1e-6, 1e-3)}


def _within_tolerance(got, want, dtype):
    atol, rtol = GRAD_TOLERANCE[dtype]
    excess = (got.double() - want).abs() - (atol + rtol * want.abs())
    assert excess.max() <= 0, f"gradient misses its tolerance by {excess.max().item():.3e}"


def _dominant(dtype):
    """The issue's case plus logits ~±2 at temperature 1/8: the token dominates, x/T is large."""
    first = torch.tensor([[70.0, 63.0, 62.0, 60.0]])
    cold = torch.randn(6, 64, generator=GEN) * 2
    cold[:, 5] = cold.amax(dim=1) + 1.0
    return [(first.to(dtype), torch.tensor([0]), 1.0),
            (cold.to(dtype), torch.full((6,), 5), 0.125)]


@pytest.mark.parametrize("dtype", list(GRAD_TOLERANCE))
@pytest.mark.parametrize("with_entropy", [False, True])
def test_dominant_token_gradient_meets_the_tolerance(dtype, with_entropy):
    """#19 item 5: the saved lse was rebuilt in float32 as x_top - log_p_top."""
    for logits, tokens, temperature in _dominant(dtype):
        leaf = logits.clone().requires_grad_(True)
        g_logp = torch.ones(tokens.shape)
        g_entropy = torch.full(tokens.shape, 0.5) if with_entropy else None
        if with_entropy:
            logp, entropy = rlk.logp_entropy(leaf, tokens, temperature=temperature)
            (logp * g_logp + entropy * g_entropy).sum().backward()
        else:
            (rlk.logp(leaf, tokens, temperature=temperature) * g_logp).sum().backward()
        want = reference.logp_entropy_grad(logits, tokens, g_logp, g_entropy,
                                           temperature=temperature)
        assert leaf.grad is not None
        _within_tolerance(leaf.grad, want, dtype)


def test_dominant_entropy_gradient_meets_the_tolerance():
    logits, _, temperature = _dominant(torch.float32)[1]
    leaf = logits.clone().requires_grad_(True)
    rlk.entropy(leaf, temperature=temperature).sum().backward()
    tokens = torch.zeros(logits.shape[0], dtype=torch.int64)
    want = reference.logp_entropy_grad(logits, tokens, torch.zeros(6), torch.ones(6),
                                       temperature=temperature)
    assert leaf.grad is not None
    _within_tolerance(leaf.grad, want, torch.float32)


@pytest.mark.parametrize("bad", [-0.5, 0.0, math.inf, math.nan, 1e-40])
def test_bad_per_row_temperature_poisons_its_row_only(bad, fresh_rlk):
    """#19 item 6: negative gave a finite wrong value, inf gave -log V, 0 gave NaN."""
    logits = torch.randn(4, 9, generator=GEN)
    tokens = torch.randint(0, 9, (4,), generator=GEN)
    temperature = torch.tensor([0.7, bad, 1.3, 0.9])
    leaf = logits.clone().requires_grad_(True)
    logp, entropy = rlk.logp_entropy(leaf, tokens, temperature=temperature)
    assert torch.isnan(logp[1]) and torch.isnan(entropy[1])
    good = [0, 2, 3]
    want_logp, want_entropy = reference.logp_entropy(logits[good], tokens[good],
                                                     temperature=temperature[good])
    torch.testing.assert_close(logp[good].double(), want_logp, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[good].double(), want_entropy, atol=2e-5, rtol=1e-5)
    (logp + entropy).sum().backward()
    assert leaf.grad is not None
    assert torch.isnan(leaf.grad[1]).all() and torch.isfinite(leaf.grad[good]).all()
    rlk.check_inputs(True)
    with pytest.raises(ValueError, match=r"temperature\[1\] = .* is outside \[1\.17"):
        rlk.logp(logits, tokens, temperature=temperature)
    with pytest.raises(ValueError, match=r"temperature = .* is outside"):
        rlk.logp(logits, tokens, temperature=torch.tensor(bad))


def test_ignored_rows_stay_zero_whatever_their_temperature():
    logits = torch.randn(3, 5, generator=GEN)
    tokens = torch.tensor([1, -100, 2])
    result = rlk.logp(logits, tokens, temperature=torch.tensor([1.0, -1.0, 1.0]))
    assert result[1] == 0 and torch.isfinite(result).all()


def test_smallest_temperature_gives_finite_float32_values_not_nan():
    """#19 item 6: 1 / T overflowed, and logits / T too (NaN where float64 is finite)."""
    logits = torch.randn(5, 30, generator=GEN) * 3
    top = logits.argmax(dim=1)
    other = (top + 1) % 30
    leaf = logits.clone().requires_grad_(True)
    at_top = rlk.logp(leaf, top, temperature=MIN_TEMPERATURE)
    assert torch.equal(at_top, torch.zeros(5))
    at_top.sum().backward()
    assert leaf.grad is not None and torch.equal(leaf.grad, torch.zeros_like(logits))
    below = rlk.logp(logits, other, temperature=MIN_TEMPERATURE)
    gap = (logits.gather(1, other.unsqueeze(1)) - logits.gather(1, top.unsqueeze(1))).squeeze(1)
    want = (gap.double() / MIN_TEMPERATURE).clamp(min=-torch.finfo(torch.float32).max)
    saturated = want <= -torch.finfo(torch.float32).max
    assert torch.equal(torch.isinf(below), saturated)
    torch.testing.assert_close(below[~saturated].double(), want[~saturated], rtol=1e-5,
                               atol=0.0)
    entropy = rlk.entropy(logits, temperature=MIN_TEMPERATURE)
    assert torch.equal(entropy, torch.zeros(5))


def test_sample_at_the_smallest_temperature_is_greedy_and_logp_is_finite():
    logits = torch.randn(8, 50, generator=GEN) * 3
    drawn = rlk.sample(logits, temperature=MIN_TEMPERATURE, seed=3)
    assert torch.equal(drawn.tokens, logits.argmax(dim=1))
    assert torch.equal(drawn.logp, torch.zeros(8))
    with pytest.raises(ValueError, match=r"temperature must be finite and >= 0 \(0 = greedy\)"):
        rlk.sample(logits, temperature=1e-40)


def test_overflow_safe_keeps_the_softmax_of_a_sampler_that_divides_by_t_itself():
    """FlashInfer and vLLM divide float32 logits by T: at a tiny T that overflows into NaN.
    overflow_safe hands them logits and a T with the same softmax and no overflow, and
    leaves ordinary temperatures alone (their results stay bit-identical)."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    logits[1, 7] = logits[1, 9] = logits[1].max() + 1
    assert overflow_safe(logits, 0.7) == (logits, 0.7)
    assert overflow_safe(logits, SHIFT_BELOW)[0] is logits
    assert bool(torch.isnan(torch.softmax(logits / MIN_TEMPERATURE, dim=-1)).any())
    for temperature in (MIN_TEMPERATURE, 2.0**-100):
        safe, scale = overflow_safe(logits.to(torch.bfloat16), temperature)
        probs = torch.softmax(safe / scale, dim=-1)
        want = torch.softmax(logits.to(torch.bfloat16).double() / temperature, dim=-1)
        assert scale == 1.0 and safe.dtype == torch.float32
        torch.testing.assert_close(probs.double(), want, atol=0, rtol=0)


def test_repeated_rows_add_their_gradients():
    """#19 item 8: the native backward wrote each repeated row once (a halved gradient)."""
    logits = torch.randn(5, 12, generator=GEN)
    tokens = torch.randint(0, 12, (5,), generator=GEN)
    rows = torch.tensor([3, 1, 3, 3])
    upstream = torch.randn(4, generator=GEN)
    leaf = logits.clone().requires_grad_(True)
    logp, entropy = rlk.logp_entropy(leaf, tokens, rows=rows)
    (logp * upstream + entropy * upstream).sum().backward()
    torch_leaf = logits.clone().requires_grad_(True)
    picked = torch.log_softmax(torch_leaf, dim=1)[rows, tokens[rows]]
    full_entropy = torch.distributions.Categorical(logits=torch_leaf).entropy()[rows]
    (picked * upstream + full_entropy * upstream).sum().backward()
    assert leaf.grad is not None and torch_leaf.grad is not None
    torch.testing.assert_close(leaf.grad, torch_leaf.grad, atol=1e-6, rtol=1e-4)


def test_rows_outside_the_logits_give_nan_and_no_gradient():
    logits = torch.randn(3, 6, generator=GEN)
    leaf = logits.clone().requires_grad_(True)
    result = rlk.logp(leaf, torch.zeros(3, dtype=torch.int64), rows=torch.tensor([2, 7, -9]))
    assert torch.isfinite(result[0]) and torch.isnan(result[1:]).all()
    result[0].backward()
    assert leaf.grad is not None and (leaf.grad[:2] == 0).all()


def test_out_must_not_share_memory_with_an_input_or_the_other_output():
    """#19 item 8: out=(a, a) returned entropy as logp; out could alias logits."""
    logits = torch.randn(4, 6, generator=GEN)
    tokens = torch.randint(0, 6, (4,), generator=GEN)
    shared = torch.empty(4)
    with pytest.raises(ValueError, match=r"out\[0\] shares memory with out\[1\]"):
        rlk.logp_entropy(logits, tokens, out=(shared, shared))
    with pytest.raises(ValueError, match=r"out\[0\] shares memory with out\[1\]"):
        storage = torch.empty(8)
        rlk.logp_entropy(logits, tokens, out=(storage[:4], storage[2:6]))
    with pytest.raises(ValueError, match="out shares memory with logits"):
        rlk.logp(logits, tokens, out=logits[:, 0])
    temperature = torch.ones(4)
    with pytest.raises(ValueError, match="out shares memory with temperature"):
        rlk.logp(logits, tokens, temperature=temperature, out=temperature)
    with pytest.raises(ValueError, match="out shares memory with logits"):
        rlk.entropy(logits, out=logits.view(-1)[4:8])
    storage = torch.empty(8)
    first, second = rlk.logp_entropy(logits, tokens, out=(storage[:4], storage[4:]))
    want_logp, want_entropy = rlk.logp_entropy(logits, tokens)
    assert torch.equal(first, want_logp) and torch.equal(second, want_entropy)


def test_out_of_another_dtype_or_layout_is_filled():
    logits = torch.randn(3, 6, generator=GEN)
    tokens = torch.randint(0, 6, (3,), generator=GEN)
    want = rlk.logp(logits, tokens)
    strided = torch.zeros(3, 2)[:, 1]
    assert rlk.logp(logits, tokens, out=strided) is strided
    assert torch.equal(strided, want)
    half = torch.zeros(3, dtype=torch.float16)
    rlk.logp(logits, tokens, out=half)
    assert torch.equal(half, want.half())


def test_empty_logits_of_any_vocabulary_give_empty_outputs():
    """#19 item 12: [0, 0] logits raised."""
    empty = torch.zeros(0, 0)
    no_tokens = torch.zeros(0, dtype=torch.int64)
    assert rlk.logp(empty, no_tokens).shape == (0,)
    logp, entropy = rlk.logp_entropy(empty.reshape(2, 0, 0), no_tokens.reshape(2, 0))
    assert logp.shape == entropy.shape == (2, 0)
    assert rlk.entropy(empty).shape == (0,)
    leaf = torch.zeros(0, 0, requires_grad=True)
    rlk.logp(leaf, no_tokens).sum().backward()
    assert leaf.grad is not None and leaf.grad.shape == (0, 0)


@pytest.mark.parametrize("raw", ["abc", "inf", "nan", "0"])
def test_bad_chunk_size_names_the_variable(raw, fresh_rlk):
    """#19 item 12: float('abc') and int(inf) raised without naming RLK_NATIVE_CHUNK_MB."""
    fresh_rlk.setenv("RLK_NATIVE_CHUNK_MB", raw)
    with pytest.raises(ValueError, match=f"RLK_NATIVE_CHUNK_MB must be a finite number of "
                                         f"MiB > 0, got '{raw}'"):
        rlk.logp(torch.randn(2, 3), torch.zeros(2, dtype=torch.int64))


def test_checked_mode_skips_meta_tensors_and_compilation(fresh_rlk):
    """#19 item 12: RLK_CHECK_INPUTS=1 read values of meta tensors and broke fullgraph."""
    fresh_rlk.setenv("RLK_CHECK_INPUTS", "1")
    meta = torch.empty(4, 10, device="meta")
    tokens = torch.zeros(4, dtype=torch.int64, device="meta")
    temperature = torch.ones(4, device="meta")
    rows = torch.zeros(2, dtype=torch.int64, device="meta")
    assert rlk.logp(meta, tokens, temperature=temperature, rows=rows).shape == (2,)
    assert rlk.entropy(meta, rows=rows).device.type == "meta"
    logits = torch.randn(4, 10, generator=GEN)
    real_tokens = torch.randint(0, 10, (4,), generator=GEN)

    def loss(x, t):
        return rlk.logp(x, real_tokens, temperature=t).sum() + rlk.entropy(x).sum()

    compiled = torch.compile(loss, fullgraph=True)
    per_row = torch.full((4,), 0.9)
    torch.testing.assert_close(compiled(logits, per_row), loss(logits, per_row))
    real_tokens[0] = 10
    with pytest.raises(ValueError, match=r"tokens\[0\] = 10"):
        loss(logits, per_row)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_results_do_not_depend_on_the_logits_strides(temperature):
    """sample's logp is rlk.logp bit for bit, whatever the layout of the logits it was given."""
    logits = torch.randn(6, 37, generator=GEN) * 3
    tokens = torch.randint(0, 37, (6,), generator=GEN)
    strided = logits.t().contiguous().t()
    assert torch.equal(rlk.logp_entropy(strided, tokens, temperature=temperature)[0],
                       rlk.logp_entropy(logits, tokens, temperature=temperature)[0])
