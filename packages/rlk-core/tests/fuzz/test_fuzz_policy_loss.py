"""policy_loss and token_kl against float64, fuzzed.

Every objective (SAPO's and VESPO's parameters too), ratio level, KL estimator with and
without bias correction, clamp, aggregation and normaliser, truncated importance weights,
log ratios from 0.01 to ~20 (where float32 cancellation shows) and NaN, inf or huge values
at masked positions, which must reach neither the loss nor the gradient. The regimes split
where issue #31 found wrong gradients, so each can be tracked on its own."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fuzzing import (
    fuzz,
    generator,
    in_range,
    loss_inputs,
    loss_options,
    on_device,
    snapshot,
    tally,
    unchanged,
)
from hypothesis import strategies as st

import rlk
from rlk._runtime.spec import Tolerance, specs
from rlk.ops.policy_loss import native
from rlk.ops.policy_loss import reference as policy_loss_reference
from rlk.ops.policy_loss.native import token_kl_and_grad
from rlk.ops.policy_loss.options import METRICS, PolicyLossOptions
from rlk.ops.token_kl import reference as token_kl_reference
from rlk.testing.compare import assert_matches

DTYPES = st.sampled_from([torch.float32, torch.float32, torch.bfloat16, torch.float16,
                          torch.float64])
REGIMES = {
    "ppo-cispo-vespo": {"objectives": ("ppo", "cispo", "vespo")},
    "sapo": {"objectives": ("sapo",)},
    "bias-corrected-kl": {"objectives": ("ppo", "cispo", "sapo", "vespo"),
                          "bias_corrected": True},
}


@st.composite
def loss_calls(draw, regime: str, batch_sizes=(0, 1, 3, 6), lengths=(1, 5, 12)):
    options = draw(loss_options(**REGIMES[regime]))
    batch, length = draw(st.sampled_from(batch_sizes)), draw(st.sampled_from(lengths))
    logp, tensors = draw(loss_inputs(options, batch, length))
    if logp.numel() and draw(st.booleans()):  # garbage where the mask is off
        row, col = draw(st.integers(0, batch - 1)), draw(st.integers(0, length - 1))
        tensors["mask"][row, col] = 0
        logp[row, col] = draw(st.sampled_from([float("nan"), float("inf"), -1e30]))
    return logp.to(draw(DTYPES)), tensors, options


@pytest.mark.parametrize("regime", [
    "ppo-cispo-vespo",
    "sapo",
    "bias-corrected-kl"])
@fuzz(data=st.data())
def test_policy_loss_against_float64(regime, data):
    tally("policy_loss")
    check_against_float64(*data.draw(loss_calls(regime)))


def check_against_float64(logp: torch.Tensor, tensors: dict, options) -> None:
    """rlk.policy_loss's loss, metrics and gradient on the fuzzed device against the float64
    reference's, within the spec's tolerances plus each result's conditioning allowance."""
    spec = specs()["policy_loss"]
    leaf = on_device(logp).clone().requires_grad_(True)
    device_tensors = {name: on_device(value) for name, value in tensors.items()}
    before = snapshot(logp=leaf, **device_tensors)
    loss, metrics = rlk.policy_loss(leaf, options=options, **device_tensors)
    unchanged(before, logp=leaf, **device_tensors)
    truth_leaf = logp.double().requires_grad_(True)
    want_loss, want_metrics = policy_loss_reference.policy_loss(truth_leaf, options=options,
                                                                **tensors)
    tolerance = spec.tolerances[torch.float32]
    vespo_loss, vespo_grad = vespo_allowance(logp, tensors, options)
    weight_loss, weight_grad = importance_weight_allowance(logp, tensors, options)
    assert_matches("loss", loss, want_loss, tolerance,
                   allowance=combined(kl_loss_allowance(logp, tensors, options), vespo_loss,
                                      weight_loss))
    assert_matches("metrics", torch.stack([metrics[name].cpu() for name in METRICS]),
                   want_metrics, tolerance,
                   allowance=kl_metric_allowance(logp, tensors, options))
    (grad,) = torch.autograd.grad(loss, leaf)
    assert grad.dtype == logp.dtype
    want_grad = torch.zeros_like(truth_leaf)  # the reference drops the graph without tokens
    if want_loss.requires_grad:
        (want_grad,) = torch.autograd.grad(want_loss, truth_leaf)
    assert spec.grad_tolerances is not None
    assert_matches("grad_logp", grad, in_range(want_grad, logp.dtype),
                   spec.grad_tolerances[logp.dtype],
                   allowance=combined(sequence_kl_allowance(logp, tensors, options), vespo_grad,
                                     weight_grad))
    masked = tensors["mask"] == 0
    assert not bool(grad.cpu()[masked].any()), "a gradient at a masked position"


