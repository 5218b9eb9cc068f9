"""The public linear_logp / linear_logp_entropy: chunking, gradients, errors, torch.compile."""

from __future__ import annotations

import pytest
import torch

import rlk
from rlk.ops.linear_logp import reference

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
        ({"weight": torch.zeros(30, 16, dtype=torch.float16),
          "bias": torch.zeros(30, dtype=torch.bfloat16)}, TypeError,
         "hidden, weight and bias mix bfloat16, float16, float32"),
        ({"softcap": 0.0}, ValueError, "softcap must be finite and > 0"),
        ({"logit_scale": float("inf")}, ValueError, "logit_scale must be finite and > 0"),
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
                          (h, w, tokens, b, temperature, 1.0, -100, "", 2.0, torch.float32))


def _head(rows: int, width: int, vocab: int, dtype: torch.dtype, logit_std: float = 2.0):
    """Inputs whose logits have standard deviation about `logit_std`."""
    hidden = torch.randn(rows, width, generator=GEN).to(dtype)
    weight = (torch.randn(vocab, width, generator=GEN) * logit_std / width**0.5).to(dtype)
    return hidden, weight, torch.randint(0, vocab, (rows,), generator=GEN)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_reduced_precision_logits_are_float32(dtype, temperature):
    """Issue #16: bf16 logits chunks put logp 0.013 off float64 here; float32 ones 1e-4."""
    hidden, weight, tokens = _head(64, 256, 4096, dtype)
    logp, entropy = rlk.linear_logp_entropy(hidden, weight, tokens, temperature=temperature)
    want_logp, want_entropy = reference.linear_logp_entropy(hidden, weight, tokens,
                                                            temperature=temperature)
    assert (logp.double() - want_logp).abs().max() < 1e-4
    assert (entropy.double() - want_entropy).abs().max() < 1e-4


def test_bfloat16_hidden_with_float32_weight_under_autocast_runs_in_bfloat16():
    """Trainers under autocast pass a bf16 hidden state and the fp32 lm_head weight."""
    hidden, weight, tokens = _head(12, 32, 50, torch.float32)
    h = hidden.to(torch.bfloat16).requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, entropy = rlk.linear_logp_entropy(h, w, tokens)
    (logp.sum() + entropy.sum()).backward()
    bf16_weight = weight.to(torch.bfloat16)
    want = reference.linear_logp_entropy(h.detach(), bf16_weight, tokens)
    _close(logp, want[0], atol=2e-5)
    _close(entropy, want[1], atol=2e-5)
    assert w.grad.dtype == torch.float32 and h.grad.dtype == torch.bfloat16
    want_grad = reference.linear_logp_entropy_grad(h.detach(), bf16_weight, tokens,
                                                   torch.ones(12), torch.ones(12))
    # the float32 weight's gradient is float32 from float32 products, never rounded to bf16;
    # the bf16 hidden state's is rounded once, from float32
    _close(w.grad, want_grad[1], atol=1e-5, rtol=1e-5)
    _close(h.grad, want_grad[0], atol=1e-5, rtol=2.0**-8)


def test_autocast_keeps_no_reduced_copy_of_the_weight_for_the_backward():
    """Under autocast the bf16 copy of a float32 weight lives inside the op only: autograd
    saves the caller's weight (a [V, H] copy would outlive the forward, 0.25 GiB at a
    Qwen2.5-0.5B head)."""
    hidden, weight, tokens = _head(12, 32, 50, torch.float32)
    w = weight.clone().requires_grad_(True)
    saved: list[torch.Tensor] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        logp = rlk.linear_logp(hidden.requires_grad_(True), w, tokens)
    weight_sized = [t for t in saved if t.shape == weight.shape]
    assert weight_sized and all(t.dtype == torch.float32 for t in weight_sized)
    logp.sum().backward()
    assert w.grad is not None and w.grad.dtype == torch.float32


def test_mixed_dtypes_outside_autocast_run_in_the_reduced_one():
    hidden, weight, tokens = _head(10, 16, 40, torch.float32)
    mixed = rlk.linear_logp(hidden.to(torch.bfloat16), weight, tokens)
    assert torch.equal(mixed, rlk.linear_logp(hidden.to(torch.bfloat16),
                                              weight.to(torch.bfloat16), tokens))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast decides even for fp32 inputs
        assert torch.equal(rlk.linear_logp(hidden, weight, tokens), mixed)


