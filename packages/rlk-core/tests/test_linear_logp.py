"""The public linear_logp / linear_logp_entropy: chunking, gradients, errors, torch.compile."""

from __future__ import annotations

import pytest
import torch

import rlk
from rlk import reference

GEN = torch.Generator().manual_seed(11)


def _data(*lead: int, width: int = 16, vocab: int = 300, dtype=torch.float32, bias=True):
    hidden = torch.randn(*lead, width, generator=GEN).to(dtype)
    weight = (torch.randn(vocab, width, generator=GEN) * 0.5).to(dtype)
    tokens = torch.randint(0, vocab, lead, generator=GEN)
    b = torch.randn(vocab, generator=GEN).to(dtype) if bias else None
    return hidden, weight, tokens, b


def _close(actual, expected, atol=2e-5, rtol=2e-5):
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol,
                               equal_nan=True)


def _leaves(*tensors):
    return [None if t is None else t.clone().requires_grad_(True) for t in tensors]


@pytest.mark.parametrize("chunk_mb", [None, "0.01"])
def test_forward_and_backward_match_reference_whatever_the_chunking(chunk_mb, monkeypatch):
    """A 10 KB budget forces one row per chunk: chunk seams must not show."""
    if chunk_mb is not None:
        monkeypatch.setenv("RLK_NATIVE_CHUNK_MB", chunk_mb)
    hidden, weight, tokens, bias = _data(3, 7)
    tokens[0, 3] = -100
    temperature = torch.rand(3, 7, generator=GEN) + 0.5
    h, w, b = _leaves(hidden, weight, bias)
    logp, entropy = rlk.linear_logp_entropy(h, w, tokens, bias=b, temperature=temperature)
    assert logp.shape == entropy.shape == (3, 7) and logp.dtype == torch.float32
    want_logp, want_entropy = reference.linear_logp_entropy(hidden, weight, tokens, bias=bias,
                                                            temperature=temperature)
    _close(logp, want_logp)
    _close(entropy, want_entropy)
    assert logp[0, 3] == 0 and entropy[0, 3] == 0
    grad_logp = torch.randn(3, 7, generator=GEN)
    grad_entropy = torch.randn(3, 7, generator=GEN)
    torch.autograd.backward((logp, entropy), (grad_logp, grad_entropy))
    want = reference.linear_logp_entropy_grad(hidden.reshape(-1, 16), weight, tokens.reshape(-1),
                                              grad_logp.reshape(-1), grad_entropy.reshape(-1),
                                              bias=bias, temperature=temperature.reshape(-1))
    _close(h.grad.reshape(-1, 16), want[0])
    _close(w.grad, want[1])
    _close(b.grad, want[2])
    assert h.grad[0, 3].abs().sum() == 0  # the ignored row contributes nothing


def test_linear_logp_equals_logp_of_the_logits_bitwise_in_one_chunk():
    """One chunk, same logits, same logp kernel: the fused path is the plain path."""
    hidden, weight, tokens, bias = _data(40)
    logits = torch.addmm(bias, hidden, weight.t())
    assert torch.equal(rlk.linear_logp(hidden, weight, tokens, bias=bias, temperature=0.8),
                       rlk.logp(logits, tokens, temperature=0.8))


def test_only_requested_gradients_are_computed():
    hidden, weight, tokens, _ = _data(9, bias=False)
    w = weight.clone().requires_grad_(True)
    rlk.linear_logp(hidden, w, tokens).sum().backward()
    want = reference.linear_logp_entropy_grad(hidden, weight, tokens, torch.ones(9), None)
    _close(w.grad, want[1])
    h = hidden.clone().requires_grad_(True)
    rlk.linear_logp(h, weight, tokens).sum().backward()
    _close(h.grad, want[0])


def test_reduced_precision_weight_gradient_accumulates_in_float32(monkeypatch):
    """Many chunks of bf16 contributions: summing them in bf16 would drift; float32 does not."""
    monkeypatch.setenv("RLK_NATIVE_CHUNK_MB", "0.01")
    hidden, weight, tokens, _ = _data(256, width=8, vocab=64, dtype=torch.bfloat16, bias=False)
    w = weight.clone().requires_grad_(True)
    grad_logp = torch.rand(256, generator=GEN) + 0.5
    (rlk.linear_logp(hidden, w, tokens) * grad_logp).sum().backward()
    assert w.grad.dtype == torch.bfloat16
    want = reference.linear_logp_entropy_grad(hidden, weight, tokens, grad_logp, None)[1]
    # one bf16 rounding of the result (2^-8 relative) plus bf16 logits
    _close(w.grad, want, atol=0.05, rtol=0.02)


