"""Native logp, logp_entropy and entropy kernels: the math on row chunks of the logits.

The math is float32 (float64 for float64 logits). The log-sum-exp saved for the backward
is float64: the backward's log-probabilities t_j = x_j / T - lse need more than float32's
24 bits once x / T is large and one token dominates, since 1 - p_top is then far below
float32's spacing at lse. Each row splits the float64 lse into a pivot c (lse * T in the
compute dtype, close to the row's largest logit) and the small rest d = lse - c / T, and
computes t_j = (x_j - c) / T - d, so the subtraction that decides 1 - p_top is exact.
The forward's statistics keep the same precision (see _row_stats).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from rlk._runtime.chunks import rows_per_chunk
from rlk._runtime.logits_args import compute_dtype
from rlk._runtime.temperature import Temperature

# temporaries of the compute dtype alive at once per row: logits / T, probabilities, one more
_LIVE = 3


@dataclass(frozen=True)
class _Chunk:
    """Output slots [start, stop) and the logits rows they read (`index`; None: the slots
    themselves). A requested row outside the logits reads row 0 and is `lost`."""

    start: int
    stop: int
    index: Tensor | None = None
    lost: Tensor | None = None

    def take(self, tensor: Tensor) -> Tensor:
        if self.index is None:
            return tensor[self.start:self.stop]
        return tensor.index_select(0, self.index)

    def temperature(self, temperature: Temperature) -> Temperature:
        """The chunk's temperature: a float, or a [rows, 1] column."""
        if isinstance(temperature, Tensor):
            return self.take(temperature).unsqueeze(1)
        return temperature


