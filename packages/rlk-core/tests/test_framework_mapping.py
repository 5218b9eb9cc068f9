"""The mapping tables of docs/ops/policy_loss.md and group_advantages.md, checked.

Each TRL 1.16 loss_type and each verl 0.9.1 policy loss / loss_agg_mode / kl_loss_type /
advantage estimator is restated here from its source, as plain torch (float64, autograd),
and compared with the rlk configuration the docs give for it. (The integrations room runs
the real frameworks; this file keeps the table honest without them.)
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pytest
import torch

import rlk

GEN = torch.Generator().manual_seed(23)
B, T = 6, 9
GA, PROCESSES, STEPS_PER_GENERATION = 2, 1, 2
F64 = torch.float64


def _batch() -> dict[str, torch.Tensor]:
    logp = -torch.rand(B, T, generator=GEN, dtype=F64) * 3
    old = logp + torch.randn(B, T, generator=GEN, dtype=F64) * 0.3
    mask = (torch.rand(B, T, generator=GEN) > 0.3).to(torch.int64)
    mask[:, 0] = 1
    mask[4] = 0  # a fully masked row (e.g. TRL's mask_truncated_completions)
    # TRL's importance_sampling_ratio is exp((old - sampling) * mask): 1 at masked tokens
    is_ratio = torch.where(mask != 0, torch.rand(B, T, generator=GEN, dtype=F64) + 0.5, 1.0)
    return {"logp": logp, "old": old, "mask": mask,
            "adv": torch.randn(B, 1, generator=GEN, dtype=F64),
            "ref": logp + torch.randn(B, T, generator=GEN, dtype=F64) * 0.2,
            "is_ratio": is_ratio}


# ---------------------------------------------------------------------------
# TRL 1.16 GRPOTrainer._compute_loss, restated


def _trl_loss(x: dict[str, torch.Tensor], logp: torch.Tensor, loss_type: str, *, beta: float,
              bias_correction: bool, level: str, eps_low: float = 0.2, eps_high: float = 0.28,
              delta: float | None = None, num_items: float = 0.0,
              max_completion_length: int = 12) -> torch.Tensor:
    mask = x["mask"].to(F64)
    adv, is_ratio = x["adv"], x["is_ratio"]
    log_ratio = logp - x["old"]
    if level == "sequence":
        log_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        log_weights = log_ratio
    coef_1 = torch.exp(log_weights)
    kl = torch.exp(x["ref"] - logp) - (x["ref"] - logp) - 1
    if bias_correction:
        kl = kl * coef_1
    if loss_type == "cispo":
        per_token = -torch.clamp(coef_1, max=eps_high).detach() * adv * logp
    elif loss_type == "sapo":
        tau = torch.where(adv > 0, 1.0, 1.05).to(F64)
        per_token = -torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau * adv
    elif loss_type == "vespo":
        with torch.no_grad():
            total = (torch.clamp(log_ratio, -20, 20) * mask).sum(-1, keepdim=True)
            total = total + torch.clamp(torch.log(is_ratio), math.log(1e-8), 20).sum(
                -1, keepdim=True)
            log_w = torch.clamp(total, math.log(1e-8), 20)
            k = torch.where(adv >= 0, 2.0, 3.0).to(F64)
            lam = torch.where(adv >= 0, 3.0, 2.0).to(F64)
            phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(0, 0, 0)
        per_token = -phi * adv * logp
    else:
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        capped = coef_1 if delta is None else torch.clamp(coef_1, max=delta)
        per_token = -torch.min(capped * adv, coef_2 * adv)
    if loss_type != "vespo":
        per_token = per_token * is_ratio
    per_token = per_token + beta * kl
    if loss_type in ("grpo", "sapo"):
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / GA
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0) / GA
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * max_completion_length) / GA
    if loss_type == "luspo":
        return (per_token * mask).sum(-1).mean() / GA
    normalizer = num_items / PROCESSES * GA / STEPS_PER_GENERATION  # dapo, cispo, vespo
    return (per_token * mask).sum() / normalizer


def _trl_settings(loss_type: str, *, beta: float, bias_correction: bool, level: str,
                  delta: float | None, num_items: float, eps_high: float) -> dict[str, Any]:
    """The docs' table: TRL option -> rlk setting."""
    settings: dict[str, Any] = {"kl_coef": beta, "kl_estimator": "k3",
                                "kl_bias_correction": bias_correction, "ratio_level": level,
                                "clip_low": 0.2, "clip_high": eps_high, "ratio_cap": delta}
    global_tokens = num_items / PROCESSES * GA / STEPS_PER_GENERATION
    per_row = {"count_empty_rows": True, "scale": 1 / GA}
    settings.update({
        "grpo": {"agg": "seq-mean-token-mean", **per_row},
        "sapo": {"objective": "sapo", "agg": "seq-mean-token-mean", **per_row},
        "bnpo": {"agg": "token-mean", "scale": 1 / GA},
        "dr_grpo": {"agg": "token-sum", "divisor": B * 12.0, "scale": 1 / GA},
        "luspo": {"agg": "seq-mean-token-sum", **per_row},
        "dapo": {"agg": "token-sum", "divisor": global_tokens},
        # CISPO's epsilon_high is the ratio's maximum, and it clips from above only
        "cispo": {"objective": "cispo", "clip_low": 1.0, "clip_high": eps_high - 1.0,
                  "agg": "token-sum", "divisor": global_tokens},
        "vespo": {"objective": "vespo", "agg": "token-sum", "divisor": global_tokens},
    }[loss_type])
    return settings


