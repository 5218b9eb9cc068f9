"""Property-based fuzzing of every public op against its float64 reference.

Hypothesis draws shapes, dtypes, logit scales (from near-uniform to a dominant target),
temperatures (scalar and per row), ignored and out-of-range tokens, NaN and -inf rows, row
selections, strides and the op's options; each example checks the forward against the float64
reference at the spec's tolerance, the gradient against float64 autograd, and that the call
left its inputs untouched. Derandomized, so CI runs the same examples every time;
RLK_FUZZ_EXAMPLES scales the number of examples per op (CI keeps the default).
"""

from __future__ import annotations

import os

import pytest
import torch

import rlk
from rlk import reference
from rlk.ops import specs
from rlk.testing.compare import assert_bitwise_equal, assert_matches

hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
from hypothesis import given, settings  # noqa: E402

EXAMPLES = int(os.environ.get("RLK_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(hypothesis.HealthCheck))
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _generator(draw) -> torch.Generator:
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))


def _unchanged(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> None:
    for name, value in before.items():
        assert_bitwise_equal(f"input {name} after the call", after[name], value)


def _snapshot(**tensors: torch.Tensor | None) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in tensors.items()
            if isinstance(value, torch.Tensor)}


# ---------------------------------------------------------------------------
# logp, logp_entropy


@st.composite
def logp_calls(draw):
    gen = _generator(draw)
    dtype = draw(st.sampled_from(FLOATS))
    lead = draw(st.sampled_from([(0,), (1,), (3,), (7,), (2, 3), (4, 5)]))
    vocab = draw(st.sampled_from([1, 2, 5, 17, 64, 257, 1031]))
    scale = draw(st.sampled_from([0.01, 1.0, 3.0, 8.0]))
    rows = int(torch.tensor(lead).prod())
    logits = torch.randn(rows, vocab, generator=gen) * scale
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
        wide = torch.full((rows, 2 * vocab + 3), 1e4)
        wide[:, : 2 * vocab : 2] = logits
        logits_arg = wide[:, : 2 * vocab : 2]
    else:
        logits_arg = logits
    logits_arg = logits_arg.to(dtype).reshape(*lead, vocab)
    temperature: float | torch.Tensor
    if draw(st.booleans()):
        temperature = draw(st.sampled_from([1.0, 0.7, 0.25, 2.5]))
    else:
        temperature = (torch.rand(rows, generator=gen) * 2 + 0.2).reshape(lead)
    select = None
    if len(lead) == 1 and rows and draw(st.booleans()):
        count = draw(st.integers(0, rows))
        select = torch.randperm(rows, generator=gen)[:count]
    return logits_arg, tokens.reshape(lead), temperature, select, special


@pytest.mark.parametrize("with_entropy", [False, True], ids=["logp", "logp_entropy"])
@FUZZ
@given(call=logp_calls())
def test_logp_family_against_float64(with_entropy, call):
    logits, tokens, temperature, select, special = call
    spec = specs()["logp_entropy" if with_entropy else "logp"]
    differentiable = special in ("none", "ignore")
    leaf = logits.detach().clone().requires_grad_(differentiable)
    before = _snapshot(logits=logits, tokens=tokens, temperature=temperature, rows=select)
    op = rlk.logp_entropy if with_entropy else rlk.logp
    result = op(leaf, tokens, temperature=temperature, rows=select)
    outputs = result if with_entropy else (result,)
    _unchanged(before, _snapshot(logits=leaf, tokens=tokens, temperature=temperature,
                                 rows=select))
    flat = logits.reshape(-1, logits.shape[-1])
    flat_tokens, flat_temp = tokens.reshape(-1), temperature
    if isinstance(temperature, torch.Tensor):
        flat_temp = temperature.reshape(-1)
    if select is not None:
        flat, flat_tokens = flat[select], flat_tokens[select]
        flat_temp = flat_temp[select] if isinstance(flat_temp, torch.Tensor) else flat_temp
    want = reference.logp_entropy(flat, flat_tokens, temperature=flat_temp)
    tolerance = spec.tolerances[logits.dtype]
    for name, got, expected in zip(("logp", "entropy"), outputs, want, strict=False):
        assert_matches(name, got.reshape(-1), expected, tolerance)
    if not differentiable or flat.shape[0] == 0:
        return
    gen = torch.Generator().manual_seed(7)
    upstream = [torch.randn(out.shape, generator=gen) for out in outputs]
    total = sum((out * g).sum() for out, g in zip(outputs, upstream, strict=True))
    (grad,) = torch.autograd.grad(total, leaf)
    grad_logp = upstream[0].reshape(-1)
    grad_entropy = upstream[1].reshape(-1) if with_entropy else None
    full_rows = logits.reshape(-1, logits.shape[-1]).shape[0]
    if select is not None:  # scatter the upstream gradient back to every row
        grad_logp = torch.zeros(full_rows).index_copy(0, select, grad_logp)
        if grad_entropy is not None:
            grad_entropy = torch.zeros(full_rows).index_copy(0, select, grad_entropy)
    expected = reference.logp_entropy_grad(
        logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1), grad_logp, grad_entropy,
        temperature=temperature if not isinstance(temperature, torch.Tensor)
        else temperature.reshape(-1),
    )
    assert spec.grad_tolerances is not None
    assert_matches("grad_logits", grad.reshape(expected.shape), expected,
                   spec.grad_tolerances[logits.dtype])


