"""A small tour of rlk's log-prob operators on random data: which backend ran, and the error
against a float64 reference. Runs on the CPU by default; pass --device cuda on a GPU machine."""

from __future__ import annotations

import argparse

import torch

import rlk
from rlk.ops.logp import reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32768)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    logits = (torch.randn(args.tokens, args.vocab, device=device) * 3).bfloat16()
    logits.requires_grad_(True)
    tokens = torch.randint(0, args.vocab, (args.tokens,), device=device)
    tokens[:8] = -100  # padding positions contribute nothing

    selection = rlk.explain("logp_entropy", logits, tokens, temperature=0.8)
    print(f"logp_entropy runs on backend '{selection.backend}'")
    for name, reason in selection.rejected.items():
        print(f"  not {name}: {reason}")
    logp, entropy = rlk.logp_entropy(logits, tokens, temperature=0.8)
    want_logp, want_entropy = reference.logp_entropy(logits.detach(), tokens, temperature=0.8)
    print(f"max |logp - float64|    = {(logp.double() - want_logp).abs().max().item():.2e}")
    print(f"max |entropy - float64| = {(entropy.double() - want_entropy).abs().max().item():.2e}")
    (logp.sum() - 0.01 * entropy.sum()).backward()
    assert logits.grad is not None
    print(f"gradient {tuple(logits.grad.shape)} {logits.grad.dtype}, "
          f"padding rows zero: {bool((logits.grad[:8] == 0).all())}")


if __name__ == "__main__":
    main()