@pytest.mark.parametrize("chunk_mb", [None, "0.01"])
@pytest.mark.parametrize("per_row", [False, True])
def test_softcap_and_logit_scale_match_the_reference_with_gradients(per_row, chunk_mb,
                                                                     monkeypatch):
    if chunk_mb is not None:
        monkeypatch.setenv("RLK_NATIVE_CHUNK_MB", chunk_mb)
    hidden, weight, tokens, bias = _data(9, width=16, vocab=70)
    tokens[4] = -100
    temperature = torch.rand(9, generator=GEN) + 0.5 if per_row else 0.8
    h, w, b = _leaves(hidden, weight, bias)
    options = {"softcap": 1.7, "logit_scale": 0.6}
    logp, entropy = rlk.linear_logp_entropy(h, w, tokens, bias=b, temperature=temperature,
                                            **options)
    want = reference.linear_logp_entropy(hidden, weight, tokens, bias=bias,
                                         temperature=temperature, **options)
    _close(logp, want[0])
    _close(entropy, want[1])
    grad_logp, grad_entropy = torch.randn(9, generator=GEN), torch.randn(9, generator=GEN)
    torch.autograd.backward((logp, entropy), (grad_logp, grad_entropy))
    want_grads = reference.linear_logp_entropy_grad(hidden, weight, tokens, grad_logp,
                                                    grad_entropy, bias=bias,
                                                    temperature=temperature, **options)
    for got, expected in zip((h.grad, w.grad, b.grad), want_grads, strict=True):
        _close(got, expected)


def test_softcap_bounds_the_logits():
    """Capped at 0.5, no token can be likelier than e^1 times another."""
    hidden, weight, tokens = _head(6, 16, 30, torch.float32, logit_std=20.0)
    logp = rlk.linear_logp(hidden, weight, tokens, softcap=0.5)
    assert (logp >= -torch.log(torch.tensor(30.0)) - 1.0).all()


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_nan_hidden_state_in_an_ignored_row_gives_no_gradient(softcap):
    """Issue #19 item 7: 0 * NaN in the weight gradient made all of grad_weight NaN; issue
    #31 S2: the soft cap's slope at a NaN row brought the NaN back."""
    hidden, weight, tokens, bias = _data(6, width=8, vocab=20)
    tokens[2] = -100
    hidden[2] = float("nan")
    h, w, b = _leaves(hidden, weight, bias)
    grad_logp, grad_entropy = torch.randn(6, generator=GEN), torch.randn(6, generator=GEN)
    logp, entropy = rlk.linear_logp_entropy(h, w, tokens, bias=b, softcap=softcap)
    torch.autograd.backward((logp, entropy), (grad_logp, grad_entropy))
    clean = hidden.clone()
    clean[2] = 0.0
    want = reference.linear_logp_entropy_grad(clean, weight, tokens, grad_logp, grad_entropy,
                                              bias=bias, softcap=softcap)
    _close(h.grad, want[0])
    _close(w.grad, want[1])
    _close(b.grad, want[2])


def test_zero_width_hidden_gives_the_bias_softmax():
    """Issue #19 item 12: H = 0 raised a raw reshape error; the logits are the bias."""
    tokens = torch.tensor([0, 3, -100])
    bias = torch.randn(5, generator=GEN)
    h, w, b = _leaves(torch.zeros(3, 0), torch.zeros(5, 0), bias)
    logp = rlk.linear_logp(h, w, tokens, bias=b)
    want = torch.log_softmax(bias.double(), 0)[torch.tensor([0, 3])]
    _close(logp[:2], want)
    assert logp[2] == 0
    logp.sum().backward()
    assert h.grad.shape == (3, 0) and w.grad.shape == (5, 0)
    _close(b.grad, reference.linear_logp_entropy_grad(
        torch.zeros(3, 0), torch.zeros(5, 0), tokens, torch.ones(3), None, bias=bias)[2])


def test_torch_compile_with_softcap_under_autocast():
    hidden, weight, tokens = _head(8, 16, 40, torch.float32)

    def loss(h, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return rlk.linear_logp(h, w, tokens, softcap=5.0, logit_scale=2.0).sum()

    eager_leaves, compiled_leaves = _leaves(hidden, weight), _leaves(hidden, weight)
    eager_value = loss(*eager_leaves)
    eager_value.backward()
    compiled_value = torch.compile(loss, fullgraph=True)(*compiled_leaves)
    compiled_value.backward()
    _close(compiled_value, eager_value)
    for eager_leaf, compiled_leaf in zip(eager_leaves, compiled_leaves, strict=True):
        _close(compiled_leaf.grad, eager_leaf.grad)