TRL_CASES = [
    (loss_type, beta, bias, level, delta)
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")
    for beta, bias in ((0.0, False), (0.04, True), (0.04, False))
    for level in (("token",) if loss_type == "vespo" else ("token", "sequence"))
    for delta in ((None, 1.5) if loss_type in ("grpo", "dapo") else (None,))
]


@pytest.mark.parametrize(("loss_type", "beta", "bias", "level", "delta"), TRL_CASES)
def test_every_trl_loss_type_is_one_configuration(loss_type, beta, bias, level, delta):
    x = _batch()
    if loss_type == "cispo":
        x["old"] = x["logp"] + torch.randn(B, T, generator=GEN, dtype=F64) * 0.05
    num_items = float(x["mask"].sum()) * STEPS_PER_GENERATION / GA * 1.5
    leaf = x["logp"].clone().requires_grad_(True)
    eps_high = 0.28 if loss_type != "cispo" else 1.05  # CISPO's ratio maximum
    want = _trl_loss(x, leaf, loss_type, beta=beta, bias_correction=bias, level=level,
                     delta=delta, num_items=num_items, eps_high=eps_high)
    (want_grad,) = torch.autograd.grad(want, leaf)
    settings = _trl_settings(loss_type, beta=beta, bias_correction=bias, level=level,
                             delta=delta, num_items=num_items, eps_high=eps_high)
    got_leaf = x["logp"].float().requires_grad_(True)
    got, _ = rlk.policy_loss(got_leaf, x["old"], x["adv"], x["mask"], ref_logp=x["ref"],
                             importance_weights=x["is_ratio"], **settings)
    got.backward()
    torch.testing.assert_close(got.double(), want.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_leaf.grad.double(), want_grad, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------
# verl 0.9.1 core_algos, restated


def _verl_agg(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, *, dp_size: int = 1,
              batch_num_tokens: float | None = None, global_batch_size: float | None = None,
              loss_scale_factor: float | None = None) -> torch.Tensor:
    if mode == "token-mean":
        tokens = mask.sum() if batch_num_tokens is None else batch_num_tokens
        return (loss_mat * mask).sum() / tokens * dp_size
    if mode == "token-sum":
        return (loss_mat * mask).sum() * dp_size
    if mode == "seq-mean-token-mean":
        lengths = mask.sum(-1)
        seq = (loss_mat * mask).sum(-1) / (lengths + 1e-8)
        seq_mask = (lengths > 0).to(F64)
        size = seq_mask.sum() if global_batch_size is None else global_batch_size
        return (seq * seq_mask).sum() / size * dp_size
    seq = (loss_mat * mask).sum(-1)
    seq_mask = (mask.sum(-1) > 0).to(F64)
    size = seq_mask.sum() if global_batch_size is None else global_batch_size
    loss = (seq * seq_mask).sum() / size * dp_size
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss


def _verl_kl(logp: torch.Tensor, ref: torch.Tensor, kind: str) -> torch.Tensor:
    base = kind[:-1] if kind.endswith("+") else kind
    if base in ("kl", "k1"):
        value = logp - ref
    elif base == "abs":
        value = (logp - ref).abs()
    elif base in ("mse", "k2"):
        value = 0.5 * (logp - ref).square()
    else:  # low_var_kl, k3
        kl = torch.clamp(ref - logp, min=-20, max=20)
        value = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    if not kind.endswith("+") or kind in ("mse", "k2"):
        return value
    square = 0.5 * (logp - ref).square()
    return square - square.detach() + value.detach()


def _verl_policy(x: dict[str, torch.Tensor], logp: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-token policy loss of verl's vanilla / gspo / sapo / cispo, with rollout weights."""
    adv, old = x["adv"], x["old"]
    low, high = 0.2, 0.28
    log_ratio = logp - old
    if mode == "gspo":
        mask = x["mask"].to(F64)
        seq = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        log_seq = torch.clamp(logp - logp.detach() + seq.detach().unsqueeze(-1), max=10.0)
        ratio = torch.exp(log_seq)
        losses = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high))
    else:
        ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
        if mode == "vanilla":
            losses1 = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high))
            losses = torch.where(adv < 0, torch.min(-adv * 3.0, losses1), losses1)
        elif mode == "sapo":
            tau = torch.where(adv > 0, 1.0, 1.05).to(F64)
            losses = -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv
        else:  # cispo
            losses = -torch.clamp(ratio, 1 - low, 1 + high).detach() * adv * logp
    return losses * x["is_ratio"]


