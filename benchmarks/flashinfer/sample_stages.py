"""Where the flashinfer backend's `sample` spends its time, stage by stage.

Times each FlashInfer call and each rlk step of rlk_flashinfer.sampler on one batch (bf16,
B=256, V=151936, T=0.8, top-k 50, top-p 0.95), then the whole call with row seeds that
share a launch key (rlk's default and int seeds) and with random ones (one launch per row),
beside rlk.sample on the best installed backend. Host time is the loop without a sync,
wall time the loop drained.
  python benchmarks/flashinfer/sample_stages.py     (needs FlashInfer and a CUDA device)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import rlk
from rlk.bench.timing import host_and_wall_ms
from rlk_flashinfer import library, sampler

DEVICE = torch.device("cuda")
BATCH, VOCAB = 256, 151936
TEMPERATURE, TOP_K, TOP_P = 0.8, 50, 0.95


def report(name: str, call: Callable[[], object], reps: int = 20) -> None:
    host, wall = host_and_wall_ms(call, reps, DEVICE)
    print(f"{name:44s} host {host:7.3f} ms  wall {wall:7.3f} ms")


def main() -> None:
    fi = library.load_sampling()
    logits = (torch.randn(BATCH, VOCAB, device=DEVICE) * 3).to(torch.bfloat16)
    shared_key = (torch.arange(BATCH, dtype=torch.int64) + (1 << 40)).tolist()
    random_seeds = torch.randint(0, 2**62, (BATCH,), dtype=torch.int64)
    softmax = fi.softmax(logits, temperature=TEMPERATURE)
    top_k = fi.top_k_renorm_probs(softmax, TOP_K)
    top_p = sampler._top_p_renorm(fi, top_k, TOP_P)
    tokens = sampler._draw(fi, top_p, shared_key, 0.0)
    report("flashinfer softmax", lambda: fi.softmax(logits, temperature=TEMPERATURE))
    report("flashinfer top_k_renorm_probs", lambda: fi.top_k_renorm_probs(softmax, TOP_K))
    report("flashinfer top_p_renorm_probs (deterministic)",
           lambda: sampler._top_p_renorm(fi, top_k, TOP_P))
    report("draw, 4 launches", lambda: sampler._draw(fi, top_p, shared_key, 0.0))
    report("kept mass", lambda: sampler._kept_log_mass(softmax, top_p, tokens, 0.0))
    report("logp of the tokens (rlk.logp)",
           lambda: sampler.drawn_logp(logits, tokens, TEMPERATURE))
    report("whole call, seeds sharing launch keys", lambda: sampler.sample(
        logits, TEMPERATURE, TOP_K, TOP_P, 0.0, torch.tensor(shared_key)))
    report("whole call, random seeds", lambda: sampler.sample(
        logits, TEMPERATURE, TOP_K, TOP_P, 0.0, random_seeds))
    report(f"rlk.sample on {rlk.explain('sample', logits).backend}, int seed",
           lambda: rlk.sample(logits, temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P,
                              seed=1))


if __name__ == "__main__":
    main()
