"""The kernel-level signature of every op: what rlk passes a backend's kernel and what it
must return, as typing Protocols a backend can check its functions against with mypy.

rlk calls kernels with these parameter names (by keyword for forwards, in this order for
backwards), on plain tensors: autograd stripped, arguments validated, leading dimensions
flattened. The *compute dtype* is float32, or float64 for float64 logits. Semantics (ignored
rows, NaN, precision) are on each op's page, docs/ops/<op>.md, under "Kernel signature".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from rlk._runtime.temperature import Temperature
from rlk.ops.group_advantages.options import GroupAdvantagesOptions
from rlk.ops.policy_loss.options import PolicyLossOptions

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class LogpForward(Protocol):
    """`logp` and `logp_entropy` forward (main input: `logits`)."""

    def __call__(self, logits: Tensor, tokens: Tensor, temperature: Temperature,
                 ignore_index: int, rows: Tensor | None, out: Tensor | None,
                 with_entropy: bool) -> tuple[Tensor, Tensor | None, Tensor]:
        """logits [M, V] (float32, bfloat16, float16, float64; any strides); tokens [M] int64,
        or [M, K] for K tokens a row (`logp` only); temperature a float or a tensor [M];
        rows None or int64 [R] row indices (may repeat or fall outside [0, M)); out None or a
        contiguous [R] ([R, K]) tensor of the compute dtype to write logp into and return;
        with_entropy True for `logp_entropy`.

        Returns (logp [R] or [R, K], entropy [R] or None, lse [R] float64), logp and entropy
        in the compute dtype."""
        ...


class LogpBackward(Protocol):
    """`logp` and `logp_entropy` backward."""

    def __call__(self, grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor,
                 tokens: Tensor, temperature: Temperature, ignore_index: int,
                 rows: Tensor | None, lse: Tensor, entropy: Tensor | None,
                 inplace: bool) -> Tensor:
        """grad_logp like logp, grad_entropy [R] or None; lse and entropy as the forward
        returned them; inplace True when the caller gave up `logits` (the gradient may be
        written into it and returned).

        Returns grad_logits [M, V] in logits' dtype (rows not computed are zero)."""
        ...


class EntropyForward(Protocol):
    """`entropy` forward (main input: `logits`)."""

    def __call__(self, logits: Tensor, temperature: Temperature, mask: Tensor | None,
                 rows: Tensor | None, out: Tensor | None) -> tuple[Tensor, Tensor]:
        """logits, temperature, rows as for logp; mask None or bool [M] (False rows give 0 and
        are not read); out None or a contiguous [R] tensor of the compute dtype.

        Returns (entropy [R] in the compute dtype, lse [R] float64)."""
        ...


class EntropyBackward(Protocol):
    """`entropy` backward."""

    def __call__(self, grad_entropy: Tensor, logits: Tensor, temperature: Temperature,
                 mask: Tensor | None, rows: Tensor | None, lse: Tensor, entropy: Tensor,
                 inplace: bool) -> Tensor:
        """Returns grad_logits [M, V] in logits' dtype (masked and uncomputed rows zero)."""
        ...


class LinearLogpForward(Protocol):
    """`linear_logp` and `linear_logp_entropy` forward (main input: `hidden`)."""

    def __call__(self, hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None,
                 temperature: Temperature, ignore_index: int, with_entropy: bool,
                 group: ProcessGroup | None,
                 softcap: float | None) -> tuple[Tensor, Tensor | None, Tensor]:
        """hidden [N, H], weight [V_local, H], bias [V_local] or None, one dtype (a kernel
        with the float32_weight property: weight and bias may be float32 beside a reduced
        hidden; the GEMMs run in hidden's dtype); tokens [N] int64 (global ids); temperature
        with logit_scale folded in; group None or the process group sharding `weight` by
        vocabulary; softcap None or a float > 0.

        Returns (logp [N] float32, entropy [N] float32 or None, lse [N] float64)."""
        ...


