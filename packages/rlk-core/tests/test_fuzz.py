"""Property-based fuzzing of every public op against its float64 reference.

Hypothesis draws shapes, dtypes, logit scales (from near-uniform to a dominant target),
temperatures (scalar and per row), ignored and out-of-range tokens, NaN and -inf rows, row
selections, strides and each op's options; every example checks the forward against the
float64 reference at the spec's tolerance, the gradient against float64 autograd, and that
the call left its inputs untouched. Derandomized, so CI runs the same examples every time;
RLK_FUZZ_EXAMPLES sets the number of examples per op (CI keeps the default).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import rlk
from rlk._runtime.spec import specs
from rlk.ops.entropy import reference as entropy_reference
from rlk.ops.group_advantages import reference as group_advantages_reference
from rlk.ops.group_advantages.options import GroupAdvantagesOptions
from rlk.ops.linear_logp import reference as linear_logp_reference
from rlk.ops.linear_policy_loss import reference as linear_policy_loss_reference
from rlk.ops.logp import reference
from rlk.ops.policy_loss import reference as policy_loss_reference
from rlk.ops.policy_loss.options import METRICS, PolicyLossOptions
from rlk.ops.sample import reference as sample_reference
from rlk.testing.compare import assert_bitwise_equal, assert_matches

hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
from hypothesis import given, settings  # noqa: E402

EXAMPLES = int(os.environ.get("RLK_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(hypothesis.HealthCheck))
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _generator(draw) -> torch.Generator:
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))


def _snapshot(**values: Any) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in values.items()
            if isinstance(value, torch.Tensor)}


def _unchanged(before: dict[str, torch.Tensor], **after: Any) -> None:
    for name, value in before.items():
        assert_bitwise_equal(f"input {name} after the call", after[name], value)


def _grads(outputs: tuple[torch.Tensor, ...], inputs: list[torch.Tensor],
           seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Random upstream gradients for `outputs` and the gradients they give `inputs`."""
    gen = torch.Generator().manual_seed(seed)
    upstream = [torch.randn(out.shape, generator=gen) for out in outputs]
    total = sum((out.double() * g).sum() for out, g in zip(outputs, upstream, strict=True))
    return upstream, list(torch.autograd.grad(total, inputs))


def _temperature(draw, gen: torch.Generator, lead: tuple[int, ...]) -> float | torch.Tensor:
    kind = draw(st.sampled_from(["float", "tensor", "0-d"]))
    if kind == "float":
        return draw(st.sampled_from([1.0, 0.7, 0.25, 2.5]))
    if kind == "0-d":
        return torch.tensor(draw(st.sampled_from([0.6, 1.3])))
    rows = int(torch.tensor(lead).prod()) if lead else 1
    return (torch.rand(rows, generator=gen) * 2 + 0.2).reshape(lead)


def _per_row(temperature: float | torch.Tensor, lead: tuple[int, ...]) -> float | torch.Tensor:
    """A temperature as the references take it: a float, or one value per flattened row."""
    if not isinstance(temperature, torch.Tensor):
        return temperature
    if temperature.dim() == 0:
        return float(temperature)
    return temperature.reshape(-1)


# ---------------------------------------------------------------------------
# logp, logp_entropy, entropy


@st.composite
def logits_calls(draw):
    gen = _generator(draw)
    dtype = draw(st.sampled_from((*FLOATS, torch.float64)))
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
    return logits, tokens.reshape(lead), _temperature(draw, gen, lead), select, mask, special


def _selected(logits: torch.Tensor, tokens: torch.Tensor, temperature: float | torch.Tensor,
              select: torch.Tensor | None, mask: torch.Tensor | None):
    """The flattened rows a call computes, with mask= folded into the tokens."""
    flat = logits.reshape(-1, logits.shape[-1])
    flat_tokens = tokens.reshape(-1).clone()
    if mask is not None:
        flat_tokens[mask.reshape(-1) == 0] = -100
    temp = _per_row(temperature, tuple(tokens.shape))
    if select is not None:
        flat, flat_tokens = flat[select], flat_tokens[select]
        temp = temp[select] if isinstance(temp, torch.Tensor) else temp
    return flat, flat_tokens, temp


