"""Where the flashinfer backend's `sample` spends its time, stage by stage.

Times each FlashInfer call and each rlk step of rlk_flashinfer.sampler on one batch (bf16,
B=256, V=151936, T=0.8, top-k 50, top-p 0.95), then the whole call with consecutive and with
random row seeds (the same launches either way), beside FlashInfer's own sampler and
rlk.sample on the best installed backend. Host time is the loop without a sync, wall time
the loop drained.
  python benchmarks/flashinfer/sample_stages.py     (needs FlashInfer and a CUDA device)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import rlk
from rlk.bench.timing import host_and_wall_ms
from rlk_flashinfer import library, sampler
from rlk_flashinfer.draw import draw
from rlk_flashinfer.seeds import uniforms

DEVICE = torch.device("cuda")
BATCH, VOCAB = 256, 151936
TEMPERATURE, TOP_K, TOP_P = 0.8, 50, 0.95


def report(name: str, call: Callable[[], object], reps: int = 20) -> None:
    host, wall = host_and_wall_ms(call, reps, DEVICE)
    print(f"{name:44s} host {host:7.3f} ms  wall {wall:7.3f} ms")


def main() -> None:
    fi = library.load_sampling()
    logits = (torch.randn(BATCH, VOCAB, device=DEVICE) * 3).to(torch.bfloat16)
    shared_key = torch.arange(BATCH, dtype=torch.int64, device=DEVICE) + (1 << 40)
    random_seeds = torch.randint(0, 2**62, (BATCH,), dtype=torch.int64, device=DEVICE)
    softmax = fi.softmax(logits, temperature=TEMPERATURE)
    top_k = fi.top_k_renorm_probs(softmax, TOP_K)
    top_p = sampler._top_p_renorm(fi, top_k, TOP_P)
    report("flashinfer softmax", lambda: fi.softmax(logits, temperature=TEMPERATURE))
    report("flashinfer top_k_renorm_probs", lambda: fi.top_k_renorm_probs(softmax, TOP_K))
    report("flashinfer top_p_renorm_probs (deterministic)",
           lambda: sampler._top_p_renorm(fi, top_k, TOP_P))
    report("row uniforms from the seeds", lambda: uniforms(random_seeds, 2))
    report("draw (two-level inverse CDF)", lambda: draw(top_p, uniforms(random_seeds, 2)))
    tokens, _ = draw(top_p, uniforms(random_seeds, 2))
    report("logp of the tokens (rlk.logp)",
           lambda: sampler.drawn_logp(logits, tokens, TEMPERATURE))
    for name, seeds in (("consecutive seeds", shared_key), ("random seeds", random_seeds)):
        report(f"whole call, {name}", lambda s=seeds: sampler.sample(
            logits, TEMPERATURE, TOP_K, TOP_P, 0.0, s))
    report("FlashInfer's own sampler (softmax, top_k_top_p_sampling_from_probs; tokens only)",
           lambda: fi.top_k_top_p_sampling_from_probs(
               fi.softmax(logits, temperature=TEMPERATURE), TOP_K, TOP_P,
               filter_apply_order="joint"))
    report(f"rlk.sample on {rlk.explain('sample', logits).backend}, int seed",
           lambda: rlk.sample(logits, temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P,
                              seed=1))


if __name__ == "__main__":
    main()