def _rows(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _vespo_phi_of_a_cancelling_log_weight():
    """ppo-cispo-vespo, CPU seed 3787959806: s = 0.0448 sums log ratios from -10.3 to 10.0,
    and grad_logp at [0, 3] was 0.0548348 for 0.0548370 (2.3e-6 off)."""
    logp = _rows([-1.9706783, -1.255727, -0.95869684, -1.1738775, -1.8199244, -1.5074115,
                  -3.745041, -0.5778334, -2.999261, -1.316123, -0.5138068, -0.86963415])
    old = _rows([-11.996327, -10.247122, 8.809576, -2.5682569, -4.734623, -0.8173119,
                 -7.2061834, -7.774968, -0.5875313, 8.962979, -0.86488914, 3.3411403])
    ref = _rows([-3.5712404, 1.527636, -7.5999503, 10.9787655, 0.09525037, 0.6575744,
                 -17.694185, -12.506741, -2.0389843, 2.2880464, -1.5478201, 4.0638766])
    mask = torch.tensor([[1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1]], dtype=torch.bool)
    options = PolicyLossOptions(objective="vespo", clip_low=0.1, clip_high=0.2,
                                vespo_lambda_neg=8.0, kl_coef=0.04, kl_estimator="k2",
                                agg="token-sum")
    tensors = {"old_logp": old, "advantages": torch.tensor([-0.68213105]), "mask": mask,
               "ref_logp": ref}
    return logp, tensors, options


def _bias_corrected_kl_cancelling_in_the_loss():
    """bias-corrected-kl, CPU seed 350398810: two real tokens, k1 clamped to -10 and +10 at
    the sequence ratio 188.7; the loss was -0.2557373 for -0.2556838 (5.3e-5 off)."""
    logp = _rows([-1.6723285, -1.303515, -3.1749055, -3.5063438, -3.4922626, -2.7413845,
                  -0.731987, -3.7394161, -2.7243366, -1.1089299, -3.6308174, -2.5196805],
                 [-1.401315, -3.4810038, -1.0230556, -0.1091373, -0.7079766, -1.194102,
                  -1.8634346, -3.4197757, -1.6383648, -2.0575972, -0.5280974, -0.40900326],
                 [-2.5190258, -1.4332051, -1.4645302, -2.0848744, -3.7981656, -2.2087872,
                  -0.7330861, -2.232123, -0.046377182, -2.3936427, -2.4924657, -1.1217902])
    old = _rows([-6.9238954, -10.471848, -15.729546, -4.7822795, -12.538726, -2.78719,
                 -7.0974984, -6.1529207, -4.6724916, -5.8776093, -0.8549111, -2.9373298],
                [-5.9811306, -1.3196299, -4.1369934, -14.729329, -1.7360764, -9.72963,
                 -0.37918067, -4.2487736, -13.883414, 0.27905703, 1.2363179, -0.99137175],
                [-3.8772194, -5.317279, 15.183467, -0.18801093, -4.463394, 0.9618707,
                 9.547382, -3.2178178, -8.010278, -0.35696602, -3.972446, 8.507385])
    ref = _rows([-0.34806836, 0.3176763, -8.103974, 3.154725, 0.37316728, -5.0849333,
                 6.854337, -3.4121118, -1.257151, 1.3246102, -8.437049, -2.382859],
                [3.067272, -3.470248, -6.704229, -0.035959452, -1.84338, -2.752096,
                 8.832256, 8.411033, 12.794626, -10.112836, -12.560086, -5.753672],
                [-8.822437, -11.147106, -4.11257, -8.677872, -0.6110196, -6.2235146,
                 -2.3720732, -7.1491604, -2.6521325, -14.552284, -0.8962686, 2.4757597])
    mask = torch.zeros(3, 12, dtype=torch.bool)
    mask[1, 8] = mask[1, 10] = True
    options = PolicyLossOptions(clip_low=0.1, clip_high=0.2, ratio_level="sequence",
                                vespo_lambda_neg=2.0, kl_coef=1.0, kl_estimator="k1",
                                kl_clamp=10.0, kl_bias_correction=True, agg="token-mean")
    tensors = {"old_logp": old, "advantages": torch.tensor([-0.30164194, 0.21306987,
                                                            -0.120670214]),
               "mask": mask, "ref_logp": ref}
    return logp, tensors, options


def _cispo_importance_weights_cancelling_in_the_loss():
    """ppo-cispo-vespo, CPU seed 3787959806: CISPO with rollout_logp and importance_weights
    at seq-mean-token-mean; weights up to 1.4e5 (old - rollout up to 16.1) make terms up to
    5.5e4 of either sign whose aggregated size 5397 cancels to 84.2, and the loss was
    84.23828 for 84.235510 (2.77e-3 off; importance_weight_allowance gives 1.40e-2)."""
    logp = _rows([-2.995149, -0.9851451, -3.5322983, -1.6761744, -0.6572349],
                 [-2.04103, -0.23173428, -3.6229153, -2.3099809, -2.2223625],
                 [-1.5130303, -2.0261204, -1.9049783, -2.5222945, -3.2250447],
                 [-3.1454368, -1.7083955, -3.8841624, -0.39339137, -0.17641377],
                 [-1.5980084, -0.12455678, -2.406095, -3.426834, -2.2270772],
                 [-0.3651948, -0.94022536, -3.6298711, -2.134263, -1.0510821])
    old = _rows([-10.85286, -11.55521, 7.7329493, 9.582349, -7.360859],
                [-4.405291, 1.3226798, -1.593302, -5.16064, -0.5370544],
                [4.988796, -1.161537, 7.8845267, -9.814732, -9.465509],
                [-10.209585, -1.1416795, 1.760345, -3.1076095, -2.2718918],
                [-7.0388527, 5.74726, -8.4764, -5.088734, 4.270665],
                [-13.256989, -2.5062823, 4.514904, -2.8761473, 1.301305])
    rollout = _rows([-8.883848, -11.234878, 18.87069, 7.1003075, -14.4382105],
                    [-0.9488206, 5.922782, 0.5304465, -13.502359, -5.103528],
                    [3.3843029, 4.047263, 5.075104, -10.678173, -8.808788],
                    [5.8764744, -5.3138103, -1.1816297, -6.1448135, -10.809189],
                    [-5.7145934, 5.8074875, -22.266426, -13.811895, 14.323417],
                    [-8.000916, -3.9724722, -2.1131773, -7.2429733, -10.238656])
    given = _rows([1.2397817, 0.3642689, 0.31434047, 0.9357908, 0.44954777],
                  [1.1753515, 0.99151075, 0.075420976, 0.72257745, 1.1004068],
                  [0.887692, 1.1209688, 0.48129213, 1.0264883, 0.41436863],
                  [1.7787657, 1.7087328, 1.3432516, 0.37489212, 1.4631947],
                  [0.71207476, 1.7539662, 1.9242003, 0.75665474, 1.4806031],
                  [1.4546057, 1.048207, 1.3332148, 1.6211567, 1.4048359])
    advantages = _rows([0.057824653, -0.57963276, -0.67048436, 0.32729715, 0.94792956],
                       [0.06574147, 1.65498, -1.2039679, -0.96287197, 0.38547838],
                       [0.48292482, -0.8530593, 0.67539346, 1.2574878, 0.77977026],
                       [0.1596466, -2.2880049, 0.64556336, -0.36385995, -1.2347759],
                       [1.7956814, -0.7552381, -1.7928504, 1.699334, 0.42486256],
                       [-0.71614677, -0.05487385, -0.43500423, 0.6911701, -0.40388513])
    ref = _rows([-7.3306913, -0.97018254, -2.1391397, 2.8548896, 2.728409],
                [14.529355, 0.31332624, -4.755107, -2.0415983, 2.2208533],
                [-3.2794335, 1.4609578, -5.06949, -8.402758, 1.4742894],
                [-5.009037, 0.12487185, -2.8439262, 5.0405226, -3.952222],
                [0.4389603, 0.5568422, 2.167859, 1.7559681, 1.735779],
                [0.36246544, 0.45724535, -10.32846, -3.0386493, -1.7266243])
    mask = torch.tensor([[1, 0, 1, 1, 1],
                         [0, 1, 1, 1, 1],
                         [1, 1, 1, 1, 0],
                         [1, 1, 1, 0, 0],
                         [0, 1, 0, 1, 0],
                         [1, 1, 0, 1, 1]], dtype=torch.bool)
    options = PolicyLossOptions(objective="cispo", clip_low=0.1, kl_estimator="k1",
                                agg="seq-mean-token-mean")
    tensors = {"old_logp": old, "advantages": advantages, "mask": mask, "ref_logp": ref,
               "rollout_logp": rollout, "importance_weights": given}
    return logp, tensors, options


COUNTEREXAMPLES = {"vespo-phi-of-a-cancelling-log-weight": _vespo_phi_of_a_cancelling_log_weight,
                   "bias-corrected-kl-cancelling-in-the-loss":
                       _bias_corrected_kl_cancelling_in_the_loss,
                   "cispo-importance-weights-cancelling-in-the-loss":
                       _cispo_importance_weights_cancelling_in_the_loss}


@pytest.mark.parametrize("name", sorted(COUNTEREXAMPLES))
def test_policy_loss_counterexamples_of_long_runs(name):
    """The minimal examples random passes shrank to, replayed exactly (each says where)."""
    check_against_float64(*COUNTEREXAMPLES[name]())


@dataclasses.dataclass
class KlPieces:
    """The bias-corrected KL's float64 pieces at real tokens (0 elsewhere): its estimate and
    slope at logp - ref, the log ratio that multiplies it, tokens per row, and each exp's
    conditioning 1 + |argument| (what a rounded argument costs its result, relatively)."""

    real: torch.Tensor
    value: torch.Tensor
    slope: torch.Tensor
    log_ratio: torch.Tensor
    count: torch.Tensor
    conditioning: torch.Tensor

    @classmethod
    def of(cls, logp: torch.Tensor, tensors: dict, options) -> KlPieces:
        real = tensors["mask"] != 0
        lp = logp.double().where(real, 0.0)
        ref = tensors["ref_logp"].double().where(real, 0.0)
        log_ratio = (lp - tensors["old_logp"].double()).where(real, 0.0)
        count = real.sum(1, keepdim=True).clamp(min=1)
        if options.ratio_level != "token":
            log_ratio = (log_ratio.sum(1, keepdim=True) / count).expand_as(lp)
        if options.log_ratio_min is not None or options.log_ratio_max is not None:
            log_ratio = log_ratio.clamp(min=options.log_ratio_min, max=options.log_ratio_max)
        value, slope = token_kl_and_grad(lp, ref, dataclasses.replace(
            options, kl_bias_correction=False))
        conditioning = (1.0 + (lp - ref).abs()) * (1.0 + log_ratio.abs())
        return cls(real, value.where(real, 0.0), slope.where(real, 0.0), log_ratio, count,
                   conditioning)


def sequence_kl_allowance(logp: torch.Tensor, tensors: dict, options) -> torch.Tensor | None:
    """Bias corrected at ratio_level "sequence", a token's KL gradient is r times its own
    slope plus r times the row's mean KL (through the sequence ratio r). The token's own two
    parts are summed without cancellation (k3 at ref - logp = 7.6, one token: 567.0 - 569.2 =
    -2.27 was off by 3.4e-5, seed 2363400387 on the H100), but the other tokens' KL can still
    cancel its slope. So the float32 result carries 2**-22 of the terms' size, not of their
    sum, times their exps' conditioning. A token's weight in the aggregation is the gradient
    of k1's plain KL term."""
    if not (options.kl_bias_correction and options.ratio_level == "sequence"
            and options.kl_coef and logp.numel()):
        return None
    kl = KlPieces.of(logp, tensors, options)
    leaf = logp.double().where(kl.real, 0.0).requires_grad_(True)
    k1 = dataclasses.replace(options, objective="ppo", ratio_level="token", kl_estimator="k1",
                             kl_clamp=None, kl_bias_correction=False, dual_clip=None,
                             ratio_cap=None, kl_coef=1.0)
    plain = {**{k: v.double() if v.is_floating_point() else v for k, v in tensors.items()},
             "advantages": torch.zeros_like(tensors["advantages"], dtype=torch.float64)}
    (weight,) = torch.autograd.grad(policy_loss_reference.policy_loss(
        leaf, options=k1, **plain)[0], leaf)
    weight = weight.abs()
    through = weight * kl.value.abs() * kl.conditioning
    own = weight * (kl.slope.abs() * kl.conditioning * (1.0 - 1.0 / kl.count)
                    + (kl.slope + kl.value).abs() / kl.count)
    others = (through.sum(1, keepdim=True) - through) / kl.count
    size = options.kl_coef * kl.log_ratio.exp() * (own + others)
    return (2.0**-22 * size).where(kl.real, 0.0)


def kl_metric_allowance(logp: torch.Tensor, tensors: dict, options) -> torch.Tensor | None:
    """Bias corrected, the KL metric is the token mean of k * r, terms of either sign (k1,
    a clamp) and of any size (r = e^15 at a log ratio of 15): their float32 sum cancels, so
    it carries 2**-22 of the terms' mean size times their exps' conditioning (4.6e-3 at
    seed 1314542889, on the CPU, over terms up to 1.2e5). The other metrics sum terms of one
    sign."""
    if not (options.kl_bias_correction and logp.numel()):
        return None
    kl = KlPieces.of(logp, tensors, options)
    size = kl.value.abs() * kl.log_ratio.exp() * kl.conditioning
    allowance = torch.zeros(len(METRICS), dtype=torch.float64)
    allowance[METRICS.index("mean_kl")] = 2.0**-22 * float(size.sum() / kl.real.sum().clamp(min=1))
    return allowance


def kl_loss_allowance(logp: torch.Tensor, tensors: dict, options) -> torch.Tensor | None:
    """Bias corrected, the loss sums kl_coef * k * r beside each token's policy term, in the
    aggregation's weights: terms of either sign and any size that cancel as the mean_kl
    metric's do, so the loss carries 2**-22 of their weighted size times their exps'
    conditioning. (CPU seed 350398810: k1 clamped to -10 and +10 at the sequence ratio
    r = 188.7 cancel exactly, but the tokens' terms -1887.6 and 1887.0 each round the policy
    term -0.256 beside them, and the loss was 5.3e-5 off; the allowance is 0.04 there.)"""
    if not (options.kl_bias_correction and options.kl_coef and logp.numel()):
        return None
    kl = KlPieces.of(logp, tensors, options)
    size = kl.value.abs() * kl.log_ratio.exp() * kl.conditioning
    aggregated = policy_loss_reference.aggregate(size, kl.real, options).abs()
    return 2.0**-22 * abs(options.kl_coef) * aggregated


def _clean(value: torch.Tensor | None, real: torch.Tensor) -> torch.Tensor | None:
    """`value` in float64 as [B, T] (a per-sequence [B] broadcast), 0 off the real tokens."""
    if value is None:
        return None
    value = value.double()
    return (value.unsqueeze(1) if value.dim() == 1 else value).where(real, 0.0)


def vespo_allowance(logp: torch.Tensor, tensors: dict,
                    options) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """VESPO's phi = exp(lam + k s - lam e^s) of a row's log weight s moves by |k - lam e^s|
    times s's error, relatively. s sums the row's log ratios (clamped to ±20) and log
    importance weights, each rounded in float32 (logp - old_logp to 2**-24 of itself), so
    however much they cancel s carries 2**-22 of their size: a condition number of
    sum |terms| / |s| (CPU seed 3787959806: s = 0.0448 from terms of size 49.9, 1116 times
    it, was 8.3e-7 off; phi = 0.793 moved 3.6e-6, a gradient of 0.0548 2.3e-6; allowed
    2.7e-5). The loss's allowance (0-d) takes that times each token's |phi A logp| in the
    aggregation, the gradient's ([B, T]) times |phi A|; (None, None) for other objectives."""
    if options.objective != "vespo" or not logp.numel():
        return None, None
    real = tensors["mask"] != 0
    lp, old = _clean(logp, real), _clean(tensors["old_logp"], real)
    rollout = _clean(tensors.get("rollout_logp"), real)
    weight, _ = native.importance_weight(old, rollout,
                                         _clean(tensors.get("importance_weights"), real),
                                         options)
    s = native.sequence_statistics(lp, old, real.double(), weight, options)
    size = (lp - old).clamp(-native.VESPO_LOG_RATIO_BOUND, native.VESPO_LOG_RATIO_BOUND).abs()
    if weight is not None:  # exp and log each round too, after old - rollout does
        logs = weight.log().clamp(native.VESPO_LOG_WEIGHT_MIN, native.VESPO_LOG_WEIGHT_MAX)
        size = size + 2.0 + logs.abs() + (0.0 if rollout is None else (old - rollout).abs())
    error = 2.0**-22 * size.where(real, 0.0).sum(1, keepdim=True)
    advantages = _clean(tensors["advantages"], real)
    nonneg = advantages >= 0
    k = torch.where(nonneg, options.vespo_k_pos, options.vespo_k_neg).double()
    lam = torch.where(nonneg, options.vespo_lambda_pos, options.vespo_lambda_neg).double()
    phi = torch.exp(lam + k * s - lam * s.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    weights = native.aggregation_weights(tensors["mask"], options).double().abs()
    moved = weights * (phi * advantages).abs() * (k - lam * s.exp()).abs() * error
    return (moved * lp.abs()).sum(), moved.where(real, 0.0)


def importance_weight_allowance(logp: torch.Tensor, tensors: dict, options
                                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A token's policy term is multiplied by its importance weight exp(old - rollout) (TIS
    capped) times importance_weights; float32 rounds old - rollout to 2**-24 of itself
    before the exp, so the weight, and the term, carry 2**-24 (|old - rollout| + a few)
    relative error (none where the cap binds). The aggregation sums terms of either sign
    (advantages' signs) and any size (weights past 1e5), which may cancel: the loss
    carries 2**-22 of the terms' aggregated size times 1 + |old - rollout| (CPU seed
    3787959806, CISPO at seq-mean-token-mean: weights up to 1.4e5, terms up to 5.5e4 whose
    aggregated size 5397 cancels to 84.2; the loss 84.23828 was 2.77e-3 off 84.23551,
    allowed 1.40e-2, where 2**-24 of the size times |old - rollout| alone is 3.2e-3). Under the
    sequence ratio a token's gradient also sums the row's other terms through the ratio
    (1 / L each), so it carries 2**-22 of those terms' size the same way. The terms are
    native.token_terms' in float64 (no KL: it is not weighted). VESPO's weight moves phi
    instead (vespo_allowance); (None, None) there and without weights."""
    rollout, given = tensors.get("rollout_logp"), tensors.get("importance_weights")
    if options.objective == "vespo" or (rollout is None and given is None) or not logp.numel():
        return None, None
    real = tensors["mask"] != 0
    lp, old = _clean(logp, real), _clean(tensors["old_logp"], real)
    rollout = _clean(rollout, real)
    weight, truncated = native.importance_weight(old, rollout, _clean(given, real), options)
    sequence = native.sequence_statistics(lp, old, real.double(), weight, options)
    terms = native.token_terms(lp, old, _clean(tensors["advantages"], real), real.double(),
                               options, weight=weight, sequence=sequence)
    conditioning = torch.ones_like(lp) if rollout is None else 1.0 + (old - rollout).abs()
    if truncated is not None:
        conditioning = torch.where(truncated, 1.0, conditioning)
    weights = native.aggregation_weights(tensors["mask"], options).double().abs()
    loss = 2.0**-22 * (weights * terms.value.abs() * conditioning).sum()
    if options.ratio_level != "sequence":
        return loss, None
    through = weights * terms.grad_log_ratio.abs() * conditioning
    count = real.sum(1, keepdim=True).clamp(min=1)
    others = (through.sum(1, keepdim=True) - through) / count
    return loss, (2.0**-22 * others).where(real, 0.0)


def combined(*allowances: torch.Tensor | None) -> torch.Tensor | None:
    """The sum of the allowances that apply, None where none does."""
    present = [allowance for allowance in allowances if allowance is not None]
    return sum(present[1:], present[0]) if present else None


@st.composite
def kl_calls(draw, spreads: tuple[float, ...]):
    gen = generator(draw)
    shape = draw(st.sampled_from([(0,), (1,), (7,), (3, 5), (2, 3, 4)]))
    spread = draw(st.sampled_from(spreads))
    logp = -torch.rand(shape, generator=gen) * 4
    ref = logp + torch.randn(shape, generator=gen) * spread
    dtype, ref_dtype = draw(DTYPES), draw(DTYPES)
    settings = {"kl_estimator": draw(st.sampled_from(["k1", "k2", "k3", "abs", "k1+", "k3+",
                                                      "abs+"])),
                "kl_clamp": draw(st.sampled_from([None, 10.0, 0.05]))}
    return logp.to(dtype), ref.to(ref_dtype), settings


KL_SPREADS = {"usual": (0.01, 0.5, 3.0), "extreme": (12.0,)}


def conditioned(tolerance: Tolerance, logp: torch.Tensor, ref: torch.Tensor) -> Tolerance:
    """k3 and its gradient are exp(-delta) at log ratios past ~16: their condition number is
    |delta|, so the float32 rounding of delta alone puts |delta| * 2**-24 relative on them
    (1.65e-6 at delta = -37.4, found by the long run), past the spec's rtol of 1e-6. The
    bound allowed grows with the condition number, twice float32's rounding of delta."""
    delta = (ref.double() - logp.double()).abs().nan_to_num(posinf=0.0, neginf=0.0)
    largest = float(delta.max()) if delta.numel() else 0.0
    return Tolerance(atol=tolerance.atol, rtol=max(tolerance.rtol, largest * 2.0**-23))


@pytest.mark.parametrize("spreads", ["usual", "extreme"])
@fuzz(data=st.data())
def test_token_kl_against_float64(spreads, data):
    tally("token_kl")
    logp, ref, settings = data.draw(kl_calls(KL_SPREADS[spreads]))
    spec = specs()["token_kl"]
    leaf = on_device(logp).clone().requires_grad_(True)
    device_ref = on_device(ref)
    before = snapshot(logp=leaf, ref_logp=device_ref)
    got = rlk.token_kl(leaf, device_ref, **settings)
    unchanged(before, logp=leaf, ref_logp=device_ref)
    wide = torch.float64 in (logp.dtype, ref.dtype)
    assert got.dtype == (torch.float64 if wide else torch.float32), got.dtype
    truth_leaf = logp.double().requires_grad_(True)
    want = token_kl_reference.token_kl(truth_leaf, ref, settings["kl_estimator"],
                                       settings["kl_clamp"])
    assert_matches("token_kl", got, want, conditioned(spec.tolerances[logp.dtype], logp, ref))
    if not logp.numel():
        return
    upstream = torch.randn(logp.shape, generator=torch.Generator().manual_seed(11))
    (grad,) = torch.autograd.grad(got, leaf, upstream.to(got))
    (want_grad,) = torch.autograd.grad(want, truth_leaf, upstream.double())
    assert grad.dtype == logp.dtype
    assert spec.grad_tolerances is not None
    assert_matches("grad_logp", grad, in_range(want_grad, logp.dtype),
                   conditioned(spec.grad_tolerances[logp.dtype], logp, ref))