# ---------------------------------------------------------------------------
# linear_logp, linear_logp_entropy


@st.composite
def linear_calls(draw):
    gen = _generator(draw)
    dtype = draw(st.sampled_from(FLOATS))
    rows = draw(st.sampled_from([0, 1, 3, 8]))
    width = draw(st.sampled_from([1, 4, 16]))
    vocab = draw(st.sampled_from([1, 7, 64, 300]))
    scale = draw(st.sampled_from([0.1, 1.0, 3.0]))
    hidden = torch.randn(rows, width, generator=gen)
    weight = torch.randn(vocab, width, generator=gen) * scale / width**0.5
    bias = torch.randn(vocab, generator=gen) if draw(st.booleans()) else None
    tokens = torch.randint(0, vocab, (rows,), generator=gen)
    if rows and draw(st.booleans()):
        tokens[draw(st.integers(0, rows - 1))] = -100
    if draw(st.booleans()):
        temperature: float | torch.Tensor = draw(st.sampled_from([1.0, 0.7, 2.0]))
    else:
        temperature = torch.rand(rows, generator=gen) + 0.3
    cast = [None if t is None else t.to(dtype) for t in (hidden, weight, bias)]
    return (*cast, tokens, temperature)


@pytest.mark.parametrize("with_entropy", [False, True],
                         ids=["linear_logp", "linear_logp_entropy"])
@FUZZ
@given(call=linear_calls())
def test_linear_family_against_float64(with_entropy, call):
    hidden, weight, bias, tokens, temperature = call
    spec = specs()["linear_logp_entropy" if with_entropy else "linear_logp"]
    leaves = [None if t is None else t.detach().clone().requires_grad_(True)
              for t in (hidden, weight, bias)]
    before = _snapshot(hidden=hidden, weight=weight, bias=bias, tokens=tokens,
                       temperature=temperature)
    op = rlk.linear_logp_entropy if with_entropy else rlk.linear_logp
    result = op(leaves[0], leaves[1], tokens, bias=leaves[2], temperature=temperature)
    outputs = result if with_entropy else (result,)
    _unchanged(before, _snapshot(hidden=leaves[0], weight=leaves[1], bias=leaves[2],
                                 tokens=tokens, temperature=temperature))
    want = reference.linear_logp_entropy(hidden, weight, tokens, bias=bias,
                                         temperature=temperature)
    for name, got, expected in zip(("logp", "entropy"), outputs, want, strict=False):
        assert_matches(name, got, expected, spec.tolerances[hidden.dtype])
    if hidden.shape[0] == 0:
        return
    gen = torch.Generator().manual_seed(5)
    upstream = [torch.randn(out.shape, generator=gen) for out in outputs]
    total = sum((out * g).sum() for out, g in zip(outputs, upstream, strict=True))
    wanted = [leaf for leaf in leaves if leaf is not None]
    got = torch.autograd.grad(total, wanted)
    expected = reference.linear_logp_entropy_grad(
        hidden, weight, tokens, upstream[0], upstream[1] if with_entropy else None, bias=bias,
        temperature=temperature)
    assert spec.grad_tolerances is not None
    for name, actual, truth in zip(("grad_hidden", "grad_weight", "grad_bias"), got, expected,
                                   strict=False):
        assert_matches(name, actual, truth, spec.grad_tolerances[hidden.dtype])


