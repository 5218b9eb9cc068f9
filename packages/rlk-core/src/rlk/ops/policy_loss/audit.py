"""The float32 gradient audit of policy_loss at the extremes (issue #31), shared by the
native audit (packages/rlk-core/tests/test_policy_loss_extremes.py) and the cuda kernel's
(packages/rlk-cuda/tests/test_gpu_policy_loss_extremes.py).

Log ratios span [-30, 30], KL deltas [-24, 30], advantages 1e-3 to 1e3. Inputs lie on a
2^-12 grid, so logp - old_logp and logp - ref_logp are exact in float32: the audit measures
the formulas, not the rounding of the inputs' differences (which no float32 formula can
undo). The float64 reference cancels too: its bias-corrected KL gradient sums terms of
size e^-delta * r, so its own rounding (`reference_error`) is allowed on top, and deltas
stop at -24, where that is still below 2e-6 of the result (at -28 it would reach 1e-5).
"""


from __future__ import annotations

import itertools

import torch

from rlk.ops.policy_loss import reference
from rlk.ops.policy_loss.options import KL_ESTIMATORS, PolicyLossOptions

GRID = 2.0 ** -12
EXTREME = 30.0
DELTA_MIN = -24.0
RTOL, ATOL = 1e-5, 1e-6
ADVANTAGES = (-1e3, -1.0, -1e-3, 1e-3, 1.0, 1e3)
# token pairs (log ratio, delta) every batch holds: the corners, the k3 cancellation
# points of the issue, SAPO near saturation (its gate's argument at 1 .. 100)
PAIRS = ((EXTREME, EXTREME), (EXTREME, DELTA_MIN), (-EXTREME, EXTREME), (-EXTREME, DELTA_MIN),
         (0.0, -9.3), (0.0, -16.1), (0.0, -18.6), (0.0, DELTA_MIN), (2.5, -22.0), (-3.0, 20.0),
         (0.69, 0.0), (1.39, 1e-3), (2.5, -1e-3), (3.0, 0.0), (4.6, 0.5))


def _grid(values: torch.Tensor) -> torch.Tensor:
    return (values / GRID).round() * GRID


def audit_inputs(seed: int, rows: int = len(ADVANTAGES), tokens: int = 24) -> dict:
    """A float32 batch whose log ratios and deltas span [-30, 30] (every `PAIRS` entry in
    each row), one advantage of `ADVANTAGES` per row, a few masked tokens."""
    gen = torch.Generator().manual_seed(seed)
    log_ratio = (torch.rand(rows, tokens, generator=gen) * 2 - 1) * EXTREME
    delta = DELTA_MIN + torch.rand(rows, tokens, generator=gen) * (EXTREME - DELTA_MIN)
    pairs = torch.tensor(PAIRS)
    log_ratio[:, :len(PAIRS)] = pairs[:, 0]
    delta[:, :len(PAIRS)] = pairs[:, 1]
    logp = _grid(-torch.rand(rows, tokens, generator=gen) * 8)
    mask = torch.rand(rows, tokens, generator=gen) > 0.1
    mask[:, :len(PAIRS)] = True
    return {"logp": logp, "old_logp": logp - _grid(log_ratio),
            "advantages": torch.tensor(ADVANTAGES[:rows]),
            "mask": mask, "ref_logp": logp - _grid(delta)}


def one_token_inputs(seed: int) -> dict:
    """Sequences of one real token (and one masked) at every `PAIRS` entry and advantage.
    Under the sequence ratio the ratio is then the token's own, so the bias-corrected KL's
    gradient is as well conditioned as at token level (k3: delta * r) although its share
    through the ratio and its own slope are each ~e^-delta * r: the sum must not cancel."""
    gen = torch.Generator().manual_seed(seed)
    pairs = torch.tensor(PAIRS).repeat(len(ADVANTAGES), 1)
    logp = _grid(-torch.rand(len(pairs), 2, generator=gen) * 8)
    log_ratio = torch.stack([pairs[:, 0], torch.zeros(len(pairs))], dim=1)
    delta = torch.stack([pairs[:, 1], torch.zeros(len(pairs))], dim=1)
    return {"logp": logp, "old_logp": logp - _grid(log_ratio),
            "advantages": torch.tensor(ADVANTAGES).repeat_interleave(len(PAIRS)),
            "mask": torch.tensor([[True, False]]).expand(len(pairs), 2),
            "ref_logp": logp - _grid(delta)}


