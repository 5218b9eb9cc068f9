"""Scalar settings: NumPy scalars pass wherever Python's do, and values beyond float32's range
are refused by name (issue #31: np.int64 seeds and np.bool_ flags were refused; kl_coef=1e300
became inf in the kernels, silently)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlk

GEN = torch.Generator().manual_seed(31)
B, T, V = 3, 5, 11


def _policy_inputs():
    logp = -torch.rand(B, T, generator=GEN) * 3
    return (logp, logp + torch.randn(B, T, generator=GEN) * 0.1, torch.randn(B, generator=GEN),
            torch.rand(B, T, generator=GEN) > 0.2)


@pytest.mark.parametrize("numpy_type", [np.float64, np.float32, np.int64])
def test_policy_loss_takes_numpy_numbers_and_bools(numpy_type):
    logp, old, adv, mask = _policy_inputs()
    ref = logp + 0.1
    plain = {"kl_coef": 1, "clip_high": 1, "scale": 2, "count_empty_rows": True,
             "kl_bias_correction": False, "agg": "seq-mean-token-mean"}
    as_numpy = {name: (np.bool_(value) if isinstance(value, bool) else
                       numpy_type(value) if isinstance(value, int) else value)
                for name, value in plain.items()}
    want, _ = rlk.policy_loss(logp, old, adv, mask, ref_logp=ref, **plain)
    got, _ = rlk.policy_loss(logp, old, adv, mask, ref_logp=ref, **as_numpy)
    assert torch.equal(got, want)


def test_options_objects_take_numpy_bools():
    assert rlk.PolicyLossOptions(count_empty_rows=np.bool_(True),
                                 agg="seq-mean-token-mean").count_empty_rows is True
    with pytest.raises(TypeError, match="count_empty_rows must be True or False"):
        rlk.PolicyLossOptions(count_empty_rows=np.int64(1), agg="seq-mean-token-mean")


def test_sample_and_group_advantages_take_numpy_scalars():
    logits = torch.randn(4, V, generator=GEN)
    want = rlk.sample(logits, seed=1, top_k=3, top_p=0.9, temperature=0.7)
    got = rlk.sample(logits, seed=np.int64(1), top_k=np.int32(3), top_p=np.float64(0.9),
                     temperature=np.float32(0.7))
    assert torch.equal(got.tokens, want.tokens)
    rewards = torch.randn(8, generator=GEN)
    assert torch.equal(rlk.group_advantages(rewards, group_size=np.int64(4), eps=np.float32(0.5)),
                       rlk.group_advantages(rewards, group_size=4, eps=float(np.float32(0.5))))


@pytest.mark.parametrize(("call", "name"), [
    (lambda x: rlk.policy_loss(*_policy_inputs(), kl_coef=x), "kl_coef"),
    (lambda x: rlk.policy_loss(*_policy_inputs(), clip_high=x), "clip_high"),
    (lambda x: rlk.policy_loss(*_policy_inputs(), divisor=x), "divisor"),
    (lambda x: rlk.group_advantages(torch.randn(4), group_size=2, eps=x), "eps"),
    (lambda x: rlk.logp(torch.randn(2, V), torch.zeros(2, dtype=torch.long), temperature=x),
     "temperature"),
    (lambda x: rlk.sample(torch.randn(2, V), top_p=-x), "top_p"),
])
@pytest.mark.parametrize("value", [1e300, np.float64(3.5e38)])
def test_settings_beyond_float32_are_refused_by_name(call, name, value):
    with pytest.raises(ValueError, match=f"{name} must be within float32's range"):
        call(value)


def test_float32_max_itself_is_accepted():
    logp, old, adv, mask = _policy_inputs()
    biggest = float(torch.finfo(torch.float32).max)
    loss, _ = rlk.policy_loss(logp, old, adv, mask, divisor=biggest, agg="token-sum")
    assert torch.isfinite(loss)