# ---------------------------------------------------------------------------
# policy_loss


@st.composite
def policy_calls(draw):
    gen = _generator(draw)
    batch = draw(st.sampled_from([0, 1, 3, 6]))
    length = draw(st.sampled_from([1, 5, 12]))
    spread = draw(st.sampled_from([0.01, 0.3, 1.5]))
    logp = -torch.rand(batch, length, generator=gen) * 4
    old = logp + torch.randn(batch, length, generator=gen) * spread
    mask = torch.rand(batch, length, generator=gen) > draw(st.sampled_from([0.0, 0.3, 0.9]))
    per_token = draw(st.booleans())
    advantages = torch.randn((batch, length) if per_token else (batch,), generator=gen)
    options: dict = {
        "clip_low": draw(st.sampled_from([0.1, 0.2, 0.9])),
        "clip_high": draw(st.sampled_from([0.2, 0.28, 3.0])),
        "agg": draw(st.sampled_from(["token-mean", "seq-mean-token-mean",
                                     "seq-mean-token-sum", "seq-mean-token-sum-norm"])),
        "ratio_level": draw(st.sampled_from(["token", "sequence"])),
    }
    if draw(st.booleans()):
        options["dual_clip"] = draw(st.sampled_from([1.5, 3.0]))
    if draw(st.booleans()):
        options["ref_logp"] = logp + torch.randn(batch, length, generator=gen) * spread
        options["kl_coef"] = draw(st.sampled_from([0.0, 0.04, 1.0]))
        options["kl_estimator"] = draw(st.sampled_from(["k1", "k2", "k3"]))
    if draw(st.booleans()):
        options["rollout_logp"] = old + torch.randn(batch, length, generator=gen) * spread
        options["tis_cap"] = draw(st.sampled_from([None, 1.0, 2.0]))
    if batch and draw(st.booleans()):  # garbage where the mask is off must not leak
        row, col = draw(st.integers(0, batch - 1)), draw(st.integers(0, length - 1))
        mask[row, col] = False
        logp[row, col] = draw(st.sampled_from([float("nan"), float("inf"), -1e30]))
    return logp, old, advantages, mask, options


@FUZZ
@given(call=policy_calls())
def test_policy_loss_against_float64(call):
    logp, old, advantages, mask, options = call
    spec = specs()["policy_loss"]
    leaf = logp.clone().requires_grad_(True)
    before = _snapshot(logp=logp, old=old, advantages=advantages, mask=mask,
                       **{k: v for k, v in options.items() if isinstance(v, torch.Tensor)})
    loss, metrics = rlk.policy_loss(leaf, old, advantages, mask, **options)
    _unchanged(before, _snapshot(logp=leaf, old=old, advantages=advantages, mask=mask,
                                 **{k: v for k, v in options.items()
                                    if isinstance(v, torch.Tensor)}))
    truth_leaf = logp.double().requires_grad_(True)
    want_loss, want_metrics = reference.policy_loss(truth_leaf, old, advantages, mask, **options)
    tolerance = spec.tolerances[torch.float32]
    assert_matches("loss", loss, want_loss, tolerance)
    got_metrics = torch.stack([metrics[name] for name in
                               ("clip_fraction", "mean_ratio", "mean_kl", "truncated_fraction")])
    assert_matches("metrics", got_metrics, want_metrics, tolerance)
    (grad,) = torch.autograd.grad(loss, leaf)
    want_grad = torch.zeros_like(truth_leaf)  # the reference drops the graph without tokens
    if want_loss.requires_grad:
        (want_grad,) = torch.autograd.grad(want_loss, truth_leaf)
    assert spec.grad_tolerances is not None
    assert_matches("grad_logp", grad, want_grad.nan_to_num(), spec.grad_tolerances[torch.float32])
    assert torch.equal(grad[~mask], torch.zeros(int((~mask).sum()))), "masked tokens got gradient"


# ---------------------------------------------------------------------------
# group_advantages