@pytest.mark.parametrize("with_entropy", [False, True], ids=["logp", "logp_entropy"])
@FUZZ
@given(call=logits_calls(), out_dtype=st.sampled_from([None, "input"]))
def test_logp_family_against_float64(with_entropy, call, out_dtype):
    logits, tokens, temperature, select, mask, special = call
    spec = specs()["logp_entropy" if with_entropy else "logp"]
    differentiable = special in ("none", "ignore")
    leaf = logits.detach().clone().requires_grad_(differentiable)
    before = _snapshot(logits=logits, tokens=tokens, temperature=temperature, rows=select,
                       mask=mask)
    dtype = logits.dtype if out_dtype == "input" else None
    op = rlk.logp_entropy if with_entropy else rlk.logp
    result = op(leaf, tokens, temperature=temperature, rows=select, mask=mask, dtype=dtype)
    outputs = result if with_entropy else (result,)
    _unchanged(before, logits=leaf, tokens=tokens, temperature=temperature, rows=select,
               mask=mask)
    expected_dtype = dtype or (torch.float64 if logits.dtype == torch.float64 else torch.float32)
    assert all(out.dtype == expected_dtype for out in outputs), [o.dtype for o in outputs]
    flat, flat_tokens, temp = _selected(logits, tokens, temperature, select, mask)
    want = reference.logp_entropy(flat, flat_tokens, temperature=temp)
    # an output in a reduced dtype carries one more rounding of its own
    tolerance = spec.tolerances[expected_dtype if dtype is not None else logits.dtype]
    for name, got, truth in zip(("logp", "entropy"), outputs, want, strict=False):
        truth = truth.to(got.dtype).double() if dtype is not None else truth
        assert_matches(name, got.reshape(-1), truth, tolerance)
    if not differentiable or flat.shape[0] == 0 or dtype is not None:
        return
    upstream, (grad,) = _grads(outputs, [leaf], seed=7)
    full, full_tokens, full_temp = _selected(logits, tokens, temperature, None, mask)
    grad_logp, grad_entropy = upstream[0].reshape(-1), None
    if with_entropy:
        grad_entropy = upstream[1].reshape(-1)
    if select is not None:  # the upstream gradient lands on the selected rows only
        grad_logp = torch.zeros(full.shape[0]).index_copy(0, select, grad_logp)
        if grad_entropy is not None:
            grad_entropy = torch.zeros(full.shape[0]).index_copy(0, select, grad_entropy)
    expected = reference.logp_entropy_grad(full, full_tokens, grad_logp, grad_entropy,
                                           temperature=full_temp)
    assert spec.grad_tolerances is not None
    assert_matches("grad_logits", grad.reshape(expected.shape), expected,
                   spec.grad_tolerances[logits.dtype])


@FUZZ
@given(call=logits_calls())
def test_logp_gathers_k_tokens_a_row(call):
    """tokens [..., K] (TRL's selective_log_softmax): each column as its own logp call."""
    logits, tokens, temperature, _, _, special = call
    if logits.shape[-1] < 2 or logits.numel() == 0:
        return
    gen = torch.Generator().manual_seed(3)
    many = torch.randint(0, logits.shape[-1], (*tokens.shape, 3), generator=gen)
    many[..., 0] = tokens.clamp(min=0, max=logits.shape[-1] - 1)
    leaf = logits.detach().clone().requires_grad_(special in ("none", "ignore"))
    got = rlk.logp(leaf, many, temperature=temperature)
    flat = logits.reshape(-1, logits.shape[-1])
    want = reference.logp_entropy(flat, many.reshape(-1, 3),
                                  temperature=_per_row(temperature, tuple(tokens.shape)))[0]
    assert got.shape == many.shape
    assert_matches("logp", got.reshape(-1, 3), want, specs()["logp"].tolerances[logits.dtype])


@FUZZ
@given(call=logits_calls())
def test_entropy_against_float64(call):
    logits, tokens, temperature, select, mask, special = call
    spec = specs()["entropy"]
    leaf = logits.detach().clone().requires_grad_(special in ("none", "ignore"))
    before = _snapshot(logits=logits, temperature=temperature, rows=select, mask=mask)
    got = rlk.entropy(leaf, temperature=temperature, rows=select, mask=mask)
    _unchanged(before, logits=leaf, temperature=temperature, rows=select, mask=mask)
    flat = logits.reshape(-1, logits.shape[-1])
    temp = _per_row(temperature, tuple(tokens.shape))
    flat_mask = None if mask is None else mask.reshape(-1)
    if select is not None:
        flat = flat[select]
        temp = temp[select] if isinstance(temp, torch.Tensor) else temp
        flat_mask = None if flat_mask is None else flat_mask[select]
    want = entropy_reference.entropy(flat, temperature=temp, mask=flat_mask)
    assert_matches("entropy", got.reshape(-1), want, spec.tolerances[logits.dtype])


# ---------------------------------------------------------------------------
# linear_logp, linear_logp_entropy, linear_policy_loss


