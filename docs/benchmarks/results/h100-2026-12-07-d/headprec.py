"""The LM head's precision against float64 over the same bf16 operands: TRL's
ChunkedLogProbFunction, rlk.linear_logp_entropy as is, and with RLK_CUDA_BWD_LOGITS=gemm (the
backward of bf16_backward.patch). bf16 autocast over a float32 weight, logits of std ~3,
V=151936, upstream gradients on logp and entropy. Prints the largest |logp error| and the
relative Frobenius error of grad_hidden and grad_weight.
"""

import json
import os

import torch
from trl.kernels.chunked_logprob import ChunkedLogProbFunction

import rlk

VOCAB = 151936
CASES = [(4096, 896, 0), (4096, 896, 1), (2048, 1536, 2)]  # N, H, seed
device = torch.device("cuda")


def trl_head(hidden, weight, tokens):
    return ChunkedLogProbFunction.apply(hidden, weight, None, tokens, 1.0, 32768, None, 1.0,
                                        ("log_probs", "entropy"))[:2]


def rlk_head(hidden, weight, tokens):
    return rlk.linear_logp_entropy(hidden, weight, tokens)


def relative(found, reference):
    return ((found.double() - reference).norm() / reference.norm()).item()


def float64_reference(hidden, weight, tokens, upstream):
    """logp, grad_hidden, grad_weight in float64 from the bf16-rounded operands."""
    h64 = hidden.bfloat16().double().requires_grad_()
    w64 = weight.bfloat16().double().requires_grad_()
    logp_all = (h64 @ w64.t()).log_softmax(-1)
    logp = logp_all.gather(1, tokens[:, None])[:, 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    torch.autograd.backward((logp, entropy), tuple(u.double() for u in upstream))
    return logp.detach(), h64.grad, w64.grad


for num, width, seed in CASES:
    gen = torch.Generator(device=device).manual_seed(seed)
    weight = torch.randn(VOCAB, width, device=device, generator=gen) * (3 / width**0.5)
    hidden = torch.randn(num, width, device=device, generator=gen)
    tokens = torch.randint(0, VOCAB, (num,), device=device, generator=gen)
    upstream = (torch.randn(num, device=device, generator=gen),
                torch.randn(num, device=device, generator=gen) * 0.1)
    ref_logp, ref_grad_h, ref_grad_w = float64_reference(hidden, weight, tokens, upstream)
    for name, head, backward_logits in (("trl", trl_head, None), ("rlk", rlk_head, None),
                                        ("rlk-bf16-bwd", rlk_head, "gemm")):
        if backward_logits:
            os.environ["RLK_CUDA_BWD_LOGITS"] = backward_logits
        else:
            os.environ.pop("RLK_CUDA_BWD_LOGITS", None)
        h = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp, entropy = head(h, w, tokens)
        torch.autograd.backward((logp, entropy), upstream)
        print(json.dumps(dict(name=name, N=num, H=width, seed=seed,
                              logp_max_err=(logp.double() - ref_logp).abs().max().item(),
                              grad_h=relative(h.grad, ref_grad_h),
                              grad_w=relative(w.grad, ref_grad_w))), flush=True)