@st.composite
def advantage_calls(draw):
    gen = _generator(draw)
    groups = draw(st.sampled_from([0, 1, 3, 8]))
    size = draw(st.sampled_from([1, 2, 4, 16]))
    kind = draw(st.sampled_from(["gaussian", "binary", "constant", "offset"]))
    count = groups * size
    if kind == "binary":
        rewards = (torch.rand(count, generator=gen) > 0.5).float()
    elif kind == "constant":
        rewards = torch.full((count,), 0.75)
    elif kind == "offset":  # scores on a scale of tens, as reward models give
        rewards = torch.randn(count, generator=gen) * 3 + 20
    else:
        rewards = torch.randn(count, generator=gen)
    options = {"normalize": draw(st.sampled_from(["std", "none"])),
               "baseline": draw(st.sampled_from(["mean", "loo"])),
               "eps": draw(st.sampled_from([0.0, 1e-6, 1e-4]))}
    if draw(st.booleans()):
        options["group_size"] = size
        ids = torch.arange(count) // size
    else:
        ids = torch.randperm(count, generator=gen) % max(groups, 1) * 7 - 3
        options["group_ids"] = ids
    return rewards, ids, options


@FUZZ
@given(call=advantage_calls())
def test_group_advantages_against_float64(call):
    rewards, ids, options = call
    before = _snapshot(rewards=rewards, ids=ids)
    got = rlk.group_advantages(rewards, **options)
    _unchanged(before, _snapshot(rewards=rewards, ids=ids))
    want = reference.group_advantages(rewards, ids, normalize=options["normalize"],
                                      baseline=options["baseline"], eps=options["eps"])
    assert_matches("advantages", got, want, specs()["group_advantages"].tolerances[torch.float32])


# ---------------------------------------------------------------------------
# sample


@st.composite
def sample_calls(draw):
    gen = _generator(draw)
    dtype = draw(st.sampled_from(FLOATS))
    rows = draw(st.sampled_from([0, 1, 4, 9]))
    vocab = draw(st.sampled_from([1, 2, 10, 100, 1000]))
    scale = draw(st.sampled_from([0.1, 2.0, 4.0, 20.0]))
    logits = (torch.randn(rows, vocab, generator=gen) * scale).to(dtype)
    if rows and draw(st.booleans()):
        special = draw(st.sampled_from(["nan", "-inf", "ties"]))
        row = draw(st.integers(0, rows - 1))
        if special == "nan":
            logits[row, 0] = float("nan")
        elif special == "-inf":
            logits[row] = float("-inf")
        else:
            logits[row] = torch.round(logits[row].float()).to(dtype)
    options = {"temperature": draw(st.sampled_from([0.0, 0.3, 1.0, 1.7])),
               "top_k": draw(st.sampled_from([0, 1, 5, 50])),
               "top_p": draw(st.sampled_from([1.0, 0.95, 0.5, 0.05])),
               "min_p": draw(st.sampled_from([0.0, 0.05, 0.5]))}
    seed = draw(st.one_of(st.none(), st.integers(-(2**62), 2**62),
                          st.just(torch.randint(-(2**62), 2**62, (rows,), generator=gen))))
    return logits, options, seed


@FUZZ
@given(call=sample_calls())
def test_sample_draws_from_the_reference_distribution(call):
    logits, options, seed = call
    before = _snapshot(logits=logits, seed=seed)
    tokens, logp, processed = rlk.sample(logits, seed=seed, **options)
    _unchanged(before, _snapshot(logits=logits, seed=seed))
    truth = reference.sample_log_probs(logits, **options)
    for row in range(logits.shape[0]):
        if bool(truth[row].isnan().all()):
            assert tokens[row] == -1 and logp[row].isnan() and processed[row].isnan()
            continue
        token = int(tokens[row])
        assert 0 <= token < logits.shape[1], f"row {row}: token {token}"
        assert truth[row, token] > -torch.inf, f"row {row}: token {token} outside the kept set"
        assert abs(float(processed[row]) - float(truth[row, token])) <= 2e-5 + 1e-5 * abs(
            float(truth[row, token])), f"row {row}: processed_logp"
    temperature = options["temperature"] or 1.0
    valid = tokens >= 0
    expected = rlk.logp(logits, torch.where(valid, tokens, 0), temperature=temperature)
    assert_bitwise_equal("logp", logp[valid], expected[valid])
