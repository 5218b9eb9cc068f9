"""rlk.linear_policy_loss: equal to the unfused ops, every path, masks, dtypes, errors, compile."""

from __future__ import annotations

import pytest
import torch

import rlk
from rlk.ops.linear_logp import reference as linear_logp_reference
from rlk.ops.linear_policy_loss import reference
from rlk.ops.policy_loss import reference as policy_loss_reference

GEN = torch.Generator().manual_seed(16)


def _data(batch=3, length=6, width=16, vocab=50, dtype=torch.float32, per_token=False):
    hidden = torch.randn(batch, length, width, generator=GEN).to(dtype)
    weight = (torch.randn(vocab, width, generator=GEN) * 2 / width**0.5).to(dtype)
    tokens = torch.randint(0, vocab, (batch, length), generator=GEN)
    logp = linear_logp_reference.linear_logp_entropy(hidden.reshape(-1, width), weight,
                                         tokens.reshape(-1))[0].view(batch, length)
    old = (logp + torch.randn(batch, length, generator=GEN) * 0.2).float()
    adv_shape = (batch, length) if per_token else (batch,)
    mask = (torch.rand(batch, length, generator=GEN) > 0.2).float()
    mask[:1] = 1.0
    return {
        "hidden": hidden, "weight": weight, "tokens": tokens, "old_logp": old,
        "advantages": torch.randn(*adv_shape, generator=GEN), "mask": mask,
        "ref_logp": old + torch.randn(batch, length, generator=GEN) * 0.3,
        "rollout_logp": old + torch.randn(batch, length, generator=GEN) * 0.3,
    }


def _close(actual, expected, atol=2e-5, rtol=2e-5):
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol,
                               equal_nan=True)


OPTION_SETS = {
    "ppo": {},
    "kl-k3-seq-mean": {"kl_coef": 0.1, "agg": "seq-mean-token-mean", "use_ref": True},
    "gspo": {"ratio_level": "sequence", "clip_low": 0.03, "clip_high": 0.04,
             "agg": "seq-mean-token-mean"},
    "tis-k2": {"tis_cap": 1.5, "kl_coef": 0.05, "kl_estimator": "k2", "use_ref": True,
               "use_rollout": True, "agg": "seq-mean-token-sum"},
    "dual-clip-dr-grpo": {"dual_clip": 2.0, "clip_low": 0.1, "agg": "seq-mean-token-sum-norm"},
    "cispo-k3+-divisor": {"objective": "cispo", "clip_high": 4.0, "kl_coef": 0.05,
                          "kl_estimator": "k3+", "use_ref": True, "divisor": 40.0},
    "sapo-bias-corrected-kl": {"objective": "sapo", "kl_coef": 0.05, "kl_bias_correction": True,
                               "use_ref": True, "agg": "seq-mean-token-mean",
                               "count_empty_rows": True},
    "vespo-is": {"objective": "vespo", "use_rollout": True, "use_weights": True},
    "gspo-token-scale": {"ratio_level": "sequence-token", "clip_low": 0.03, "clip_high": 0.04,
                         "scale": 0.5, "agg": "token-sum", "ratio_cap": 3.0},
}


def _options(name, data):
    options = dict(OPTION_SETS[name])
    if options.pop("use_ref", False):
        options["ref_logp"] = data["ref_logp"]
    if options.pop("use_rollout", False):
        options["rollout_logp"] = data["rollout_logp"]
    if options.pop("use_weights", False):
        options["importance_weights"] = torch.rand(data["mask"].shape[0], 1, generator=GEN) + 0.5
    return options


def _reference_options(options):
    """Reference keywords: the policy tensors as given, the settings as PolicyLossOptions."""
    tensors = {k: v for k, v in options.items() if isinstance(v, torch.Tensor)}
    settings = {k: v for k, v in options.items() if k not in tensors}
    return dict(tensors, options=rlk.PolicyLossOptions(**settings))