VERL_POLICY = {
    "vanilla": {"dual_clip": 3.0, "log_ratio_min": -20.0, "log_ratio_max": 20.0},
    "gspo": {"ratio_level": "sequence-token", "log_ratio_max": 10.0},
    "sapo": {"objective": "sapo", "log_ratio_min": -20.0, "log_ratio_max": 20.0},
    "cispo": {"objective": "cispo", "log_ratio_min": -20.0, "log_ratio_max": 20.0},
}
VERL_KL = {"kl": ("k1", None), "abs": ("abs", None), "mse": ("k2", None),
           "low_var_kl": ("k3", 10.0), "k1+": ("k1+", None), "abs+": ("abs+", None),
           "k3+": ("k3+", 10.0)}
VERL_AGG = {  # name -> (verl global batch info, rlk settings)
    "token-mean": ({}, {"agg": "token-mean"}),
    "token-mean-global": ({"dp_size": 2, "batch_num_tokens": 80.0},
                          {"agg": "token-mean", "divisor": 80.0, "scale": 2.0}),
    "token-sum": ({"dp_size": 2}, {"agg": "token-sum", "scale": 2.0}),
    "seq-mean-token-mean": ({}, {"agg": "seq-mean-token-mean"}),
    "seq-mean-token-mean-global": ({"dp_size": 4, "global_batch_size": 16.0},
                                   {"agg": "seq-mean-token-mean", "divisor": 16.0,
                                    "scale": 4.0}),
    "seq-mean-token-sum": ({}, {"agg": "seq-mean-token-sum"}),
    "seq-mean-token-sum-norm": ({}, {"agg": "seq-mean-token-sum-norm"}),
    "seq-mean-token-sum-norm-factor": ({"loss_scale_factor": 4096.0},
                                       {"agg": "seq-mean-token-sum", "scale": 1 / 4096}),
    "seq-mean-token-sum-norm-global": ({"global_batch_size": 16.0, "loss_scale_factor": 4096.0},
                                       {"agg": "seq-mean-token-sum-norm",
                                        "divisor": 16.0 * 4096}),
}


@pytest.mark.parametrize("policy", sorted(VERL_POLICY))
@pytest.mark.parametrize("agg", sorted(VERL_AGG))
def test_every_verl_policy_loss_and_loss_agg_mode_is_one_configuration(policy, agg):
    x = _batch()
    info, agg_settings = VERL_AGG[agg]
    mode = agg.split("-global")[0].split("-factor")[0]
    leaf = x["logp"].clone().requires_grad_(True)
    if policy == "sapo":  # verl's SAPO aggregates seq-mean-token-mean whatever the mode
        mode, info = "seq-mean-token-mean", {}
        agg_settings = {"agg": "seq-mean-token-mean"}
    want = _verl_agg(_verl_policy(x, leaf, policy), x["mask"].to(F64), mode, **info)
    (want_grad,) = torch.autograd.grad(want, leaf)
    got_leaf = x["logp"].float().requires_grad_(True)
    got, _ = rlk.policy_loss(got_leaf, x["old"], x["adv"], x["mask"], clip_low=0.2,
                             clip_high=0.28, importance_weights=x["is_ratio"],
                             **VERL_POLICY[policy], **agg_settings)
    got.backward()
    torch.testing.assert_close(got.double(), want.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_leaf.grad.double(), want_grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(VERL_KL))