def _chunks(total: int, num_rows: int, vocab: int, rows: Tensor | None,
            dtype: torch.dtype) -> Iterator[_Chunk]:
    step = rows_per_chunk(vocab, _LIVE * dtype.itemsize // 4)
    for start in range(0, total, step):
        stop = min(total, start + step)
        if rows is None:
            yield _Chunk(start, stop)
            continue
        wanted = rows[start:stop]
        present = (wanted >= 0) & (wanted < num_rows)
        yield _Chunk(start, stop, torch.where(present, wanted, 0), ~present)


def _divide(x: Tensor, temperature: Temperature) -> Tensor:
    if isinstance(temperature, Tensor) or temperature != 1.0:
        x.div_(temperature)
    return x


def _shifted(chunk: Tensor, shift: Tensor) -> Tensor:
    """chunk - shift as a fresh contiguous tensor of shift's dtype, in one pass: a row's
    bits must not depend on the strides of the logits it came from."""
    out = torch.empty(chunk.shape, dtype=shift.dtype, device=chunk.device)
    if chunk.dtype == shift.dtype:
        return torch.sub(chunk, shift, out=out)
    return out.copy_(chunk).sub_(shift)  # torch's mixed-dtype sub is the slower path


def _over_temperature(values: Tensor, temperature: Temperature) -> Tensor:
    """values / T in float64, per row ([rows] values, T a float or a [rows, 1] column)."""
    wide = values.to(torch.float64)
    if isinstance(temperature, Tensor):
        return wide / temperature.squeeze(1).to(torch.float64)
    return wide / temperature


@dataclass(frozen=True)
class _RowStats:
    """A chunk's log-probabilities at the asked columns (compute dtype), and each row's
    float64 log-sum-exp and entropy."""

    log_probs: Tensor
    lse: Tensor
    entropy: Tensor | None


def _row_stats(chunk: Tensor, temperature: Temperature, dtype: torch.dtype, columns: Tensor,
               with_entropy: bool) -> _RowStats:
    """Softmax statistics of chunk / T, exact to the compute dtype where one token dominates.

    Each row's largest logit is subtracted first (dividing by T < 1 cannot overflow then),
    so its largest entry is 0 and its exponential exactly 1. The sum leaves that 1 out and
    takes log1p of the rest: a sum 1 + rest in the compute dtype loses every term below its
    spacing at 1, which is all of a confident prediction's tail over a large vocabulary
    (torch's log_softmax does).
    """
    values, top_column = chunk.max(dim=1, keepdim=True)
    top = values.to(dtype)
    finite = torch.isfinite(top)
    shift = torch.where(finite, top, 0.0)
    x = _divide(_shifted(chunk, shift), temperature)
    picked = x.gather(1, columns)
    exps = x.exp() if with_entropy else x.exp_()
    rest = exps.scatter_(1, top_column, 0.0).sum(dim=1, keepdim=True)
    log_sum = torch.log1p(rest)
    entropy = None
    if with_entropy:  # H = log_sum - sum_j p_j x_j with p_j = exp_j / (1 + rest)
        vanished = exps == 0  # exp * x is 0 there, also where x = -inf
        weighted = exps.mul_(x).masked_fill_(vanished, 0.0).sum(dim=1, keepdim=True)
        entropy = (log_sum - weighted / (1.0 + rest)).squeeze(1)
    # each row's largest x is 0, or its non-finite top / T (no shift then)
    x_top = _over_temperature(torch.where(finite, 0.0, top).squeeze(1), temperature)
    lse = x_top + log_sum.squeeze(1).to(torch.float64)
    # an all -inf row has logsumexp -inf (vocabulary shards rely on it), not NaN
    lse = torch.where(x_top == -math.inf, x_top, lse)
    lse += _over_temperature(shift.squeeze(1), temperature)
    return _RowStats(picked.sub_(log_sum), lse, entropy)


def _log_probs(chunk: Tensor, temperature: Temperature, lse: Tensor,
               dtype: torch.dtype) -> Tensor:
    """t = chunk / T - lse (in `dtype`) from a saved log-sum-exp, float64 or float32."""
    wide = lse.to(torch.float64).unsqueeze(1)
    scale = temperature.to(torch.float64) if isinstance(temperature, Tensor) else temperature
    pivot = (wide * scale).to(dtype)
    rest = (wide - pivot.to(torch.float64) / scale).to(dtype)
    return _divide(_shifted(chunk, pivot), temperature).sub_(rest)


def _columns(tokens: Tensor) -> Tensor:
    """Tokens as [rows, K]: one column when the op gathers one token per row."""
    return tokens.unsqueeze(1) if tokens.dim() == 1 else tokens


def _in_vocab(tokens: Tensor, vocab: int) -> tuple[Tensor, Tensor]:
    """Which tokens lie in [0, vocab), and the tokens with the others replaced by 0."""
    valid = (tokens >= 0) & (tokens < vocab)
    return valid, torch.where(valid, tokens, 0)


def forward(logits: Tensor, tokens: Tensor, temperature: Temperature, ignore_index: int,
            rows: Tensor | None, out: Tensor | None,
            with_entropy: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """logp of `tokens` ([M], or [M, K] for K tokens a row) under softmax(logits / T),
    the entropy of that softmax when asked, and the float64 log-sum-exp."""
    num_rows, vocab = logits.shape
    total = num_rows if rows is None else rows.shape[0]
    dtype = compute_dtype(logits)
    device = logits.device
    logp = torch.empty((total, *tokens.shape[1:]), dtype=dtype, device=device) \
        if out is None else out
    logp_rows = logp.view(total, tokens.shape[1] if tokens.dim() == 2 else 1)
    entropy = torch.empty(total, dtype=dtype, device=device) if with_entropy else None
    lse = torch.empty(total, dtype=torch.float64, device=logits.device)
    if num_rows == 0:  # every requested row is missing
        for result in (logp, entropy, lse):
            if result is not None:
                result.fill_(math.nan)
        return logp, entropy, lse
    for chunk in _chunks(total, num_rows, vocab, rows, dtype):
        tok = _columns(chunk.take(tokens))
        valid, safe = _in_vocab(tok, vocab)
        stats = _row_stats(chunk.take(logits), chunk.temperature(temperature), dtype, safe,
                           entropy is not None)
        chunk_lse = stats.lse
        if chunk.lost is not None:
            chunk_lse.masked_fill_(chunk.lost, math.nan)
        usable = valid & torch.isfinite(chunk_lse).unsqueeze(1)
        picked = torch.where(usable, stats.log_probs, math.nan)
        ignored = tok == ignore_index
        logp_rows[chunk.start:chunk.stop] = picked.masked_fill_(ignored, 0.0)
        lse[chunk.start:chunk.stop] = chunk_lse
        if entropy is not None and stats.entropy is not None:
            ent = torch.where(torch.isfinite(chunk_lse), stats.entropy, math.nan)
            entropy[chunk.start:chunk.stop] = ent.masked_fill_(ignored.all(dim=1), 0.0)
    return logp, entropy, lse


@dataclass(frozen=True)
class _Upstream:
    """What the backward needs per logits row, gathered once from the selected rows.

    A row selected twice gets the sum of both upstream gradients (as `logits[rows]` in
    torch). `index` maps each selected slot to its logits row, or to row M (a sink past
    the logits, dropped at the end) for rows that do not exist.
    """

    grad_logp: Tensor
    grad_entropy: Tensor | None
    lse: Tensor
    entropy: Tensor | None
    index: Tensor | None

    @staticmethod
    def of(grad_logp: Tensor, grad_entropy: Tensor | None, lse: Tensor,
           entropy: Tensor | None, rows: Tensor | None, num_rows: int) -> _Upstream:
        if rows is None:
            return _Upstream(grad_logp, grad_entropy, lse, entropy, None)
        index = torch.where((rows >= 0) & (rows < num_rows), rows, num_rows)

        def summed(values: Tensor) -> Tensor:
            full = values.new_zeros((num_rows + 1, *values.shape[1:]))
            return full.index_add_(0, index, values)

        def copied(values: Tensor) -> Tensor:
            full = values.new_zeros(num_rows + 1)  # repeats carry equal values: keep the max
            return full.scatter_reduce_(0, index, values, "amax", include_self=False)

        return _Upstream(summed(grad_logp),
                         None if grad_entropy is None else summed(grad_entropy),
                         copied(lse), None if entropy is None else copied(entropy), index)


def _entropy_term(log_p: Tensor, probs: Tensor, entropy: Tensor, g_ent: Tensor) -> Tensor:
    """g_ent * p_j (log p_j + entropy), written over `log_p`; 0 where p_j == 0.

    (d entropy / d x_j = -p_j (log p_j + entropy).)"""
    term = log_p.add_(entropy).mul_(probs).masked_fill_(probs == 0, 0.0)
    return term.mul_(g_ent)


def _row_grads(log_p: Tensor, tokens: Tensor, g_logp: Tensor, g_ent: Tensor | None,
               entropy: Tensor | None) -> tuple[Tensor, Tensor]:
    """Gradient w.r.t. x = logits / T of sum_k g_k logp_k + g_ent * entropy (consuming
    `log_p`), and which tokens were in the vocabulary.

    At the token of a one-token row, 1 - p comes from expm1(log p): a token whose p is
    close to 1 keeps its relative precision instead of float32's spacing below 1.
    """
    valid, safe = _in_vocab(tokens, log_p.shape[1])
    at_token = None
    if tokens.shape[1] == 1:
        t_token = log_p.gather(1, safe)
        at_token = torch.expm1(t_token).mul_(g_logp.neg())
        if g_ent is not None and entropy is not None:
            at_token.sub_(_entropy_term(t_token.clone(), t_token.exp(), entropy, g_ent))
    coefficient = g_logp.sum(dim=1, keepdim=True).neg()
    if g_ent is None or entropy is None:
        grad = log_p.exp_().mul_(coefficient)
    else:
        probs = log_p.exp()
        grad = probs * coefficient
        grad.sub_(_entropy_term(log_p, probs, entropy, g_ent))
    if at_token is None:
        grad.scatter_add_(1, safe, torch.where(valid, g_logp, 0.0))
    else:
        grad.scatter_(1, safe, at_token)
    return grad, valid


def _pick(values: Tensor, start: int, stop: int, index: Tensor | None) -> Tensor:
    """A per-slot tensor's values for output slots [start, stop): by slot, or through the
    row each slot reads when the upstream was gathered per logits row."""
    return values[start:stop] if index is None else values.index_select(0, index[start:stop])


def backward(grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor, tokens: Tensor,
             temperature: Temperature, ignore_index: int, rows: Tensor | None, lse: Tensor,
             entropy: Tensor | None, inplace: bool) -> Tensor:
    """Gradient w.r.t. logits of sum(grad_logp * logp + grad_entropy * entropy).

    Rows without upstream gradient (or ignored) get zeros; a row with a token outside
    the vocabulary, or with a non-finite log-sum-exp, gets NaN.
    """
    num_rows, vocab = logits.shape
    dtype = compute_dtype(logits)
    if rows is None:
        grad = logits if inplace else torch.empty_like(logits)
    else:  # row M of the buffer is the sink for rows that do not exist
        grad = logits.new_zeros(num_rows + 1, vocab)
    upstream = _Upstream.of(grad_logp, grad_entropy, lse, entropy, rows, num_rows)
    total = num_rows if rows is None else rows.shape[0]
    for chunk in _chunks(total, num_rows, vocab, rows, dtype):
        slot = (chunk.start, chunk.stop, upstream.index)
        temp = chunk.temperature(temperature)
        log_p = _log_probs(chunk.take(logits), temp, _pick(upstream.lse, *slot), dtype)
        tok = _columns(chunk.take(tokens))
        ignored = tok == ignore_index
        g_logp = _columns(_pick(upstream.grad_logp, *slot)).to(dtype).masked_fill(ignored, 0.0)
        quiet = (g_logp == 0).all(dim=1)
        g_ent = entropy_now = None
        if upstream.grad_entropy is not None and upstream.entropy is not None:
            g_ent = _pick(upstream.grad_entropy, *slot).to(dtype).unsqueeze(1)
            entropy_now = _pick(upstream.entropy, *slot).to(dtype).unsqueeze(1)
            quiet &= g_ent.squeeze(1) == 0
        chunk_grad, valid = _row_grads(log_p, tok, g_logp, g_ent, entropy_now)
        _divide(chunk_grad, temp)
        finite = torch.isfinite(_pick(upstream.lse, *slot))
        broken = (~valid & ~ignored).any(dim=1) | ~finite
        chunk_grad.masked_fill_(broken.unsqueeze(1), math.nan)
        chunk_grad.masked_fill_((quiet | ignored.all(dim=1)).unsqueeze(1), 0.0)
        if upstream.index is None:
            grad[chunk.start:chunk.stop] = chunk_grad
        else:  # a repeated row computes the same values each time
            grad.index_copy_(0, upstream.index[chunk.start:chunk.stop], chunk_grad.to(grad.dtype))
    return grad if rows is None else grad[:num_rows]