def _unfused(data, options, hidden, weight, entropy_coef=0.0):
    logp, entropy = rlk.linear_logp_entropy(hidden, weight, data["tokens"])
    loss, metrics = rlk.policy_loss(logp, data["old_logp"], data["advantages"], data["mask"],
                                    **options)
    if entropy_coef:
        loss = loss - entropy_coef * policy_loss_reference.aggregate(
            entropy, data["mask"] != 0, rlk.PolicyLossOptions(agg=options.get("agg",
                                                                               "token-mean")))
    return loss, metrics, logp


def _leaves(*tensors):
    return [t.clone().requires_grad_(True) for t in tensors]


@pytest.mark.parametrize("name", list(OPTION_SETS))
@pytest.mark.parametrize("per_token", [False, True])
def test_equals_linear_logp_then_policy_loss(name, per_token):
    data = _data(per_token=per_token)
    options = _options(name, data)
    h, w = _leaves(data["hidden"], data["weight"])
    loss, metrics = rlk.linear_policy_loss(h, w, data["tokens"], data["old_logp"],
                                           data["advantages"], data["mask"], **options)
    loss.backward()
    h2, w2 = _leaves(data["hidden"], data["weight"])
    want_loss, want_metrics, want_logp = _unfused(data, options, h2, w2)
    want_loss.backward()
    _close(loss, want_loss, atol=1e-6, rtol=1e-5)
    for key, value in want_metrics.items():
        _close(metrics[key], value, atol=1e-6)
    _close(metrics["logp"], want_logp * data["mask"])
    _close(h.grad, h2.grad, atol=1e-6, rtol=1e-4)
    _close(w.grad, w2.grad, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize(("chunk_mb", "length", "name", "path"), [
    (None, 6, "ppo", "tokens"),  # token-level: chunks across sequences
    ("0.005", 6, "gspo", "sequences"),  # 7 rows per chunk: one 6-token sequence each
    ("0.005", 20, "ppo", "tokens"),  # 7-row chunks inside 20-token sequences
    ("0.005", 20, "gspo", "two-pass"),
    ("0.005", 20, "vespo-is", "two-pass"),
])
@pytest.mark.parametrize("cap", [{}, {"softcap": 3.0}, {"softcap": 2.0, "logit_scale": 0.6}])
@pytest.mark.parametrize("grad", [True, False])
def test_every_path_matches_the_reference_and_explain_names_it(chunk_mb, length, name, path,
                                                                cap, grad, monkeypatch):
    """Each path, with and without a soft cap, with gradients and under no_grad (where every
    path takes the two-pass forward), against float64."""
    if chunk_mb is not None:
        monkeypatch.setenv("RLK_NATIVE_CHUNK_MB", chunk_mb)
    data = _data(batch=4, length=length, vocab=30)
    data["hidden"] = data["hidden"] * 3.0  # logits of a few units: the soft cap bends them
    options = _options(name, data)
    args = (data["tokens"], data["old_logp"], data["advantages"], data["mask"])
    selection = rlk.explain("linear_policy_loss", data["hidden"], data["weight"], *args,
                            entropy_coef=0.02, **cap, **options)
    assert selection.backend == "native" and selection.plan.startswith(f"{path}:")
    h, w, b = _leaves(data["hidden"], data["weight"], torch.randn(30, generator=GEN))
    with torch.set_grad_enabled(grad):
        loss, metrics = rlk.linear_policy_loss(h, w, *args, bias=b, entropy_coef=0.02,
                                               temperature=0.8, **cap, **options)
    leaves = [t.detach().double().requires_grad_(True) for t in (h, w, b)]
    want = reference.linear_policy_loss(
        leaves[0].reshape(-1, 16), leaves[1], data["tokens"].reshape(-1), bias=leaves[2],
        old_logp=data["old_logp"], advantages=data["advantages"], mask=data["mask"],
        temperature=0.8, entropy_coef=0.02, **cap, **_reference_options(options))
    _close(loss, want[0], atol=1e-6, rtol=1e-5)
    _close(metrics["entropy"], want[1][-1])
    _close(metrics["logp"].reshape(-1), want[2])
    if not grad:
        return
    loss.backward()
    want[0].backward()
    for leaf, expected in zip((h, w, b), leaves, strict=True):
        _close(leaf.grad, expected.grad, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize(("chunk_mb", "name"), [
    (None, "ppo"), ("0.005", "gspo"), ("0.001", "gspo")])  # tokens, sequences, two-pass
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_masked_and_ignored_positions_give_nothing(chunk_mb, name, softcap, monkeypatch):
    """Garbage tokens and NaN hidden states at masked or ignored positions change nothing,
    on every path, with or without a soft cap (issue #31 S2: the cap's slope brought the
    NaN back)."""
    if chunk_mb is not None:
        monkeypatch.setenv("RLK_NATIVE_CHUNK_MB", chunk_mb)
    data = _data()
    options = _options(name, data)
    data["mask"][1, 2] = 0.0
    tokens = data["tokens"].clone()
    tokens[1, 2] = 10_000  # out of range, but masked
    tokens[2, 4] = -100  # ignored: counts as masked
    hidden = data["hidden"].clone()
    hidden[1, 2] = hidden[2, 4] = float("nan")
    h, w = _leaves(hidden, data["weight"])
    loss, metrics = rlk.linear_policy_loss(h, w, tokens, data["old_logp"], data["advantages"],
                                           data["mask"], softcap=softcap, **options)
    loss.backward()
    clean = data["hidden"].clone()
    clean[1, 2] = clean[2, 4] = 0.0
    mask = data["mask"].clone()
    mask[2, 4] = 0.0
    leaves = [t.double().requires_grad_(True) for t in (clean.reshape(-1, 16), data["weight"])]
    want = reference.linear_policy_loss(
        *leaves, tokens.clamp(0, 49).reshape(-1), old_logp=data["old_logp"],
        advantages=data["advantages"], mask=mask, softcap=softcap,
        **_reference_options(options))
    want[0].backward()
    _close(loss, want[0], atol=1e-6)
    assert metrics["logp"][1, 2] == 0 and metrics["logp"][2, 4] == 0
    _close(h.grad.reshape(-1, 16), leaves[0].grad, atol=1e-6, rtol=1e-4)
    _close(w.grad, leaves[1].grad, atol=1e-6, rtol=1e-4)


def test_flat_hidden_and_upstream_gradient_scale():
    data = _data()
    h, w = _leaves(data["hidden"].reshape(-1, 16), data["weight"])
    args = (data["tokens"].reshape(-1), data["old_logp"], data["advantages"], data["mask"])
    loss, _ = rlk.linear_policy_loss(h, w, *args)
    (loss * 3.0).backward()
    h2, w2 = _leaves(data["hidden"], data["weight"])
    want, _, _ = _unfused(data, {}, h2, w2)
    (want * 3.0).backward()
    _close(h.grad.view(3, 6, 16), h2.grad, atol=1e-6, rtol=1e-4)
    _close(w.grad, w2.grad, atol=1e-6, rtol=1e-4)


def test_a_kernels_scale_grads_scales_the_eager_backward(monkeypatch):
    """A kernel's optional forward.scale_grads gets the wanted gradients and the upstream
    gradient; an error there names the backend."""
    from rlk.ops.linear_policy_loss import native

    seen = []

    def scale_grads(grads, grad_loss):
        seen.append((len(grads), float(grad_loss)))
        for grad in grads:
            grad.mul_(grad_loss)

    monkeypatch.setattr(native.forward, "scale_grads", scale_grads, raising=False)
    data = _data()
    h, w = _leaves(data["hidden"], data["weight"])
    args = (data["tokens"], data["old_logp"], data["advantages"], data["mask"])
    loss, _ = rlk.linear_policy_loss(h, w.detach(), *args)
    (loss * 3.0).backward()
    assert seen == [(1, 3.0)]  # the weight needs no gradient here
    h2, w2 = _leaves(data["hidden"], data["weight"])
    want, _, _ = _unfused(data, {}, h2, w2)
    (want * 3.0).backward()
    _close(h.grad, h2.grad, atol=1e-6, rtol=1e-4)

    def broken(grads, grad_loss):
        raise RuntimeError("scale failed")

    monkeypatch.setattr(native.forward, "scale_grads", broken)
    loss, _ = rlk.linear_policy_loss(*_leaves(data["hidden"], data["weight"]), *args)
    with pytest.raises(RuntimeError, match="scale failed") as info:
        loss.backward()
    assert "forward.scale_grads" in "".join(getattr(info.value, "__notes__", []))


def test_without_gradients_it_runs_the_forward_only(monkeypatch):
    """Under no_grad nothing asks for gradients: the op returns the same loss and no grads."""
    data = _data()
    args = (data["hidden"], data["weight"], data["tokens"], data["old_logp"],
            data["advantages"], data["mask"])
    from rlk.ops.linear_policy_loss import loop as native

    seen = []
    monkeypatch.setattr(native.LossGrads, "__call__",
                        lambda *a, **k: seen.append(1) or pytest.fail("gradient work"))
    with torch.no_grad():
        loss, metrics = rlk.linear_policy_loss(*args, kl_coef=0.0)
    want, _, logp = _unfused(data, {}, data["hidden"], data["weight"])
    _close(loss, want, atol=1e-6)
    _close(metrics["logp"], logp * data["mask"])
    assert not seen


def test_autocast_bfloat16_hidden_with_float32_weight():
    data = _data(dtype=torch.float32)
    h = data["hidden"].to(torch.bfloat16).requires_grad_(True)
    w = data["weight"].clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = rlk.linear_policy_loss(h, w, data["tokens"], data["old_logp"],
                                         data["advantages"], data["mask"])
    loss.backward()
    assert w.grad.dtype == torch.float32 and h.grad.dtype == torch.bfloat16
    leaves = [h.detach().double().requires_grad_(True),
              data["weight"].to(torch.bfloat16).double().requires_grad_(True)]
    want = reference.linear_policy_loss(
        leaves[0].reshape(-1, 16), leaves[1], data["tokens"].reshape(-1),
        old_logp=data["old_logp"], advantages=data["advantages"], mask=data["mask"])
    _close(loss, want[0], atol=1e-6, rtol=1e-5)  # float32 logits of the bf16 operands
    want_grads = torch.autograd.grad(want[0], leaves)
    # the float32 weight's gradient stays float32; the bf16 hidden's is rounded once
    _close(w.grad, want_grads[1], atol=1e-6, rtol=1e-5)
    _close(h.grad, want_grads[0], atol=1e-6, rtol=2.0**-8)


def test_softcap_and_logit_scale():
    data = _data()
    h, w = _leaves(data["hidden"], data["weight"])
    options = {"softcap": 1.2, "logit_scale": 0.7}
    loss, _ = rlk.linear_policy_loss(h, w, data["tokens"], data["old_logp"], data["advantages"],
                                     data["mask"], entropy_coef=0.1, **options)
    loss.backward()
    leaves = [t.detach().double().requires_grad_(True) for t in (h, w)]
    want = reference.linear_policy_loss(
        leaves[0].reshape(-1, 16), leaves[1], data["tokens"].reshape(-1),
        old_logp=data["old_logp"], advantages=data["advantages"], mask=data["mask"],
        entropy_coef=0.1, **options)
    want[0].backward()
    _close(loss, want[0], atol=1e-6, rtol=1e-5)
    _close(h.grad, leaves[0].grad, atol=1e-6, rtol=1e-4)
    _close(w.grad, leaves[1].grad, atol=1e-6, rtol=1e-4)


def test_empty_batch():
    data = _data(batch=0)
    h, w = _leaves(data["hidden"], data["weight"])
    loss, metrics = rlk.linear_policy_loss(h, w, data["tokens"], data["old_logp"],
                                           data["advantages"], data["mask"])
    loss.backward()
    assert loss == 0 and metrics["logp"].shape == (0, 6)
    assert h.grad.shape == (0, 6, 16) and torch.equal(w.grad, torch.zeros_like(w))


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"old_logp": torch.zeros(18)}, ValueError, r"old_logp must be \[B, T\]"),
    ({"old_logp": torch.zeros(2, 9)}, ValueError, r"hidden must be \[B, T, H\]"),
    ({"tokens": torch.zeros(2, 9, dtype=torch.int64)}, ValueError, "tokens must have shape"),
    ({"entropy_coef": -0.1}, ValueError, "entropy_coef must be finite and >= 0"),
    ({"clip_lo": 0.1}, TypeError, "did you mean .clip_low."),
    ({"kl_coef": 0.1}, ValueError, "needs ref_logp"),
    ({"softcap": -1.0}, ValueError, "softcap must be finite and > 0"),
])
def test_bad_inputs_raise_before_any_kernel(change, error, message):
    data = _data()
    kwargs = {k: data[k] for k in ("hidden", "weight", "tokens", "old_logp", "advantages",
                                   "mask")}
    kwargs.update(change)
    with pytest.raises(error, match=message):
        rlk.linear_policy_loss(**kwargs)