@st.composite
def head_calls(draw, rows=(0, 1, 3, 8)):
    gen = _generator(draw)
    dtype = draw(st.sampled_from(FLOATS))
    count = draw(st.sampled_from(rows))
    width = draw(st.sampled_from([1, 4, 16]))
    vocab = draw(st.sampled_from([1, 7, 64, 300]))
    scale = draw(st.sampled_from([0.1, 1.0, 3.0]))
    hidden = torch.randn(count, width, generator=gen)
    weight = torch.randn(vocab, width, generator=gen) * scale / width**0.5
    bias = torch.randn(vocab, generator=gen) if draw(st.booleans()) else None
    tokens = torch.randint(0, vocab, (count,), generator=gen)
    if count and draw(st.booleans()):
        tokens[draw(st.integers(0, count - 1))] = -100
    head = {"softcap": draw(st.sampled_from([None, 30.0, 2.0])),
            "logit_scale": draw(st.sampled_from([1.0, 0.5]))}
    cast = [None if t is None else t.to(dtype) for t in (hidden, weight, bias)]
    return (*cast, tokens, _temperature(draw, gen, (count,)), head)


@pytest.mark.parametrize("with_entropy", [False, True],
                         ids=["linear_logp", "linear_logp_entropy"])
@FUZZ
@given(call=head_calls())
def test_linear_family_against_float64(with_entropy, call):
    hidden, weight, bias, tokens, temperature, head = call
    spec = specs()["linear_logp_entropy" if with_entropy else "linear_logp"]
    leaves = [None if t is None else t.detach().clone().requires_grad_(True)
              for t in (hidden, weight, bias)]
    before = _snapshot(hidden=hidden, weight=weight, bias=bias, tokens=tokens,
                       temperature=temperature)
    op = rlk.linear_logp_entropy if with_entropy else rlk.linear_logp
    result = op(leaves[0], leaves[1], tokens, bias=leaves[2], temperature=temperature, **head)
    outputs = result if with_entropy else (result,)
    _unchanged(before, hidden=leaves[0], weight=leaves[1], bias=leaves[2], tokens=tokens,
               temperature=temperature)
    temp = _per_row(temperature, tuple(tokens.shape))
    want = linear_logp_reference.linear_logp_entropy(hidden, weight, tokens, bias=bias,
                                                     temperature=temp, **head)
    for name, got, truth in zip(("logp", "entropy"), outputs, want, strict=False):
        assert_matches(name, got, truth, spec.tolerances[hidden.dtype])
    if hidden.shape[0] == 0:
        return
    wanted = [leaf for leaf in leaves if leaf is not None]
    upstream, got_grads = _grads(outputs, wanted, seed=5)
    expected = linear_logp_reference.linear_logp_entropy_grad(
        hidden, weight, tokens, upstream[0], upstream[1] if with_entropy else None, bias=bias,
        temperature=temp, **head)
    assert spec.grad_tolerances is not None
    for name, actual, truth in zip(("grad_hidden", "grad_weight", "grad_bias"), got_grads,
                                   expected, strict=False):
        assert_matches(name, actual, truth, spec.grad_tolerances[hidden.dtype])


# ---------------------------------------------------------------------------
# policy_loss, linear_policy_loss


@st.composite
def loss_options(draw) -> PolicyLossOptions:
    objective = draw(st.sampled_from(["ppo", "cispo", "sapo", "vespo"]))
    settings_: dict[str, Any] = {
        "objective": objective,
        "clip_low": draw(st.sampled_from([0.1, 0.2, 0.9])),
        "clip_high": draw(st.sampled_from([0.2, 0.28, 3.0])),
        "agg": draw(st.sampled_from(["token-mean", "token-sum", "seq-mean-token-mean",
                                     "seq-mean-token-sum", "seq-mean-token-sum-norm"])),
        "ratio_level": "token" if objective == "vespo" else draw(
            st.sampled_from(["token", "sequence", "sequence-token"])),
        "kl_coef": draw(st.sampled_from([0.0, 0.04, 1.0])),
        "kl_estimator": draw(st.sampled_from(["k1", "k2", "k3", "abs", "k1+", "k3+", "abs+"])),
        "kl_clamp": draw(st.sampled_from([None, 10.0, 0.05])),
        "kl_bias_correction": draw(st.booleans()),
        "scale": draw(st.sampled_from([1.0, 0.25])),
    }
    if objective == "ppo":
        settings_["dual_clip"] = draw(st.sampled_from([None, 1.5, 3.0]))
        settings_["ratio_cap"] = draw(st.sampled_from([None, 1.5]))
    if objective != "vespo" and draw(st.booleans()):
        settings_["log_ratio_min"], settings_["log_ratio_max"] = -20.0, 20.0
    if draw(st.booleans()):
        settings_["divisor"] = draw(st.sampled_from([7.0, 512.0]))
    if settings_["agg"].startswith("seq-mean") and draw(st.booleans()):
        settings_["count_empty_rows"] = True
    return PolicyLossOptions(**settings_)