def reference_gradient(inputs: dict, options: PolicyLossOptions) -> torch.Tensor:
    """d loss / d logp in float64 by autograd through the reference."""
    leaf = inputs["logp"].double().requires_grad_(True)
    loss, _ = reference.policy_loss(leaf, inputs["old_logp"], inputs["advantages"],
                                    inputs["mask"], ref_logp=inputs["ref_logp"], options=options)
    (grad,) = torch.autograd.grad(loss, leaf)
    return grad


def reference_error(inputs: dict, options: PolicyLossOptions) -> torch.Tensor:
    """A bound on the float64 reference's own rounding per token: 2^-50 of the largest
    KL gradient term it sums, kl_coef * (1 + |d| + d^2 / 2 + e^-d) times the ratio that
    multiplies it (the row's largest, under the sequence ratios)."""
    mask = inputs["mask"]
    delta = (inputs["logp"] - inputs["ref_logp"]).double()
    log_ratio = torch.where(mask, (inputs["logp"] - inputs["old_logp"]).double(), 0.0)
    if options.ratio_level != "token":
        log_ratio = (log_ratio.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1))
    if options.log_ratio_max is not None:
        log_ratio = log_ratio.clamp(options.log_ratio_min, options.log_ratio_max)
    ratio = log_ratio.exp() if options.kl_bias_correction else torch.ones_like(log_ratio)
    size = options.kl_coef * (1 + delta.abs() + delta.square() / 2 + (-delta).exp()) * ratio
    if options.ratio_level == "sequence":
        size = torch.where(mask, size, 0.0).amax(1, keepdim=True)
    return 2.0 ** -50 * size.expand_as(delta)


def assert_gradient_matches(grad: torch.Tensor, want: torch.Tensor, inputs: dict,
                            options: PolicyLossOptions) -> None:
    """Every element within RTOL of the float64 truth (ATOL where it is tiny, plus the
    reference's own rounding), the first element outside named with its log ratio and
    delta."""
    grad, want = grad.double().cpu(), want.double().cpu()
    error = (grad - want).abs()
    allowed = RTOL * want.abs() + ATOL
    if inputs.get("ref_logp") is not None:
        allowed = allowed + reference_error({k: v.cpu() for k, v in inputs.items()}, options)
    if bool((error <= allowed).all()):
        return
    worst = tuple(int(i) for i in torch.nonzero(error > allowed)[0])
    log_ratio = float(inputs["logp"][worst] - inputs["old_logp"][worst])
    delta = (float(inputs["logp"][worst] - inputs["ref_logp"][worst])
             if inputs.get("ref_logp") is not None else float("nan"))
    raise AssertionError(f"grad{list(worst)} = {float(grad[worst]):.9g}, float64 "
                         f"{float(want[worst]):.9g} (log ratio {log_ratio:g}, delta {delta:g}, "
                         f"advantage {float(inputs['advantages'][worst[0]]):g})")


def audit_options() -> list[PolicyLossOptions]:
    """Every objective at every ratio level it takes, with and without the log-ratio clamp,
    times every KL estimator, clamped or not, with and without bias correction."""
    cases = []
    shapes = [("ppo", "token", None), ("ppo", "sequence-token", None), ("ppo", "token", 20.0),
              ("ppo", "sequence", None), ("cispo", "token", None), ("cispo", "token", 20.0),
              ("sapo", "token", None), ("sapo", "sequence-token", None),
              ("sapo", "token", 20.0), ("vespo", "token", None)]
    for (objective, level, bound), estimator, kl_clamp, bias in itertools.product(
            shapes, KL_ESTIMATORS, (None, 10.0), (False, True)):
        settings = {"objective": objective, "ratio_level": level, "kl_coef": 0.5,
                    "kl_estimator": estimator, "kl_clamp": kl_clamp, "kl_bias_correction": bias,
                    "agg": "token-sum", "log_ratio_min": None if bound is None else -bound,
                    "log_ratio_max": bound}
        cases.append(PolicyLossOptions(**settings))
    return cases


def case_name(o: PolicyLossOptions) -> str:
    """A short test id for audit options."""
    clamp = "" if o.log_ratio_max is None else "-lrclamp"
    return (f"{o.objective}-{o.ratio_level}{clamp}-{o.kl_estimator}"
            f"{'-klclamp' if o.kl_clamp else ''}{'-bias' if o.kl_bias_correction else ''}")