def test_torch_compile_fullgraph_forward_and_backward():
    data = _data()

    def step(h, w):
        loss, metrics = rlk.linear_policy_loss(h, w, data["tokens"], data["old_logp"],
                                               data["advantages"], data["mask"],
                                               ref_logp=data["ref_logp"], kl_coef=0.05,
                                               entropy_coef=0.01)
        return loss * 2.0, metrics["logp"]

    eager_leaves, compiled_leaves = (_leaves(data["hidden"], data["weight"]) for _ in range(2))
    eager_loss, eager_logp = step(*eager_leaves)
    eager_loss.backward()
    compiled_loss, compiled_logp = torch.compile(step, fullgraph=True)(*compiled_leaves)
    compiled_loss.backward()
    _close(compiled_loss, eager_loss, atol=1e-6, rtol=1e-6)
    _close(compiled_logp, eager_logp, atol=1e-6, rtol=1e-6)
    for eager_leaf, compiled_leaf in zip(eager_leaves, compiled_leaves, strict=True):
        _close(compiled_leaf.grad, eager_leaf.grad, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("settings", [
    {"agg": "seq-mean-token-mean", "count_empty_rows": True},
    {"agg": "token-sum", "scale": 0.25},
    {"agg": "seq-mean-token-sum", "divisor": 7.0},
    {"agg": "seq-mean-token-sum-norm"},
])
def test_entropy_bonus_is_aggregated_as_the_loss(settings):
    data = _data()
    data["mask"][2] = 0.0  # an empty sequence
    h, w = _leaves(data["hidden"], data["weight"])
    loss, metrics = rlk.linear_policy_loss(h, w, data["tokens"], data["old_logp"],
                                           data["advantages"], data["mask"], entropy_coef=0.3,
                                           **settings)
    loss.backward()
    leaves = [t.detach().double().requires_grad_(True) for t in (h, w)]
    want = reference.linear_policy_loss(
        leaves[0].reshape(-1, 16), leaves[1], data["tokens"].reshape(-1),
        old_logp=data["old_logp"], advantages=data["advantages"], mask=data["mask"],
        entropy_coef=0.3, options=rlk.PolicyLossOptions(**settings))
    want[0].backward()
    _close(loss, want[0], atol=1e-6, rtol=1e-5)
    _close(metrics["entropy"], want[1][-1])
    _close(h.grad, leaves[0].grad, atol=1e-6, rtol=1e-4)
    _close(w.grad, leaves[1].grad, atol=1e-6, rtol=1e-4)


def test_a_second_backward_of_one_call_raises():
    """Eagerly the gradients are scaled in place (no copy of the weight's gradient)."""
    data = _data()
    h, w = _leaves(data["hidden"], data["weight"])
    loss, _ = rlk.linear_policy_loss(h, w, data["tokens"], data["old_logp"],
                                     data["advantages"], data["mask"])
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward runs once"):
        loss.backward()


@pytest.mark.parametrize("name", ["ppo", "tis-k2", "cispo-k3+-divisor", "dual-clip-dr-grpo"])
def test_whole_batch_and_per_token_gradients_agree_on_a_chunk(name):
    """GPU backends take the whole-batch kernel per chunk; native the per-token functions."""
    from rlk.ops.linear_policy_loss.loop import LossGrads
    from rlk.ops.policy_loss.op import POLICY_LOSS

    data = _data()
    options = _options(name, data)
    policy = POLICY_LOSS.prepare(data["old_logp"], data["old_logp"], data["advantages"],
                                 data["mask"], **options)
    del policy["logp"]
    logp = torch.zeros(18)
    logp[4:11] = data["old_logp"].reshape(-1)[4:11] + 0.3  # the chunk's rows; the rest unknown
    per_token = LossGrads(policy, 0.1)(logp, 4, 11)
    whole = LossGrads(policy, 0.1, whole_batch=True)(logp, 4, 11)
    for a, b in zip(per_token, whole, strict=True):
        _close(a, b, atol=1e-7, rtol=1e-6)


def test_float16_gradients_beyond_its_range_are_inf_exactly_where_float64_is():
    """Issue #31 F4, the documented contract: gradients come back in the inputs' dtype and
    overflow as a cast from float64 would (torch's behaviour, which GradScaler detects):
    +-inf exactly where the float64 gradient rounds past float16's largest value, the
    float64 values elsewhere. A k3 KL with ref_logp 9 and 13 nats above logp does that."""
    gen = torch.Generator().manual_seed(5)
    batch, length, width, vocab = 2, 4, 8, 20
    hidden = torch.randn(batch, length, width, generator=gen).half()
    weight = torch.randn(vocab, width, generator=gen).half()
    tokens = torch.randint(0, vocab, (batch, length), generator=gen)
    logp = linear_logp_reference.linear_logp_entropy(
        hidden.reshape(-1, width), weight, tokens.reshape(-1))[0].view(batch, length).float()
    ref = logp.clone()
    ref[0, 1] += 13.0
    ref[1, 2] += 9.0
    options = {"ref_logp": ref, "kl_coef": 1.0, "kl_estimator": "k3"}
    advantages, mask = torch.randn(batch, generator=gen), torch.ones(batch, length)
    h, w = _leaves(hidden, weight)
    rlk.linear_policy_loss(h, w, tokens, logp, advantages, mask, **options)[0].backward()
    leaves = [hidden.reshape(-1, width).double().requires_grad_(True),
              weight.double().requires_grad_(True)]
    want = reference.linear_policy_loss(*leaves, tokens.reshape(-1), old_logp=logp,
                                        advantages=advantages, mask=mask,
                                        **_reference_options(options))
    want[0].backward()
    limit = torch.finfo(torch.float16).max
    for got, expected in ((h.grad.reshape(-1, width), leaves[0].grad), (w.grad, leaves[1].grad)):
        assert got.dtype == torch.float16
        over = expected.half().isinf()
        assert over.any()  # the case is what it claims
        # no float64 value so near the overflow threshold that float32's error decides it
        assert not ((expected.abs() > 0.99 * limit) & (expected.abs() < 1.01 * limit)).any()
        assert torch.equal(got.isinf(), over) and not got.isnan().any()
        assert torch.equal(got[over].sign(), expected[over].sign().half())
        _close(got[~over], expected[~over], atol=3e-4, rtol=5e-3)