def _needs_ref(options: PolicyLossOptions) -> bool:
    return bool(options.kl_coef) or options.kl_clamp is not None or options.kl_bias_correction


@st.composite
def loss_inputs(draw, options: PolicyLossOptions, batch: int, length: int):
    """The tensors of a policy-loss call for `options` (ref_logp when its KL needs one)."""
    gen = _generator(draw)
    spread = draw(st.sampled_from([0.01, 0.3, 1.5]))
    logp = -torch.rand(batch, length, generator=gen) * 4
    old = logp + torch.randn(batch, length, generator=gen) * spread
    mask = torch.rand(batch, length, generator=gen) > draw(st.sampled_from([0.0, 0.3, 0.9]))
    shape = draw(st.sampled_from([(batch,), (batch, 1), (batch, length)]))
    tensors: dict[str, Any] = {"old_logp": old, "advantages": torch.randn(shape, generator=gen),
                               "mask": mask.to(draw(st.sampled_from([torch.bool, torch.int64,
                                                                     torch.float32])))}
    if _needs_ref(options) or draw(st.booleans()):
        tensors["ref_logp"] = logp + torch.randn(batch, length, generator=gen) * spread
    if draw(st.booleans()):
        tensors["rollout_logp"] = old + torch.randn(batch, length, generator=gen) * spread
    if draw(st.booleans()):
        tensors["importance_weights"] = torch.rand(batch, length, generator=gen) * 2
    return logp, tensors


@st.composite
def loss_calls(draw, batch_sizes=(0, 1, 3, 6), lengths=(1, 5, 12)):
    options = draw(loss_options())
    batch, length = draw(st.sampled_from(batch_sizes)), draw(st.sampled_from(lengths))
    logp, tensors = draw(loss_inputs(options, batch, length))
    return logp, tensors, options


def _with_garbage(draw, logp: torch.Tensor, mask: torch.Tensor) -> None:
    """NaN, inf or huge values where the mask is off must not leak into loss or gradient."""
    if logp.numel() and draw(st.booleans()):
        row = draw(st.integers(0, logp.shape[0] - 1))
        col = draw(st.integers(0, logp.shape[1] - 1))
        mask[row, col] = 0
        logp[row, col] = draw(st.sampled_from([float("nan"), float("inf"), -1e30]))


@FUZZ
@given(call=loss_calls(), data=st.data())
def test_policy_loss_against_float64(call, data):
    logp, tensors, options = call
    _with_garbage(data.draw, logp, tensors["mask"])
    dtype = data.draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16,
                                       torch.float64]))
    logp = logp.to(dtype)
    spec = specs()["policy_loss"]
    leaf = logp.clone().requires_grad_(True)
    before = _snapshot(logp=logp, **tensors)
    loss, metrics = rlk.policy_loss(leaf, options=options, **tensors)
    _unchanged(before, logp=leaf, **tensors)
    truth_leaf = logp.double().requires_grad_(True)
    want_loss, want_metrics = policy_loss_reference.policy_loss(truth_leaf, options=options,
                                                                **tensors)
    tolerance = spec.tolerances[torch.float32]
    assert_matches("loss", loss, want_loss, tolerance)
    got_metrics = torch.stack([metrics[name] for name in METRICS])
    assert_matches("metrics", got_metrics, want_metrics, tolerance)
    (grad,) = torch.autograd.grad(loss, leaf)
    assert grad.dtype == logp.dtype
    want_grad = torch.zeros_like(truth_leaf)  # the reference drops the graph without tokens
    if want_loss.requires_grad:
        (want_grad,) = torch.autograd.grad(want_loss, truth_leaf)
    assert spec.grad_tolerances is not None
    assert_matches("grad_logp", grad, want_grad, spec.grad_tolerances[dtype])
    masked = tensors["mask"] == 0
    assert torch.equal(grad[masked].double(), torch.zeros(int(masked.sum()),
                                                          dtype=torch.float64))


@st.composite
def linear_loss_calls(draw):
    batch, length = draw(st.sampled_from([(0, 3), (1, 1), (2, 3), (3, 4)]))
    head = draw(head_calls(rows=(batch * length,)))
    options = draw(loss_options())
    _, tensors = draw(loss_inputs(options, batch, length))
    return head, tensors, options