class LinearLogpBackward(Protocol):
    """`linear_logp` and `linear_logp_entropy` backward."""

    def __call__(self, grad_logp: Tensor, grad_entropy: Tensor | None, hidden: Tensor,
                 weight: Tensor, tokens: Tensor, bias: Tensor | None,
                 temperature: Temperature, ignore_index: int, group: ProcessGroup | None,
                 lse: Tensor, entropy: Tensor | None, needs_input_grad: tuple[bool, bool, bool],
                 softcap: float | None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """needs_input_grad: which of (hidden, weight, bias) want a gradient.

        Returns (grad_hidden, grad_weight, grad_bias), each None when not asked for, in the
        inputs' dtype (grad_weight accumulated in float32); grad_hidden may be float32, which
        the op rounds once to its caller's dtype."""
        ...


class LinearPolicyLossForward(Protocol):
    """`linear_policy_loss` forward (main input: `hidden`); it has no backward kernel."""

    def __call__(self, hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None,
                 temperature: Temperature, ignore_index: int, group: ProcessGroup | None,
                 softcap: float | None, entropy_coef: float, policy: Mapping[str, Any],
                 needs_input_grad: tuple[bool, bool, bool]) -> tuple[Tensor, ...]:
        """tokens [N] int64 with masked positions already ignore_index; policy: policy_loss's
        kernel arguments for a [B, T] logp (B * T = N), logp excluded.

        Returns (loss 0-d float32, metrics float32 [len(METRICS) + 1], logp [N] float32,
        grad_hidden, grad_weight, grad_bias), each gradient empty when not asked for."""
        ...


class PolicyLossForward(Protocol):
    """`policy_loss` forward (main input: `logp`)."""

    def __call__(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                 ref_logp: Tensor | None, rollout_logp: Tensor | None,
                 importance_weights: Tensor | None,
                 options: PolicyLossOptions) -> tuple[Tensor, Tensor]:
        """logp [B, T] (float32, bfloat16, float16, float64); old_logp, ref_logp, rollout_logp
        [B, T] of any float dtype; mask [B, T], nonzero = a real token; advantages and
        importance_weights [B] or [B, T].

        Returns (loss 0-d float32, metrics float32 [7] in METRICS order)."""
        ...


class PolicyLossBackward(Protocol):
    """`policy_loss` backward."""

    def __call__(self, grad_loss: Tensor, logp: Tensor, old_logp: Tensor, advantages: Tensor,
                 mask: Tensor, ref_logp: Tensor | None, rollout_logp: Tensor | None,
                 importance_weights: Tensor | None, options: PolicyLossOptions) -> Tensor:
        """Returns grad_logp [B, T] in logp's dtype."""
        ...


class GroupAdvantagesForward(Protocol):
    """`group_advantages` forward (main input: `rewards`); not differentiable."""

    def __call__(self, rewards: Tensor, group_ids: Tensor | None, group_size: int,
                 num_groups: int, options: GroupAdvantagesOptions) -> Tensor:
        """rewards [N] float32; group_ids [N] int64 in [0, num_groups), or None for
        consecutive groups of group_size.

        Returns advantages [N] float32."""
        ...


class SampleForward(Protocol):
    """`sample` (main input: `logits`); not differentiable."""

    def __call__(self, logits: Tensor, temperature: float, top_k: int, top_p: float,
                 min_p: float, seeds: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """logits [B, V]; temperature >= 0 (0 = greedy); top_k 0 = off; top_p in (0, 1]
        (1 = off); min_p in [0, 1) (0 = off); seeds int64 [B].

        Returns (tokens [B] int64, logp [B] float32, processed_logp [B] float32)."""
        ...


class TokenKlForward(Protocol):
    """`token_kl` forward (main input: `logp`)."""

    def __call__(self, logp: Tensor, ref_logp: Tensor, kl_estimator: str,
                 kl_clamp: float | None) -> tuple[Tensor]:
        """logp and ref_logp: one shape, float32, bfloat16, float16 or float64 (ref_logp
        detached); kl_estimator one of KL_ESTIMATORS; kl_clamp > 0 or None.

        Returns (value,): each element's KL estimate, float64 when an input is float64,
        else float32."""
        ...


class TokenKlBackward(Protocol):
    """`token_kl` backward."""

    def __call__(self, grad_value: Tensor, logp: Tensor, ref_logp: Tensor, kl_estimator: str,
                 kl_clamp: float | None) -> Tensor:
        """Returns grad_logp in logp's dtype: grad_value times the estimator's derivative
        (k2's for a "+" estimator, 0 where the clamp binds)."""
        ...


class DistributedLogpForward(Protocol):
    """`distributed_logp` and `distributed_logp_entropy` forward (main input: `logits`)."""

    def __call__(self, logits: Tensor, tokens: Tensor, temperature: Temperature,
                 ignore_index: int, group: ProcessGroup,
                 with_entropy: bool) -> tuple[Tensor, Tensor | None, Tensor]:
        """logits [N, V_local]: this rank's contiguous vocabulary slice; tokens [N] int64
        global ids and temperature, the same on every rank.

        Returns (logp [N] float32, entropy [N] float32 or None, lse [N] float64), the global
        values, on every rank."""
        ...


class DistributedLogpBackward(Protocol):
    """`distributed_logp` and `distributed_logp_entropy` backward."""

    def __call__(self, grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor,
                 tokens: Tensor, temperature: Temperature, ignore_index: int,
                 group: ProcessGroup, lse: Tensor, entropy: Tensor | None) -> Tensor:
        """Returns this rank's grad_logits [N, V_local] in logits' dtype."""
        ...
