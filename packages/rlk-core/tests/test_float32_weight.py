"""The linear ops' float32_weight property: a kernel declaring it gets a float32 weight and
bias beside a reduced hidden as the caller gave them (so it can return their gradients in
float32, unrounded); any other kernel gets them cast to hidden's dtype. Both give the caller
the same results, eager and compiled, under autocast and with mixed dtypes outside it."""

from __future__ import annotations

import contextlib

import pytest
import torch

import rlk

GEN = torch.Generator().manual_seed(5)
BF16, F32 = torch.bfloat16, torch.float32


@pytest.fixture
def recorded(use_plugins):
    import fake_plugin_weight_dtypes as plugin

    use_plugins(weight_dtypes="fake_plugin_weight_dtypes")
    plugin.received.clear()
    return plugin.received


def _inputs(rows=6, width=8, vocab=30):
    hidden = torch.randn(rows, width, generator=GEN)
    weight = torch.randn(vocab, width, generator=GEN) * 0.5
    bias = torch.randn(vocab, generator=GEN)
    return hidden, weight, bias, torch.randint(0, vocab, (rows,), generator=GEN)


def _leaves(*tensors):
    return [t.clone().requires_grad_(True) for t in tensors]


# how the caller asks for a bfloat16 GEMM with a float32 weight: autocast (hidden float32 or
# bfloat16), or a bfloat16 hidden state outside it
CALLERS = {
    "autocast": (F32, lambda: torch.autocast("cpu", dtype=BF16)),
    "autocast-bf16-hidden": (BF16, lambda: torch.autocast("cpu", dtype=BF16)),
    "mixed": (BF16, contextlib.nullcontext),
}


def _linear_logp_entropy(backend, caller, inputs, compiled=False):
    hidden_dtype, context = CALLERS[caller]
    hidden, weight, bias, tokens = inputs
    h, w, b = _leaves(hidden.to(hidden_dtype), weight, bias)

    def call(h, w, b):
        with context():
            return rlk.linear_logp_entropy(h, w, tokens, bias=b)

    with rlk.use_backends(backend, strict=True):
        logp, entropy = (torch.compile(call, fullgraph=True) if compiled else call)(h, w, b)
        (logp.sum() + 0.5 * entropy.sum()).backward()
    return (logp, entropy, h.grad, w.grad, b.grad)


@pytest.mark.parametrize("caller", list(CALLERS))
def test_only_a_kernel_declaring_it_gets_the_float32_weight(recorded, caller):
    inputs = _inputs()
    results = {backend: _linear_logp_entropy(backend, caller, inputs)
               for backend in ("keeps", "casts")}
    assert recorded == [("keeps", "forward", BF16, F32, F32),
                        ("keeps", "backward", BF16, F32, F32),
                        ("casts", "forward", BF16, BF16, BF16),
                        ("casts", "backward", BF16, BF16, BF16)]
    for kept, cast in zip(results["keeps"], results["casts"], strict=True):
        assert kept.dtype == cast.dtype
        torch.testing.assert_close(kept, cast, rtol=0, atol=0)
    assert results["keeps"][3].dtype == F32 and results["keeps"][4].dtype == F32


def test_compiled_calls_bind_the_same_way(recorded):
    inputs = _inputs()
    eager = _linear_logp_entropy("keeps", "autocast", inputs)
    compiled = _linear_logp_entropy("keeps", "autocast", inputs, compiled=True)
    assert {(phase, weight) for _, phase, _, weight, _ in recorded} == {("forward", F32),
                                                                        ("backward", F32)}
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_reduced_weight_reaches_every_kernel_in_its_own_dtype(recorded):
    hidden, weight, bias, tokens = _inputs()
    for backend in ("keeps", "casts"):
        with rlk.use_backends(backend, strict=True), torch.autocast("cpu", dtype=BF16):
            rlk.linear_logp(hidden, weight.to(BF16), tokens, bias=bias.to(BF16))
    assert [weight for _, _, _, weight, _ in recorded] == [BF16, BF16]


def test_a_bias_of_another_dtype_is_cast_with_the_weight(recorded):
    hidden, weight, bias, tokens = _inputs()
    with rlk.use_backends("keeps", strict=True):
        rlk.linear_logp(hidden.to(BF16), weight, tokens, bias=bias.to(BF16))
    assert recorded == [("keeps", "forward", BF16, BF16, BF16)]


def test_linear_policy_loss_binds_the_same_way(recorded):
    hidden, weight, _, tokens = _inputs(rows=6)
    shape = (2, 3)
    old_logp = -torch.rand(shape, generator=GEN)
    advantages = torch.randn(2, generator=GEN)
    mask = torch.ones(shape, dtype=torch.bool)
    grads = {}
    for backend in ("keeps", "casts"):
        h, w = _leaves(hidden.view(2, 3, -1).to(BF16), weight)
        with rlk.use_backends(backend, strict=True):
            loss, _ = rlk.linear_policy_loss(h, w, tokens.view(shape), old_logp, advantages, mask)
        loss.backward()
        grads[backend] = (loss, h.grad, w.grad)
    assert [(backend, weight) for backend, _, _, weight, _ in recorded] == [("keeps", F32),
                                                                           ("casts", BF16)]
    for kept, cast in zip(grads["keeps"], grads["casts"], strict=True):
        torch.testing.assert_close(kept, cast, rtol=0, atol=0)
    assert grads["keeps"][2].dtype == F32