@FUZZ
@given(call=linear_loss_calls(), entropy_coef=st.sampled_from([0.0, 0.01]))
def test_linear_policy_loss_against_float64(call, entropy_coef):
    (hidden, weight, bias, tokens, temperature, head), tensors, options = call
    batch, length = tensors["old_logp"].shape
    spec = specs()["linear_policy_loss"]
    leaves = [None if t is None else t.detach().clone().requires_grad_(True)
              for t in (hidden, weight, bias)]
    temp = temperature if not isinstance(temperature, torch.Tensor) or temperature.dim() == 0 \
        else temperature.reshape(batch, length)
    shaped = tokens.reshape(batch, length)
    before = _snapshot(hidden=hidden, weight=weight, tokens=tokens, **tensors)
    loss, metrics = rlk.linear_policy_loss(
        leaves[0].reshape(batch, length, hidden.shape[-1]), leaves[1], shaped, bias=leaves[2],
        temperature=temp, entropy_coef=entropy_coef, options=options, **head, **tensors)
    _unchanged(before, hidden=leaves[0], weight=leaves[1], tokens=tokens, **tensors)
    want_loss, want_metrics, want_logp = linear_policy_loss_reference.linear_policy_loss(
        hidden, weight, tokens, bias=bias, temperature=_per_row(temperature, (batch * length,)),
        entropy_coef=entropy_coef, options=options, **head, **tensors)
    assert_matches("loss", loss, want_loss, spec.tolerances[hidden.dtype])
    got_metrics = torch.stack([metrics[name] for name in (*METRICS, "entropy")])
    assert_matches("metrics", got_metrics, want_metrics, spec.tolerances[hidden.dtype])
    assert_matches("logp", metrics["logp"].reshape(-1), want_logp.reshape(-1),
                   spec.tolerances[hidden.dtype])
    wanted = [leaf for leaf in leaves if leaf is not None]
    got_grads = torch.autograd.grad(loss, wanted)
    truths = [t.detach().double().requires_grad_(True) for t in (hidden, weight, bias)
              if t is not None]
    truth_loss, _, _ = linear_policy_loss_reference.linear_policy_loss(
        truths[0], truths[1], tokens, bias=truths[2] if bias is not None else None,
        temperature=_per_row(temperature, (batch * length,)), entropy_coef=entropy_coef,
        options=options, **head, **tensors)
    expected = [torch.zeros_like(t) for t in truths]
    if truth_loss.requires_grad:
        expected = list(torch.autograd.grad(truth_loss, truths, allow_unused=True,
                                            materialize_grads=True))
    assert spec.grad_tolerances is not None
    for name, actual, truth in zip(("grad_hidden", "grad_weight", "grad_bias"), got_grads,
                                   expected, strict=False):
        assert_matches(name, actual, truth, spec.grad_tolerances[hidden.dtype])


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
    options = GroupAdvantagesOptions(
        normalize=draw(st.sampled_from(["std", "batch-std", "none"])),
        baseline=draw(st.sampled_from(["mean", "loo"])),
        eps=draw(st.sampled_from([0.0, 1e-6, 1e-4])),
        nan=draw(st.sampled_from(["propagate", "ignore"])),
        singleton=draw(st.sampled_from(["zero", "reward"])))
    if count and draw(st.booleans()):
        rewards[draw(st.integers(0, count - 1))] = float("nan")
    labels = draw(st.sampled_from(["size", "tensor", "strings"]))
    ids = torch.arange(count) // size
    if labels != "size":
        ids = torch.randperm(count, generator=gen) % max(groups, 1)
    return rewards, ids, labels, size, options


@FUZZ
@given(call=advantage_calls())
def test_group_advantages_against_float64(call):
    rewards, ids, labels, size, options = call
    if labels == "size":
        grouping: dict[str, Any] = {"group_size": size}
    elif labels == "tensor":
        grouping = {"group_ids": ids * 7 - 3}  # any integer labels
    else:
        grouping = {"group_ids": [f"uid-{int(i)}" for i in ids]}
    before = _snapshot(rewards=rewards, ids=ids)
    got = rlk.group_advantages(rewards, options=options, **grouping)
    _unchanged(before, rewards=rewards, ids=ids)
    want = group_advantages_reference.group_advantages(rewards, ids, options=options)
    assert_matches("advantages", got, want,
                   specs()["group_advantages"].tolerances[torch.float32])


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
    options = {"temperature": draw(st.sampled_from([0.0, 2.0**-126, 2.0**-100, 0.3, 1.0, 1.7])),
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
    _unchanged(before, logits=logits, seed=seed)
    truth = sample_reference.sample_log_probs(logits, **options)
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
