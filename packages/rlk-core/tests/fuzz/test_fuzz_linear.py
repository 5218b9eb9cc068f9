"""linear_logp, linear_logp_entropy and linear_policy_loss against float64, fuzzed.

The head in every dtype, mixed with a float32 weight and under autocast (the GEMM dtype
the docs name: the autocast one, else the reduced one); soft cap and logit scale in every
path of linear_policy_loss: one pass, the two-pass path of sequence-level losses (forced
by a row budget of one or a few rows) and the no-grad forward; NaN hidden states at masked
or ignored rows, which must reach neither the loss nor any gradient."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from fuzzing import (
    DEVICE,
    autocast,
    environment,
    fuzz,
    grads,
    heads,
    in_range,
    loss_inputs,
    loss_options,
    on_device,
    per_row,
    snapshot,
    tally,
    unchanged,
)
from hypothesis import assume
from hypothesis import strategies as st

import rlk
from rlk._runtime.spec import Tolerance, specs
from rlk.ops.linear_logp import reference as linear_logp_reference
from rlk.ops.linear_policy_loss import reference as linear_policy_loss_reference
from rlk.ops.policy_loss import native as policy_loss_native
from rlk.ops.policy_loss.options import METRICS
from rlk.testing.compare import assert_matches

# a budget of a few bytes: one row a chunk; 3 KiB: a few rows of a small vocabulary
BUDGET_MB = st.sampled_from([None, "0.000001", "0.003"])


@st.composite
def mixed_heads(draw, **kwargs: Any):
    """A head whose weight and bias may stay float32 beside a reduced hidden state (a
    trainer's lm_head), called under autocast or not; with the GEMM dtype that implies."""
    hidden, weight, bias, tokens, temp, head = draw(heads(**kwargs))
    if hidden.dtype != torch.float32 and draw(st.booleans()):
        weight, bias = weight.float(), None if bias is None else bias.float()
    cast = draw(st.sampled_from([None, None, torch.bfloat16, torch.float16]))
    gemm = cast or (hidden.dtype if hidden.dtype != torch.float32 else weight.dtype)
    return hidden, weight, bias, tokens, temp, head, cast, gemm


def _rounded(gemm: torch.dtype, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """The head's tensors as the GEMM reads them."""
    return [None if t is None else t.to(gemm) for t in tensors]


@pytest.mark.parametrize("with_entropy", [False, True],
                         ids=["linear_logp", "linear_logp_entropy"])
@fuzz(call=mixed_heads(), budget=BUDGET_MB)
def test_linear_family_against_float64(with_entropy, call, budget):
    tally("linear_logp_entropy" if with_entropy else "linear_logp")
    hidden, weight, bias, tokens, temp, head, cast, gemm = call
    spec = specs()["linear_logp_entropy" if with_entropy else "linear_logp"]
    leaves = [None if t is None else on_device(t).detach().clone().requires_grad_(True)
              for t in (hidden, weight, bias)]
    device_tokens, device_temp = on_device(tokens), on_device(temp)
    before = snapshot(hidden=leaves[0], weight=leaves[1], bias=leaves[2], tokens=device_tokens,
                      temperature=device_temp)
    op = rlk.linear_logp_entropy if with_entropy else rlk.linear_logp
    with autocast(cast), environment(RLK_NATIVE_CHUNK_MB=budget, RLK_CUDA_CHUNK_MB=budget):
        result = op(leaves[0], leaves[1], device_tokens, bias=leaves[2],
                    temperature=device_temp, **head)
        outputs = result if with_entropy else (result,)
        unchanged(before, hidden=leaves[0], weight=leaves[1], bias=leaves[2],
                  tokens=device_tokens, temperature=device_temp)
        flat_temp = per_row(temp, tuple(tokens.shape))
        r_hidden, r_weight, r_bias = _rounded(gemm, hidden, weight, bias)
        want = linear_logp_reference.linear_logp_entropy(r_hidden, r_weight, tokens, bias=r_bias,
                                                         temperature=flat_temp, **head)
        for name, got, truth in zip(("logp", "entropy"), outputs, want, strict=False):
            assert got.dtype == torch.float32, (name, got.dtype)
            assert_matches(name, got, truth, spec.tolerances[gemm])
        if hidden.shape[0] == 0:
            return
        wanted = [leaf for leaf in leaves if leaf is not None]
        upstream, got_grads = grads(outputs, wanted, seed=5)
    expected = linear_logp_reference.linear_logp_entropy_grad(
        r_hidden, r_weight, tokens, upstream[0], upstream[1] if with_entropy else None,
        bias=r_bias, temperature=flat_temp, **head)
    assert spec.grad_tolerances is not None
    grad_logits, logp = _family_logits_gradient(r_hidden, r_weight, r_bias, tokens, flat_temp,
                                                head, upstream)
    allowances = _rounded_operand_allowance(grad_logits, logp, r_hidden, r_weight, r_bias,
                                            flat_temp, head, {})
    present = [a for a, t in zip(allowances, (hidden, weight, bias), strict=True)
               if t is not None]
    for name, leaf, actual, truth, allowance in zip(
            ("grad_hidden", "grad_weight", "grad_bias"), wanted, got_grads, expected, present,
            strict=False):
        assert actual.dtype == leaf.dtype, (name, actual.dtype, leaf.dtype)
        assert_matches(name, actual, truth, spec.grad_tolerances[gemm], allowance=allowance)


# ---------------------------------------------------------------------------
# linear_policy_loss

PATHS = ("one-pass", "two-pass", "no-grad")


def _k3_kl(options: Any) -> bool:
    """Whether the loss has k3's KL, whose gradient 1 - exp(ref_logp - logp) reaches 1e30
    where the head gives a token a log-probability of -100 (low temperatures)."""
    return options.kl_estimator == "k3" and options.kl_coef > 0


@st.composite
def linear_loss_calls(draw, path: str, softcap: bool, k3: bool = False):
    """A linear_policy_loss call for `path`, with a soft cap or without one, with k3's KL or
    without it; its hidden state and the row budget."""
    sequence = path == "two-pass"
    batch, length = draw(st.sampled_from([(1, 4), (2, 3), (3, 5)] if sequence else
                                         [(0, 3), (1, 1), (2, 3), (3, 4)]))
    softcaps = (30.0, 2.0) if softcap else (None,)
    head = draw(heads(rows=(batch * length,), softcaps=softcaps))
    options = draw(loss_options(objectives=("ppo", "cispo", "sapo", "vespo")).filter(
        lambda o: (o.needs_sequence_pass or not sequence) and _k3_kl(o) == k3))
    # log ratios up to ~5: beyond, k3's gradients reach 1e8 and the float32 weight gradient
    # sums them with cancellation (policy_loss's module fuzzes the extremes of the loss math)
    _, tensors = draw(loss_inputs(options, batch, length, spreads=(0.01, 0.3, 1.5)))
    budget = "0.000001" if sequence else draw(BUDGET_MB)
    if path == "one-pass" and options.needs_sequence_pass:
        budget = None  # whole sequences fit a chunk of the default budget
    return head, tensors, options, budget


def _nan_at_a_masked_row(hidden, tokens, mask) -> torch.Tensor:
    """hidden with NaN at one row the loss ignores (masked or an ignored token), if any."""
    ignored = (mask.reshape(-1) == 0) | (tokens == -100)
    if not bool(ignored.any()):
        return hidden
    dirty = hidden.clone()
    dirty[int(torch.nonzero(ignored)[0])] = float("nan")
    return dirty


def _reference(hidden, weight, bias, tokens, temp, head, entropy_coef, options, tensors,
               with_grad):
    """Float64 loss, metrics, logp and, with `with_grad`, the gradients of the head's tensors
    (None for an absent bias)."""
    truths = [None if t is None else t.detach().double().requires_grad_(with_grad)
              for t in (hidden, weight, bias)]
    loss, metrics, logp = linear_policy_loss_reference.linear_policy_loss(
        truths[0], truths[1], tokens, bias=truths[2], temperature=temp,
        entropy_coef=entropy_coef, options=options, **head, **tensors)
    present = [t for t in truths if t is not None]
    expected = [torch.zeros_like(t) for t in present]
    if with_grad and loss.requires_grad:
        expected = list(torch.autograd.grad(loss, present, allow_unused=True,
                                            materialize_grads=True))
    return loss, metrics, logp, expected


def _exponent_error(hidden, weight, bias, temp, head, logp, tensors) -> torch.Tensor:
    """Per row, the relative error float32 puts on an exponential of the row's logits or
    log-probabilities: 2^-22 (a few roundings) of their magnitude, that of the logits being
    their float32 rounding error, 2^-24 of |hidden| |weight| per entry, over the temperature."""
    rounding = (hidden.double().abs() @ weight.double().abs().T).amax(-1)
    if bias is not None:
        rounding = rounding + bias.double().abs().max()
    magnitude = rounding * head["logit_scale"] / torch.as_tensor(temp, dtype=torch.float64)
    magnitude = magnitude + logp.detach().reshape(-1).abs()
    if "ref_logp" in tensors:
        magnitude = magnitude + tensors["ref_logp"].reshape(-1).double().abs()
    return magnitude.nan_to_num(posinf=0.0) * 2.0**-22


def _logits(hidden, weight, bias) -> torch.Tensor:
    """The head's raw logits in float64 (what the GEMMs' gradient operand G is taken of)."""
    logits = hidden.double() @ weight.double().T
    return logits if bias is None else logits + bias.double()


def _family_logits_gradient(hidden, weight, bias, tokens, temp, head,
                            upstream) -> tuple[torch.Tensor, torch.Tensor]:
    """linear_logp(_entropy)'s float64 gradient with respect to the logits under the
    upstream gradients (of logp, and of the entropy where there are two), and the logp: the
    op over the logits with an identity head."""
    logits = _logits(hidden, weight, bias)
    eye = torch.eye(weight.shape[0], dtype=torch.float64)
    logp, _ = linear_logp_reference.linear_logp_entropy(logits, eye, tokens, temperature=temp,
                                                        **head)
    grad_logits = linear_logp_reference.linear_logp_entropy_grad(
        logits, eye, tokens, upstream[0], upstream[1] if len(upstream) > 1 else None,
        temperature=temp, **head)[0]
    return grad_logits, logp


def _logits_gradient(hidden, weight, bias, tokens, temp, head, entropy_coef, options,
                     tensors) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The float64 loss's gradient with respect to the logits (None without a graph), and
    the float64 logp."""
    rows = _logits(hidden, weight, bias).detach().requires_grad_(True)
    loss, _, logp = linear_policy_loss_reference.linear_policy_loss(
        rows, torch.eye(weight.shape[0], dtype=torch.float64), tokens, temperature=temp,
        entropy_coef=entropy_coef, options=options, **head, **tensors)
    if not loss.requires_grad:
        return None, logp
    (grad_logits,) = torch.autograd.grad(loss, rows, allow_unused=True, materialize_grads=True)
    return grad_logits, logp


def _rounded_operand_allowance(grad_logits, logp, hidden, weight, bias, temp, head,
                               tensors) -> list[Any]:
    """What the GEMMs of the backward may add to grad_hidden, grad_weight and grad_bias from
    the error of the logits gradient G that they take, entry for entry:
    - G rounded to the inputs' dtype (rlk-cuda writes it in the GEMM input dtype): up to its
      unit roundoff u, and float32 accumulation over the rows;
    - the float32 exponents behind G: a row's probabilities, and k3's exp(ref_logp - logp),
      are exponentials of values that carry float32's rounding of the logits (2^-24 of
      |hidden| |weight| per entry, over the temperature) and of the log-probabilities: at low
      temperatures that is relative 1e-4 on G, past any fixed tolerance.
    grad_weight[v] may then move by sum_r unit_r |G[r, v]| |hidden[r]|, grad_hidden[r] by
    unit_r sum_v |G[r, v]| |weight[v]| (each twice, allowed). Where the sums cancel, that
    exceeds an elementwise tolerance: bf16's rounding of G alone gives -0.0308 for -0.0275 in
    a GPU run's weight gradient (seed 3489571432); k3's exponent, -622.81 for -622.68."""
    if grad_logits is None:
        return [None, None, None]
    size = grad_logits.abs().nan_to_num(posinf=0.0)
    unit = (torch.finfo(hidden.dtype).eps + grad_logits.shape[0] * 2.0**-24
            + _exponent_error(hidden, weight, bias, temp, head, logp, tensors)).unsqueeze(-1)
    size = unit * size
    return [size @ weight.double().abs(), size.T @ hidden.double().abs(), size.sum(0)]


def _vespo_allowance(logp, tokens, exponent, options, tensors) -> torch.Tensor | None:
    """VESPO's weight phi = exp(lam + k s - lam e^s) of a sequence's log weight s moves by
    |k - lam e^s| times s's error, relatively, and s sums its tokens' float32 logp, each off
    by `exponent` (the rounding of the logits behind it): with lam = 8 at s ~ 2 that is 60x
    the tokens' error (loss 4.2e-5 off on -0.192, seed 1628038693 on the H100). The loss may
    move by that times each row's |phi * advantage * logp| in the aggregation."""
    if options.objective != "vespo" or not tensors["old_logp"].numel():
        return None
    batch, length = tensors["old_logp"].shape
    real = ((tensors["mask"] != 0) & (tokens.reshape(batch, length) != -100)).double()
    lp = logp.detach().reshape(batch, length).double().nan_to_num() * real
    old = tensors["old_logp"].double() * real
    weight, _ = policy_loss_native.importance_weight(
        old, *[None if tensors.get(name) is None else tensors[name].double() * real
               for name in ("rollout_logp", "importance_weights")], options)
    s = policy_loss_native.sequence_statistics(lp, old, real, weight, options)
    advantages = tensors["advantages"].double().reshape(batch, -1)
    nonneg = advantages >= 0
    k = torch.where(nonneg, options.vespo_k_pos, options.vespo_k_neg)
    lam = torch.where(nonneg, options.vespo_lambda_pos, options.vespo_lambda_neg)
    phi = torch.exp(lam + k * s - lam * s.exp()).nan_to_num(posinf=0.0)
    error_of_s = (exponent.reshape(batch, length) * real).sum(1, keepdim=True)
    terms = policy_loss_native.aggregation_weights(tensors["mask"] * real, options).double() \
        * (phi * advantages * lp).abs()
    return ((k - lam * s.exp()).abs() * error_of_s * terms).sum()


def _float16_overflow(grad_logits, dtype: torch.dtype) -> list[torch.Tensor] | None:
    """Where each gradient may be inf or NaN by the contract (docs/ops/linear_policy_loss.md):
    on a CUDA device the GEMMs read the logits gradient G rounded to float16, so an entry of
    G past 65504 reaches its row of grad_hidden and its vocabulary row of grad_weight and
    grad_bias as inf or NaN, even where the float64 gradient is in range (grad_weight inf
    for 40656 from |G| = 1.4e5, seed 1490486190 on the H100). None where nothing overflows."""
    if grad_logits is None or dtype != torch.float16 or DEVICE.type != "cuda":
        return None
    past = grad_logits.abs() > torch.finfo(torch.float16).max
    if not bool(past.any()):
        return None
    rows, vocabulary = past.any(1), past.any(0)
    return [rows, vocabulary, vocabulary]


def _case(path: str, softcap: bool, garbage: bool) -> Any:
    """One parametrised case without k3's KL, named after its path and inputs."""
    name = f"{path}-{'softcap' if softcap else 'plain'}-{'nan-at-ignored' if garbage else 'clean'}"
    return pytest.param(path, softcap, garbage, False, id=name)


# k3's KL at low temperatures: log ratios reach ~90, past float32's exp range (its weight
# gradient's cancellation, 1.97e-2 on -0.284 at seed 3490338199, is within the allowance)
K3 = pytest.param("one-pass", False, False, True, id="one-pass-plain-clean-k3")
# log(float32's largest value): k3's term exp(ref_logp - logp) - (ref_logp - logp) - 1 of a
# token is inf past this log ratio
EXP_LIMIT = math.log(torch.finfo(torch.float32).max)


def _k3_term_overflows(logp: torch.Tensor, tokens: torch.Tensor,
                       tensors: dict[str, Any]) -> bool:
    """Whether a real token's k3 term is past float32's range at the float64 log ratio, as
    the contract (docs/ops/linear_policy_loss.md) then gives an infinite loss where float64's
    may be finite (4.9e36 at seed 10737029). Log ratios within float32's rounding of logp
    (|logp| * 2^-20) of the edge are left out: either answer is right there."""
    real = (tensors["mask"].reshape(-1) != 0) & (tokens != -100)
    log_ratio = (tensors["ref_logp"].reshape(-1).double() - logp.reshape(-1).double())[real]
    if not log_ratio.numel():
        return False
    largest = float(log_ratio.max())
    assume(abs(largest - EXP_LIMIT) > float(logp.abs().max()) * 2.0**-20 + 1e-6)
    return largest > EXP_LIMIT


@pytest.mark.parametrize(("path", "softcap", "garbage", "k3"),
                         [*(_case(p, s, g) for p in PATHS for s in (False, True)
                            for g in (False, True)), K3])
@fuzz(data=st.data(), entropy_coef=st.sampled_from([0.0, 0.01]))
def test_linear_policy_loss_against_float64(path, softcap, garbage, k3, data, entropy_coef):
    tally("linear_policy_loss")
    call = data.draw(linear_loss_calls(path, softcap, k3))
    (hidden, weight, bias, tokens, temp, head), tensors, options, budget = call
    batch, length = tensors["old_logp"].shape
    spec = specs()["linear_policy_loss"]
    given = _nan_at_a_masked_row(hidden, tokens, tensors["mask"]) if garbage else hidden
    with_grad = path != "no-grad"
    leaves = [None if t is None else on_device(t).detach().clone().requires_grad_(with_grad)
              for t in (given, weight, bias)]
    shaped_temp = temp if not isinstance(temp, torch.Tensor) or temp.dim() == 0 \
        else temp.reshape(batch, length)
    device_tensors = {name: on_device(value) for name, value in tensors.items()}
    shaped = on_device(tokens.reshape(batch, length))
    before = snapshot(hidden=leaves[0], weight=leaves[1], tokens=shaped, **device_tensors)
    with environment(RLK_NATIVE_CHUNK_MB=budget, RLK_CUDA_CHUNK_MB=budget), \
            torch.set_grad_enabled(with_grad):
        loss, metrics = rlk.linear_policy_loss(
            leaves[0].reshape(batch, length, hidden.shape[-1]), leaves[1], shaped,
            bias=leaves[2], temperature=on_device(shaped_temp), entropy_coef=entropy_coef,
            options=options, **head, **device_tensors)
        got_grads = []
        if with_grad:
            got_grads = [g.cpu() for g in torch.autograd.grad(
                loss, [leaf for leaf in leaves if leaf is not None])]
    unchanged(before, hidden=leaves[0], weight=leaves[1], tokens=shaped, **device_tensors)
    # what a NaN at an ignored row must not change: the call with that row's hidden at zero
    clean = hidden.clone()
    if garbage:
        clean[given.isnan().any(-1)] = 0
    want_loss, want_metrics, want_logp, expected = _reference(
        clean, weight, bias, tokens, per_row(temp, (batch * length,)), head, entropy_coef,
        options, tensors, with_grad)
    # k3's term exp(ref_logp - logp), up to ~88: in the mean_kl metric whenever there is a
    # reference, in the loss only with a nonzero kl_coef
    exponential = options.kl_estimator in ("k3", "k3+") and "ref_logp" in tensors
    exponential_kl = exponential and options.kl_coef > 0
    if exponential_kl and options.kl_clamp is None and _k3_term_overflows(want_logp, tokens,
                                                                           tensors):
        assert not bool(loss.isfinite()), f"a finite loss {float(loss)} past k3's range"
        return
    tolerance = spec.tolerances[hidden.dtype]
    temps = per_row(temp, (batch * length,))
    exponent = _exponent_error(clean, weight, bias, temps, head, want_logp, tensors)
    real = (tensors["mask"].reshape(-1) != 0) & (tokens != -100)
    widened = tolerance
    if exponential and bool(real.any()):
        widened = Tolerance(tolerance.atol, max(tolerance.rtol, float(exponent[real].max())))
    loss_tolerance = widened if exponential_kl else tolerance
    assert_matches("loss", loss, want_loss, loss_tolerance,
                   allowance=_vespo_allowance(want_logp, tokens, exponent, options, tensors))
    got_metrics = torch.stack([metrics[name].cpu() for name in (*METRICS, "entropy")])
    assert_matches("metrics", got_metrics, in_range(want_metrics, torch.float32), widened)
    assert_matches("logp", metrics["logp"].reshape(-1), want_logp.reshape(-1), loss_tolerance)
    assert spec.grad_tolerances is not None
    if not got_grads:
        return
    grad_logits, logp = _logits_gradient(clean, weight, bias, tokens, temps, head,
                                         entropy_coef, options, tensors)
    allowances = _rounded_operand_allowance(grad_logits, logp, clean, weight, bias, temps, head,
                                            tensors)
    overflow = _float16_overflow(grad_logits, hidden.dtype) or [None, None, None]
    present = [(a, o) for a, o, t in zip(allowances, overflow, (hidden, weight, bias),
                                         strict=True) if t is not None]
    for name, actual, truth, (allowance, past) in zip(
            ("grad_hidden", "grad_weight", "grad_bias"), got_grads, expected, present,
            strict=False):
        truth = in_range(truth, actual.dtype)
        if past is not None:  # inf or NaN allowed there, a finite value still judged
            shaped = past.reshape(-1, *[1] * (actual.dim() - 1)).expand_as(actual)
            actual = torch.where(shaped & ~actual.isfinite(), truth.to(actual.dtype), actual)
        assert_matches(name, actual, truth, spec.grad_tolerances[hidden.dtype],
                       allowance=allowance)

