"""Where the flashinfer backend's `sample` spends its time, stage by stage.

Times each FlashInfer call and each rlk step of both paths of rlk_flashinfer.sampler on one
batch (bf16, B=256, V=151936, T=0.8, top-k 50, top-p 0.95): logits of std 3, served from
their shortlists, and the same scaled by 0.02, whose top-p nuclei take the full-vocabulary
path; then the whole call on each, beside FlashInfer's own sampler and rlk.sample on the
best installed backend. Host time is the loop without a sync, wall time the loop drained.
  python benchmarks/flashinfer/sample_stages.py     (needs FlashInfer and a CUDA device)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import rlk
from rlk.bench.timing import host_and_wall_ms
from rlk.ops.sample import drawn_logp
from rlk_flashinfer import full_vocabulary, library, sampler, shortlist
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
    top_k = library.load_topk().top_k
    logits = (torch.randn(BATCH, VOCAB, device=DEVICE) * 3).to(torch.bfloat16)
    flat = logits * 0.02  # with top-p alone, nuclei far past the shortlist: full vocabulary
    random_seeds = torch.randint(0, 2**62, (BATCH,), dtype=torch.int64, device=DEVICE)
    consecutive = torch.arange(BATCH, dtype=torch.int64, device=DEVICE) + (1 << 40)
    u = uniforms(random_seeds, 2)
    size = shortlist.size(VOCAB, TOP_K, TOP_P, 0.0) or VOCAB
    values, indices = top_k(logits, size, sorted=True, deterministic=True)
    softmax = fi.softmax(flat, temperature=TEMPERATURE)  # the full-vocabulary stages
    renormed = fi.top_k_renorm_probs(softmax, TOP_K)
    top_p = full_vocabulary.top_p_renorm(fi, renormed, TOP_P)
    report(f"flashinfer top_k (K={size}, sorted, deterministic)",
           lambda: top_k(logits, size, sorted=True, deterministic=True))
    report("shortlist filters and draw", lambda: shortlist.sample(
        values, indices, VOCAB, TEMPERATURE, TOP_K, TOP_P, 0.0, None, u[:, 0]))
    report("flashinfer softmax", lambda: fi.softmax(flat, temperature=TEMPERATURE))
    report("flashinfer top_k_renorm_probs", lambda: fi.top_k_renorm_probs(softmax, TOP_K))
    report("flashinfer top_p_renorm_probs (deterministic)",
           lambda: full_vocabulary.top_p_renorm(fi, renormed, TOP_P))
    report("draw over the vocabulary (two-level inverse CDF)", lambda: draw(top_p, u))
    tokens, _ = draw(top_p, u)
    report("logp of the tokens (rlk.logp)", lambda: drawn_logp(logits, tokens, TEMPERATURE))
    for name, rows, k, seeds in (
            ("shortlist rows, consecutive seeds", logits, TOP_K, consecutive),
            ("shortlist rows, random seeds", logits, TOP_K, random_seeds),
            ("flat rows, top-p alone (full vocabulary), random seeds", flat, 0, random_seeds)):
        report(f"whole call, {name}", lambda r=rows, k=k, s=seeds: sampler.sample(
            r, TEMPERATURE, k, TOP_P, 0.0, s))
    report("FlashInfer's own sampler (softmax, top_k_top_p_sampling_from_probs; tokens only)",
           lambda: fi.top_k_top_p_sampling_from_probs(
               fi.softmax(logits, temperature=TEMPERATURE), TOP_K, TOP_P,
               filter_apply_order="joint"))
    report(f"rlk.sample on {rlk.explain('sample', logits).backend}, int seed",
           lambda: rlk.sample(logits, temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P,
                              seed=1))


if __name__ == "__main__":
    main()