def test_empty_input():
    hidden, weight, tokens, bias = _data(0)
    h, w, b = _leaves(hidden, weight, bias)
    logp, entropy = rlk.linear_logp_entropy(h, w, tokens, bias=b)
    assert logp.shape == entropy.shape == (0,)
    (logp.sum() + entropy.sum()).backward()
    assert h.grad.shape == (0, 16) and torch.equal(w.grad, torch.zeros_like(weight))
    assert torch.equal(b.grad, torch.zeros_like(bias))


def test_out_of_range_token_gives_nan_and_check_inputs_raises(fresh_rlk):
    hidden, weight, tokens, _ = _data(4, vocab=30, bias=False)
    tokens[2] = 30
    result = rlk.linear_logp(hidden, weight, tokens)
    assert torch.isnan(result[2]) and not torch.isnan(result[[0, 1, 3]]).any()
    rlk.check_inputs(True)
    with pytest.raises(ValueError, match=r"tokens\[2\] = 30 is outside \[0, 30\)"):
        rlk.linear_logp(hidden, weight, tokens)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"hidden": torch.zeros(4, 8, dtype=torch.int32)}, TypeError, "hidden must have dtype"),
        ({"weight": torch.zeros(30, 9)}, ValueError, r"weight must be \[V, 16\]"),
        ({"weight": torch.zeros(30, 16, dtype=torch.float16)}, TypeError,
         "weight must have the dtype of hidden"),
        ({"tokens": torch.zeros(5, dtype=torch.int64)}, ValueError,
         r"tokens must have shape \(4,\)"),
        ({"tokens": torch.zeros(4)}, TypeError, "tokens must have dtype int32, int64"),
        ({"bias": torch.zeros(29)}, ValueError, r"bias must have shape \(30,\)"),
        ({"temperature": 0.0}, ValueError, "temperature must be finite and > 0"),
        ({"temperature": torch.ones(3)}, ValueError, r"temperature must have shape \(4,\)"),
        ({"group": "world"}, TypeError, r"group must be a torch\.distributed\.ProcessGroup"),
        ({"ignore_index": 1.5}, TypeError, "ignore_index must be an int"),
    ],
)
def test_bad_inputs_raise_before_any_kernel(change, error, message):
    hidden, weight, tokens, _ = _data(4, vocab=30, bias=False)
    kwargs = {"hidden": hidden, "weight": weight, "tokens": tokens, "bias": None}
    kwargs.update(change)
    with pytest.raises(error, match=message):
        rlk.linear_logp(kwargs.pop("hidden"), kwargs.pop("weight"), kwargs.pop("tokens"),
                        **kwargs)


def test_torch_compile_fullgraph_forward_and_backward():
    hidden, weight, tokens, bias = _data(6, vocab=50)

    def loss(h, w, b):
        logp, entropy = rlk.linear_logp_entropy(h, w, tokens, bias=b, temperature=0.9)
        return (logp * 2.0 - 0.1 * entropy).sum()

    compiled = torch.compile(loss, fullgraph=True)
    eager_leaves, compiled_leaves = _leaves(hidden, weight, bias), _leaves(hidden, weight, bias)
    eager_value = loss(*eager_leaves)
    eager_value.backward()
    compiled_value = compiled(*compiled_leaves)
    compiled_value.backward()
    _close(compiled_value, eager_value, atol=1e-5, rtol=1e-6)
    for eager_leaf, compiled_leaf in zip(eager_leaves, compiled_leaves, strict=True):
        _close(compiled_leaf.grad, eager_leaf.grad, atol=1e-6, rtol=1e-6)


def test_opcheck_with_per_row_temperature_and_grad_of_all_three():
    hidden, weight, tokens, bias = _data(5, vocab=20)
    temperature = torch.rand(5, generator=GEN) + 0.5
    h, w, b = _leaves(hidden, weight, bias)
    torch.library.opcheck(torch.ops.rlk.linear_logp_entropy.default,
                          (h, w, tokens, b, temperature, 1.0, -100, ""))
