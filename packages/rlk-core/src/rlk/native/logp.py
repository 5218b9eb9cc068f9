"""Native logp / logp_entropy kernels: float32 math on row chunks of the logits."""

from __future__ import annotations

import torch
from torch import Tensor

from rlk.native.chunks import rows_per_chunk
from rlk.ops.temperature import Temperature

# float32 temporaries alive at once per row: the scaled logits, exp/probabilities, one more.
_LIVE = 3


def _take(tensor: Tensor, start: int, stop: int, index: Tensor | None) -> Tensor:
    return tensor[start:stop] if index is None else tensor.index_select(0, index)


def _scaled(logits: Tensor, temperature: Temperature, start: int, stop: int,
            index: Tensor | None) -> Tensor:
    """A fresh float32 copy of the chunk's logits divided by the temperature."""
    x = _take(logits, start, stop, index).to(
        torch.float32, memory_format=torch.contiguous_format, copy=True
    )
    if isinstance(temperature, Tensor):
        x.div_(_take(temperature, start, stop, index).unsqueeze(1))
    elif temperature != 1.0:
        x.div_(temperature)
    return x


def _unscaled(temperature: Temperature) -> bool:
    return not isinstance(temperature, Tensor) and temperature == 1.0


def _chunk_input(logits: Tensor, temperature: Temperature, start: int, stop: int,
                 index: Tensor | None) -> Tensor:
    """The chunk's logits / T: a view (or gathered copy) when T is 1, else a float32 copy."""
    if _unscaled(temperature):
        return _take(logits, start, stop, index)
    return _scaled(logits, temperature, start, stop, index)


def _log_softmax(logits: Tensor, temperature: Temperature, start: int, stop: int,
                 index: Tensor | None) -> tuple[Tensor, Tensor]:
    """Float32 log-softmax of a chunk of logits / T, and its logsumexp.

    torch's fused log_softmax reads the chunk in few passes; the logsumexp follows from
    its largest entry, lse = x_top - log_p_top, without another pass over the row.
    """
    x = _chunk_input(logits, temperature, start, stop, index)
    log_probs = torch.log_softmax(x, dim=1, dtype=torch.float32)
    top = log_probs.argmax(dim=1, keepdim=True)
    x_top = x.gather(1, top).to(torch.float32)
    # an all -inf row has logsumexp -inf (vocabulary shards rely on it), not NaN
    lse = torch.where(x_top == -torch.inf, x_top, x_top - log_probs.gather(1, top)).squeeze(1)
    return log_probs, lse


def _picked(log_probs: Tensor, tokens: Tensor, vocab: int) -> tuple[Tensor, Tensor]:
    """log_probs at tokens, and which tokens were in range (others read index 0)."""
    valid = (tokens >= 0) & (tokens < vocab)
    safe = torch.where(valid, tokens, 0)
    return log_probs.gather(1, safe.unsqueeze(1)).squeeze(1), valid


def _chunks(total: int, vocab: int, rows: Tensor | None):
    step = rows_per_chunk(vocab, _LIVE)
    for start in range(0, total, step):
        stop = min(total, start + step)
        index = None if rows is None else rows[start:stop]
        yield start, stop, index


def forward(logits: Tensor, tokens: Tensor, temperature: Temperature, ignore_index: int,
            rows: Tensor | None, out: Tensor | None,
            with_entropy: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    num_rows, vocab = logits.shape
    total = num_rows if rows is None else rows.shape[0]
    device = logits.device
    logp = torch.empty(total, dtype=torch.float32, device=device) if out is None else out
    entropy = torch.empty(total, dtype=torch.float32, device=device) if with_entropy else None
    lse = torch.empty(total, dtype=torch.float32, device=device)
    for start, stop, index in _chunks(total, vocab, rows):
        x, chunk_lse = _log_softmax(logits, temperature, start, stop, index)
        tok = _take(tokens, start, stop, index)
        picked, valid = _picked(x, tok, vocab)
        finite = torch.isfinite(chunk_lse)
        picked = torch.where(valid & finite, picked, torch.nan)
        ignored = tok == ignore_index
        logp[start:stop] = picked.masked_fill(ignored, 0.0)
        lse[start:stop] = chunk_lse
        if entropy is not None:
            # p * log p is 0 where p == 0 (log p == -inf would give 0 * -inf = NaN)
            plogp = x.exp().mul_(x).masked_fill_(x == float("-inf"), 0.0)
            ent = torch.where(finite, -plogp.sum(dim=1), torch.nan)
            entropy[start:stop] = ent.masked_fill(ignored, 0.0)
    return logp, entropy, lse


def backward(grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor, tokens: Tensor,
             temperature: Temperature, ignore_index: int, rows: Tensor | None, lse: Tensor,
             entropy: Tensor | None, inplace: bool) -> Tensor:
    num_rows, vocab = logits.shape
    total = num_rows if rows is None else rows.shape[0]
    if inplace:
        grad = logits
    elif rows is None:
        grad = torch.empty_like(logits)
    else:
        grad = torch.zeros_like(logits)
    for start, stop, index in _chunks(total, vocab, rows):
        chunk_lse = lse[start:stop].unsqueeze(1)
        g_logp = grad_logp[start:stop].unsqueeze(1)
        if grad_entropy is None or entropy is None:
            # p from the given lse (it may be global across vocabulary shards), in place
            probs = _scaled(logits, temperature, start, stop, index).sub_(chunk_lse).exp_()
            chunk_grad = probs.mul_(g_logp.neg())
        else:
            x = _scaled(logits, temperature, start, stop, index)
            x.sub_(chunk_lse)  # log-probabilities
            probs = x.exp()
            chunk_grad = probs * g_logp.neg()
            # d entropy / d x_j = -p_j (log p_j + entropy); zero where p_j == 0
            term = x.add_(entropy[start:stop].unsqueeze(1)).mul_(probs)
            term.masked_fill_(probs == 0, 0.0)
            chunk_grad.sub_(term.mul_(grad_entropy[start:stop].unsqueeze(1)))
        tok = _take(tokens, start, stop, index)
        valid = (tok >= 0) & (tok < vocab)
        safe = torch.where(valid, tok, 0).unsqueeze(1)
        chunk_grad.scatter_add_(1, safe, torch.where(valid.unsqueeze(1), g_logp, 0.0))
        if isinstance(temperature, Tensor):
            chunk_grad.div_(_take(temperature, start, stop, index).unsqueeze(1))
        elif temperature != 1.0:
            chunk_grad.div_(temperature)
        bad = ~valid | ~torch.isfinite(chunk_lse.squeeze(1))
        chunk_grad[bad & (tok != ignore_index)] = torch.nan
        chunk_grad[tok == ignore_index] = 0.0
        if index is None:
            grad[start:stop] = chunk_grad
        else:
            grad.index_copy_(0, index, chunk_grad.to(grad.dtype))
    if inplace and rows is not None:
        untouched = torch.ones(num_rows, dtype=torch.bool, device=logits.device)
        untouched[rows] = False
        grad[untouched] = 0
    return grad
