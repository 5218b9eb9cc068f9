"""The loop of linear_policy_loss: the LM head and the policy loss in three GEMMs per row chunk.

Each row chunk's float32 logits are computed once. The selected logp kernel reduces them to
logp, entropy and log-sum-exp; policy_loss's per-token API gives d loss / d logp for the
chunk's tokens (the normalisers come from the whole mask, so the chunk's gradient is exact:
`LossGrads`); the logp kernel's backward turns the logits into d loss / d logits in place,
and two GEMMs fold that into grad_hidden (the chunk's rows) and grad_weight (accumulated).
The loss and metrics come from one policy_loss forward over every logp at the end. The
backward of the op then only scales these gradients by the upstream gradient of the loss.

Paths (`plan`): full row chunks, whatever the sequence boundaries, for losses whose token
gradient needs only that token ("tokens"); chunks of whole sequences for the other losses
when a sequence fits a chunk ("sequences"); otherwise ("two-pass", GSPO with sequences
longer than a chunk) logp of every row first and the gradients in a second pass over
recomputed logits: four GEMMs, through the selected linear_logp_entropy kernels.

`ChunkOps` is the part a GPU backend replaces (its logp kernels, buffers and accumulation);
`run` is the loop every backend shares (backends reach it as `rlk.backend.linear_policy_loop`;
the native kernel, `native.py`, runs it with torch's own ops).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlk._runtime import lm_head, shards
from rlk._runtime.chunks import rows_per_chunk
from rlk._runtime.temperature import Temperature
from rlk.ops.policy_loss import native as policy_losses
from rlk.ops.policy_loss.native import aggregation_weights, token_loss_and_grad

SEQUENCES, TOKENS, TWO_PASS = "sequences", "tokens", "two-pass"
GEMMS = {SEQUENCES: 3, TOKENS: 3, TWO_PASS: 4}
# Chunk-sized float32 buffers alive at once: the logits, the logp kernel's three temporaries,
# the soft-cap slope and the GEMM operand copy of the logits gradient.
_LIVE = 6


@dataclass
class Grads:
    """The gradient accumulators of one call (None: not wanted): grad_hidden (the rows'
    gradients are written in place), the weight's accumulator (ChunkOps.new_weight_grad) and
    a float32 bias gradient."""

    hidden: Tensor | None
    weight: Tensor | None
    bias: Tensor | None


@dataclass
class _SavedRows:
    """What ChunkOps.forward_rows keeps for backward_rows."""

    start: int
    stop: int
    tokens: Tensor
    temperature: Temperature
    ignore_index: int
    logits: Tensor
    lse: Tensor
    entropy: Tensor


def _token_separable(policy: Mapping[str, Any]) -> bool:
    """Whether d loss / d logp_t needs only token t and the mask (sequence-level ratios and
    VESPO's sequence weight need the whole sequence first)."""
    return not policy["options"].needs_sequence_pass


def choose_path(rows: int, length: int, chunk_rows: int, policy: Mapping[str, Any]) -> str:
    """The path for [B, T] = [rows / length, length] tokens and chunks of `chunk_rows` rows.

    A token-level loss fills every chunk: chunks cut at sequence boundaries would leave rows
    of the budget unused, and each extra chunk costs a pass over the weight's gradient."""
    if rows == 0:
        return SEQUENCES
    if _token_separable(policy):
        return TOKENS
    return SEQUENCES if length <= chunk_rows else TWO_PASS


@dataclass
class ChunkOps:
    """How one row chunk's float32 logits become statistics and a gradient (native: the
    dispatcher's logp kernels; float32 weight-gradient accumulation)."""

    hidden: Tensor
    weight: Tensor
    bias: Tensor | None
    softcap: float | None
    group: dist.ProcessGroup | None

    def __post_init__(self) -> None:
        self._kernel: Any = None
        self._saved: _SavedRows | None = None

    @functools.cached_property
    def operand(self) -> Tensor:
        """The weight as the GEMMs read it (rlk._runtime.lm_head.gemm_weight): in hidden's
        dtype, made once."""
        return lm_head.gemm_weight(self.weight, self.hidden.dtype)

    @functools.cached_property
    def operand_bias(self) -> Tensor | None:
        """The bias as the logits add it: rounded as `operand` is."""
        return None if self.bias is None else lm_head.gemm_weight(self.bias, self.hidden.dtype)

    @functools.cached_property
    def shard(self) -> shards.Layout | None:
        """Where this rank's vocabulary slice sits (one all_gather), with a group."""
        if self.group is None:
            return None
        return shards.layout(self.weight.shape[0], self.group, self.hidden.device)

    @property
    def vocab(self) -> int:
        """The whole vocabulary: chunks are sized by it, so every rank of a group cuts the
        same row chunks and runs the same collectives."""
        return self.weight.shape[0] if self.shard is None else self.shard.total

    def chunk_rows(self) -> int:
        return rows_per_chunk(self.vocab + 1, _LIVE)

    def logits(self, start: int, stop: int, pad: bool) -> Tensor:
        """Float32 (capped) logits of rows [start, stop); `pad` adds a -inf column."""
        vocab = self.weight.shape[0]
        out = torch.empty(stop - start, vocab + int(pad), dtype=torch.float32,
                          device=self.hidden.device)
        lm_head.float32_logits(self.hidden[start:stop], self.operand, self.operand_bias,
                               out=out[:, :vocab])
        lm_head.soft_cap_(out[:, :vocab], self.softcap)
        if pad:
            out[:, -1] = -torch.inf
        return out

    def _logp_kernel(self, logits: Tensor, tokens: Tensor, temperature: Temperature,
                     ignore_index: int) -> Any:
        if self._kernel is None:
            from rlk.ops.logp.op import LOGP_ENTROPY

            self._kernel = LOGP_ENTROPY.kernel({
                "logits": logits, "tokens": tokens, "temperature": temperature,
                "ignore_index": ignore_index, "rows": None, "out": None, "with_entropy": True})
        return self._kernel

    def stats(self, logits: Tensor, tokens: Tensor, temperature: Temperature,
              ignore_index: int) -> tuple[Tensor, Tensor, Tensor]:
        """(logp, entropy, lse) of the chunk's rows (all float32)."""
        kernel = self._logp_kernel(logits, tokens, temperature, ignore_index)
        logp, entropy, lse = kernel.forward(logits, tokens, temperature, ignore_index, None,
                                            None, True)
        return logp, entropy, lse

    def logits_grad(self, logits: Tensor, tokens: Tensor, grad_logp: Tensor,
                    grad_entropy: Tensor | None, lse: Tensor, entropy: Tensor,
                    temperature: Temperature, ignore_index: int) -> Tensor:
        """d loss / d (raw logits) of the chunk, in the GEMM operand dtype."""
        vocab = self.weight.shape[0]
        slope = (None if self.softcap is None
                 else lm_head.soft_cap_slope(logits[:, :vocab], self.softcap,
                                             tokens == ignore_index))
        kernel = self._logp_kernel(logits, tokens, temperature, ignore_index)
        grad = kernel.backward(grad_logp, grad_entropy, logits, tokens, temperature,
                               ignore_index, None, lse, entropy, True)[:, :vocab]
        if slope is not None:
            grad.mul_(slope)
        return grad.to(self.operand.dtype)

    def forward_rows(self, start: int, stop: int, tokens: Tensor, temperature: Temperature,
                     ignore_index: int) -> tuple[Tensor, Tensor]:
        """(logp, entropy) of rows [start, stop); what backward_rows needs stays with `self`."""
        logits = self.logits(start, stop, pad=self.group is not None)
        logp, entropy, lse = _merged_stats(self, logits, tokens, temperature, ignore_index)
        self._saved = _SavedRows(start, stop, tokens, temperature, ignore_index, logits, lse,
                                 entropy)
        return logp, entropy

    def backward_rows(self, grad_logp: Tensor, grad_entropy: Tensor | None,
                      grads: Grads) -> None:
        """Fold d loss / d (logp, entropy) of the rows of the last forward_rows into `grads`."""
        saved = self._saved
        assert saved is not None, "backward_rows follows forward_rows"
        self._saved = None
        codes, code_ignore = _grad_codes(self, saved.tokens, saved.ignore_index)
        grad = self.logits_grad(saved.logits, codes, grad_logp, grad_entropy, saved.lse,
                                saved.entropy, saved.temperature, code_ignore)
        rows = slice(saved.start, saved.stop)
        if grads.hidden is not None:
            self.hidden_grad(grad, grads.hidden[rows])
        if grads.weight is not None:
            # ignored rows have a zero logits gradient; their hidden state may be NaN
            ignored = (saved.tokens == saved.ignore_index).unsqueeze(1)
            self.add_weight_grad(grads.weight, grad,
                                 self.hidden[rows].masked_fill(ignored, 0.0))
        if grads.bias is not None:
            grads.bias += grad.sum(dim=0, dtype=torch.float32)

    def new_weight_grad(self) -> Tensor:
        return torch.zeros(self.weight.shape, dtype=torch.float32, device=self.weight.device)

    def add_weight_grad(self, acc: Tensor, grad: Tensor, rows: Tensor) -> None:
        acc.addmm_(grad.t().float(), rows.float())

    def weight_grad(self, acc: Tensor) -> Tensor:
        return acc

    def hidden_grad(self, grad: Tensor, out: Tensor) -> None:
        """out = grad @ weight, the chunk's rows of grad_hidden (float32), by the logits'
        float32-output GEMM."""
        lm_head.float32_logits(grad, self.operand.t(), None, out=out)

    def loss_grads(self, policy: Mapping[str, Any], entropy_coef: float) -> LossGrads:
        """The loss's token gradients: policy_loss's native per-token functions."""
        return LossGrads(policy, entropy_coef)


def _chunks(rows: int, step: int) -> Iterator[tuple[int, int]]:
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def _slice(temperature: Temperature, start: int, stop: int) -> Temperature:
    return temperature[start:stop] if isinstance(temperature, Tensor) else temperature


class LossGrads:
    """d loss / d logp and d loss / d entropy of a chunk's tokens, at grad_loss = 1.

    `kernel` is a policy_loss kernel (forward, backward; native's by default). Token-level
    options: rlk.ops.policy_loss.native.token_loss_and_grad on the chunk's tokens alone (their
    aggregation weights come from the whole mask): O(N) work in all. With `whole_batch`, and
    always for options that need whole sequences: the kernel's backward over the whole
    batch, exact for the sequences whose every logp is already in `logp` (the chunk's),
    whatever the rest holds: O(N) per chunk, but two launches of a GPU kernel where the
    per-token functions take dozens of small ones.
    """

    def __init__(self, policy: Mapping[str, Any], entropy_coef: float,
                 kernel: Any = policy_losses, whole_batch: bool = False):
        self.policy = policy
        self.options = policy["options"]
        self.entropy_coef = entropy_coef
        self.kernel = kernel
        self.whole_batch = whole_batch or self.options.needs_sequence_pass
        mask = policy["mask"]
        self.weights = aggregation_weights(mask, self.options)
        self.per_token = {} if self.whole_batch else {
            name: None if policy[name] is None else _per_token(policy[name], mask.shape)
            for name in ("old_logp", "advantages", "mask", "ref_logp", "rollout_logp",
                         "importance_weights")}

    def __call__(self, logp: Tensor, start: int, stop: int) -> tuple[Tensor, Tensor | None]:
        """Gradients for rows [start, stop) of the flattened [B, T] `logp`."""
        if self.whole_batch:
            one = torch.ones((), dtype=torch.float32, device=logp.device)
            full = logp.view(self.policy["mask"].shape)
            grad = self.kernel.backward(one, full, **self.policy)
            grad_logp = grad.reshape(-1)[start:stop].float()
        else:
            def rows(name: str) -> Any:
                value = self.per_token[name]
                return None if value is None else value[start:stop]

            grad_logp = token_loss_and_grad(
                logp[start:stop], rows("old_logp"), rows("advantages"), rows("mask"),
                self.weights.reshape(-1)[start:stop], self.options, ref_logp=rows("ref_logp"),
                rollout_logp=rows("rollout_logp"),
                importance_weights=rows("importance_weights")).grad
        grad_entropy = None
        if self.entropy_coef != 0.0:
            grad_entropy = self.weights.reshape(-1)[start:stop] * -self.entropy_coef
        return grad_logp.contiguous(), grad_entropy

    def loss(self, logp: Tensor, entropy: Tensor) -> tuple[Tensor, Tensor]:
        """The loss and the metrics (policy_loss's, then the entropy's masked mean)."""
        shape = self.policy["mask"].shape
        logp, entropy = logp.view(shape), entropy.view(shape)
        loss, metrics = self.kernel.forward(logp, **self.policy)
        active = self.policy["mask"] != 0
        entropy_mean = torch.where(active, entropy, 0.0).sum() / active.sum().clamp(min=1)
        if self.entropy_coef != 0.0:
            loss = loss - self.entropy_coef * (self.weights * entropy).sum()
        return loss, torch.cat([metrics, entropy_mean.reshape(1)])


def _per_token(value: Tensor, shape: torch.Size) -> Tensor:
    """A [B], [B, 1] or [B, T] policy tensor as one value per flattened token."""
    if value.dim() == 1:
        value = value.unsqueeze(1)
    return value.expand(shape).reshape(-1)


def _merged_stats(ops: ChunkOps, logits: Tensor, tokens: Tensor, temperature: Temperature,
                  ignore_index: int) -> tuple[Tensor, Tensor, Tensor]:
    """The chunk's (logp, entropy, lse) over the whole vocabulary (merged across a group)."""
    group, shard = ops.group, ops.shard
    if group is None or shard is None:
        return ops.stats(logits, tokens, temperature, ignore_index)
    vocab = ops.weight.shape[0]
    codes, owned = shards.forward_tokens(tokens, shard)
    picked, entropy, lse = ops.stats(logits[:, :vocab], codes, temperature,
                                     shards.KERNEL_IGNORE)
    logp, merged, total = shards.merge(lse, entropy, picked, owned, tokens, shard,
                                            ignore_index, group)
    assert merged is not None
    return logp, merged, total


def _grad_codes(ops: ChunkOps, tokens: Tensor, ignore_index: int) -> tuple[Tensor, int]:
    if ops.shard is None:
        return tokens, ignore_index
    return (shards.backward_tokens(tokens, ops.shard, ignore_index),
            shards.KERNEL_IGNORE)


def run(ops: ChunkOps, tokens: Tensor, temperature: Temperature, ignore_index: int,
        entropy_coef: float, policy: Mapping[str, Any],
        needs_input_grad: tuple[bool, bool, bool]) -> tuple[Tensor, ...]:
    """The kernel contract of linear_policy_loss's forward (see rlk.ops.linear_policy_loss.op).

    `temperature` is the op's (before the soft cap folds into it): the two-pass path hands
    it to the linear_logp_entropy kernels, which fold the cap themselves; the chunk loop
    gives `ops` the kernels' temperature (rlk.backend.lm_head.kernel_temperature)."""
    hidden, weight, bias = ops.hidden, ops.weight, ops.bias
    want_h, want_w, want_b = needs_input_grad
    want_b = want_b and bias is not None
    length = policy["mask"].shape[1]
    rows = hidden.shape[0]
    device = hidden.device
    f32: dict[str, Any] = {"dtype": torch.float32, "device": device}
    logp, entropy = torch.zeros(rows, **f32), torch.zeros(rows, **f32)
    grads_of = ops.loss_grads(policy, entropy_coef)
    path = choose_path(rows, length, ops.chunk_rows(), policy)
    if path == TWO_PASS or not (want_h or want_w or want_b):
        return _two_pass(ops, tokens, temperature, ignore_index, grads_of,
                         (want_h, want_w, want_b))
    temperature = lm_head.kernel_temperature(temperature, ops.softcap)
    step = ops.chunk_rows() if path == TOKENS else max(1, ops.chunk_rows() // length) * length
    grads = Grads(
        hidden=torch.empty(hidden.shape, **f32) if want_h else None,
        weight=ops.new_weight_grad() if want_w else None,
        bias=torch.zeros(weight.shape[0], **f32) if want_b else None)
    for start, stop in _chunks(rows, step):
        logp[start:stop], entropy[start:stop] = ops.forward_rows(
            start, stop, tokens[start:stop], _slice(temperature, start, stop), ignore_index)
        ops.backward_rows(*grads_of(logp, start, stop), grads)
    if grads.hidden is not None and ops.group is not None:
        dist.all_reduce(grads.hidden, op=dist.ReduceOp.SUM, group=ops.group)
    grad_hidden, grad_weight, grad_bias = grads.hidden, grads.weight, grads.bias
    loss, metrics = grads_of.loss(logp, entropy)
    # grad_hidden and grad_bias in float32 (the op rounds them once, to its caller's dtypes)
    return (loss, metrics, logp, _or_empty(grad_hidden, hidden),
            _or_empty(None if grad_weight is None else ops.weight_grad(grad_weight), hidden),
            _or_empty(grad_bias, hidden))


def _or_empty(grad: Tensor | None, like: Tensor) -> Tensor:
    return like.new_empty(0) if grad is None else grad


def _two_pass(ops: ChunkOps, tokens: Tensor, temperature: Temperature, ignore_index: int,
              grads_of: LossGrads, needs_input_grad: tuple[bool, bool, bool]) -> tuple[Tensor, ...]:
    """logp of every row (selected linear_logp_entropy kernel), the loss and its token
    gradients, then the gradient pass over recomputed logits: four GEMMs."""
    from rlk.ops.linear_logp.op import LINEAR_LOGP_ENTROPY

    args = {"hidden": ops.hidden, "weight": ops.weight, "tokens": tokens, "bias": ops.bias,
            "temperature": temperature, "ignore_index": ignore_index, "with_entropy": True,
            "group": ops.group, "softcap": ops.softcap}
    kernel = LINEAR_LOGP_ENTROPY.kernel(args)
    logp, entropy, lse = kernel.forward(**args)
    assert entropy is not None
    loss, metrics = grads_of.loss(logp, entropy)
    hidden = ops.hidden
    if not any(needs_input_grad):
        return (loss, metrics, logp, *(hidden.new_empty(0) for _ in range(3)))
    grad_logp, grad_entropy = grads_of(logp, 0, logp.shape[0])
    if grad_entropy is None:  # the kernel's entropy gradient term is then skipped
        grad_entropy = torch.zeros_like(grad_logp)
    grads = kernel.backward(grad_logp, grad_entropy, hidden, ops.weight, tokens, ops.bias,
                            temperature, ignore_index, ops.group, lse, entropy,
                            needs_input_grad, ops.softcap)
    return (loss, metrics, logp, *(_or_empty(grad, hidden) for grad in grads))


def describe(path: str, chunk_rows: int, length: int) -> str:
    """One line on a path: what it chunks and how many GEMMs it costs."""
    what = {
        SEQUENCES: f"row chunks of whole sequences ({max(1, chunk_rows // max(length, 1))} of "
                   f"{length} tokens per chunk)",
        TOKENS: f"row chunks of {chunk_rows} tokens across sequences (token-level loss)",
        TWO_PASS: f"two passes: sequences of {length} tokens exceed a chunk of {chunk_rows} "
                  "rows and the loss needs whole sequences",
    }[path]
    return f"{path}: {what}; {GEMMS[path]} GEMMs"

