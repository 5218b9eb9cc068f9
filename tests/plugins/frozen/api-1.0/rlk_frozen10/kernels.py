"""logp / logp_entropy kernels in plain torch, float32 arithmetic (plugin API 1.0)."""

import torch


def _scaled(logits, temperature, rows):
    x = logits.float()
    t = temperature
    if rows is not None:
        x = x[rows]
        if isinstance(t, torch.Tensor):
            t = t[rows]
    if isinstance(t, torch.Tensor):
        t = t.unsqueeze(1)
    return x / t, t


def logp_forward(logits, tokens, temperature, ignore_index, rows, out, with_entropy):
    x, _ = _scaled(logits, temperature, rows)
    tok = tokens if rows is None else tokens[rows]
    lse = torch.logsumexp(x, dim=1)
    log_probs = x - lse.unsqueeze(1)
    ignored = tok == ignore_index
    outside = (tok < 0) | (tok >= x.shape[1])
    picked = log_probs.gather(1, torch.where(outside, 0, tok).unsqueeze(1)).squeeze(1)
    logp = picked.masked_fill(outside, float("nan")).masked_fill(ignored, 0.0)
    entropy = None
    if with_entropy:
        p = log_probs.exp()
        entropy = -torch.where(p > 0, p * log_probs, 0.0).sum(dim=1)
        entropy = entropy.masked_fill(~torch.isfinite(lse), float("nan"))
        entropy = entropy.masked_fill(ignored, 0.0)
    if out is not None:
        logp = out.copy_(logp)
    return logp, entropy, lse


def logp_backward(grad_logp, grad_entropy, logits, tokens, temperature, ignore_index, rows,
                  lse, entropy, inplace):
    x, t = _scaled(logits, temperature, rows)
    tok = tokens if rows is None else tokens[rows]
    log_probs = x - lse.unsqueeze(1)
    p = log_probs.exp()
    grad = -p * grad_logp.unsqueeze(1)
    inside = (tok >= 0) & (tok < x.shape[1])
    grad.scatter_add_(1, torch.where(inside, tok, 0).unsqueeze(1),
                      torch.where(inside, grad_logp, 0.0).unsqueeze(1))
    if grad_entropy is not None:
        term = torch.where(p > 0, p * (log_probs + entropy.unsqueeze(1)), 0.0)
        grad = grad - term * grad_entropy.unsqueeze(1)
    grad = grad / t
    grad[tok == ignore_index] = 0.0
    if rows is None:
        result = grad
    else:
        result = torch.zeros(logits.shape, dtype=torch.float32)
        result[rows] = grad
    return result.to(logits.dtype)