def test_every_verl_kl_loss_type_is_one_configuration(kind):
    """verl's actor: policy loss + kl_loss_coef * agg_loss(kl_penalty(...)) in one op."""
    x = _batch()
    x["ref"][1, 2] = x["logp"][1, 2] - 30.0  # beyond verl's clamps
    leaf = x["logp"].clone().requires_grad_(True)
    mask = x["mask"].to(F64)
    policy = _verl_agg(_verl_policy(x, leaf, "vanilla"), mask, "token-mean")
    kl = _verl_agg(_verl_kl(leaf, x["ref"], kind), mask, "token-mean")
    want = policy + 0.1 * kl
    (want_grad,) = torch.autograd.grad(want, leaf)
    estimator, clamp = VERL_KL[kind]
    got_leaf = x["logp"].float().requires_grad_(True)
    got, metrics = rlk.policy_loss(got_leaf, x["old"], x["adv"], x["mask"], ref_logp=x["ref"],
                                   importance_weights=x["is_ratio"], clip_low=0.2,
                                   clip_high=0.28, kl_coef=0.1, kl_estimator=estimator,
                                   kl_clamp=clamp, **VERL_POLICY["vanilla"])
    got.backward()
    torch.testing.assert_close(got.double(), want.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_leaf.grad.double(), want_grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(metrics["mean_kl"].double(), kl.detach(), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------
# advantages


def _verl_outcome(scores: torch.Tensor, index: list[str], estimator: str,
                  epsilon: float = 1e-6, norm_by_std: bool = True) -> torch.Tensor:
    """verl's compute_grpo_outcome_advantage / compute_rloo_outcome_advantage, per sample."""
    members: dict[str, list[int]] = defaultdict(list)
    for i, uid in enumerate(index):
        members[uid].append(i)
    out = scores.clone()
    for rows in members.values():
        group = scores[rows]
        if len(rows) == 1:
            mean, std = torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64)
        else:
            mean, std = group.mean(), group.std()
        n = len(rows)
        for i in rows:
            if estimator == "grpo":
                out[i] = (scores[i] - mean) / (std + epsilon) if norm_by_std else scores[i] - mean
            elif n > 1:
                out[i] = scores[i] * n / (n - 1) - mean * n / (n - 1)
    return out


@pytest.mark.parametrize(("estimator", "norm_by_std", "settings"), [
    ("grpo", True, {"normalize": "std"}),
    ("grpo", False, {"normalize": "none"}),
    ("rloo", True, {"baseline": "loo", "normalize": "none"}),
])
def test_verl_advantage_estimators(estimator, norm_by_std, settings):
    index = ["u3", "u1", "u3", "u9", "u1", "u3", "u7", "u1", "u7"]  # u9: a group of one
    scores = torch.randn(len(index), generator=GEN, dtype=F64)
    mask = torch.rand(len(index), 5, generator=GEN) > 0.3
    want = _verl_outcome(scores, index, estimator, norm_by_std=norm_by_std)
    np = pytest.importorskip("numpy")
    got = rlk.group_advantages(scores.float(), group_ids=np.array(index, dtype=object),
                               mask=mask, singleton="reward", eps=1e-6, **settings)
    torch.testing.assert_close(got.double(), want.unsqueeze(-1) * mask, atol=1e-5, rtol=1e-5)


def _nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """TRL's nanstd: Bessel-corrected std of the non-NaN entries."""
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=True)
    count = (~values.isnan()).sum(dim=dim, keepdim=True)
    variance = variance * torch.where(count > 1, count / (count - 1), torch.nan)
    std = variance.sqrt()
    return std.squeeze(dim) if dim is not None else std.squeeze()


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_trl_grpo_advantages(scale_rewards):
    generations = 4
    rewards = torch.randn(20, generator=GEN, dtype=F64)
    rewards[[2, 9]] = torch.nan  # unscorable completions
    grouped = rewards.view(-1, generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(generations)
    if scale_rewards == "batch":
        std = _nanstd(rewards).expand_as(rewards)
    else:
        std = _nanstd(grouped, dim=1).repeat_interleave(generations)
    want = rewards - mean
    if scale_rewards != "none":
        want = want / (std + 1e-4)
    want = torch.nan_to_num(want, nan=0.0)
    normalize = {"group": "std", "batch": "batch-std", "none": "none"}[scale_rewards]
    got = rlk.group_advantages(rewards.float(), group_size=generations, normalize=normalize,
                               eps=1e-4, nan="ignore")
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_trl_rloo_advantages():
    generations = 4
    rewards = torch.randn(16, generator=GEN, dtype=F64)
    rewards[5] = torch.nan
    grouped = rewards.view(-1, generations)
    counts = (~grouped.isnan()).sum(dim=1, keepdim=True)
    baselines = (torch.nansum(grouped, dim=1, keepdim=True) - grouped) / (counts - 1)
    want = torch.nan_to_num(rewards - baselines.view(-1), nan=0.0)
    got = rlk.group_advantages(rewards.float(), group_size=generations, baseline="loo",
                               normalize="none", nan="ignore")
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
