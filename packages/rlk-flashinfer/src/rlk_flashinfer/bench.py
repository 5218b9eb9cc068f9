"""Where the flashinfer backend's `sample` spends its time, stage by stage.

Times each stage of rlk_flashinfer.sampler on one batch (bf16, B=256, V=151936, T=0.8,
top-k 50, top-p 0.95, random seeds per row): logits of std 3, served from their shortlists,
and the same scaled by 0.02 under top-p alone, whose nuclei take the whole-vocabulary path;
then the whole call on each and plain sampling, beside FlashInfer's own sampler and
rlk.sample on the best installed backend. This module builds the calls; it lives here
because they reach this package's private stages, which rlk-core never imports. The entry
point, benchmarks/flashinfer/sample_stages.py, times them with rlk.bench.studies.host.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

import rlk
from rlk.backend import drawn_logp

DEVICE = torch.device("cuda")
BATCH, VOCAB = 256, 151936
TEMPERATURE, TOP_K, TOP_P = 0.8, 50, 0.95


def sample_stages() -> list[tuple[str, Callable[[], object]]]:
    """(name, call) of each stage, in order; needs FlashInfer and a CUDA device."""
    import flashinfer.sampling as fi

    from rlk_flashinfer import kernel, sampler, shortlist

    logits = (torch.randn(BATCH, VOCAB, device=DEVICE) * 3).to(torch.bfloat16)
    flat = logits * 0.02  # with top-p alone, nuclei far past the shortlist: whole vocabulary
    seeds = torch.randint(0, 2**62, (BATCH,), dtype=torch.int64, device=DEVICE)
    size = shortlist.size(VOCAB, TOP_K, TOP_P, 0.0) or VOCAB
    tokens = torch.empty(BATCH, dtype=torch.int64, device=DEVICE)
    processed = torch.empty(BATCH, dtype=torch.float32, device=DEVICE)
    stats = kernel.statistics(logits, TEMPERATURE)
    shortlists = sampler._shortlists(logits, size)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("chunk statistics (Triton)", lambda: kernel.statistics(logits, TEMPERATURE)),
        (f"flashinfer top_k (K={size}, unsorted, deterministic)",
         lambda: sampler._shortlists(logits, size)),
        ("per-row kernel, shortlist rows (Triton)", lambda: kernel.sample(
            logits, seeds, stats, shortlists, TEMPERATURE, TOP_K, TOP_P, 0.0, tokens,
            processed)),
        ("logp of the tokens (rlk.logp)", lambda: drawn_logp(logits, tokens, TEMPERATURE)),
    ]
    for name, rows, k, p in (("shortlist rows, top-k and top-p", logits, TOP_K, TOP_P),
                             ("flat rows, top-p alone (whole vocabulary)", flat, 0, TOP_P),
                             ("plain sampling", logits, 0, 1.0)):
        calls.append((f"whole call, {name}",
                      functools.partial(sampler.sample, rows, TEMPERATURE, k, p, 0.0, seeds)))
    calls.append(("FlashInfer's own sampler (softmax, top_k_top_p_sampling_from_probs; "
                  "tokens only)", lambda: fi.top_k_top_p_sampling_from_probs(
                      fi.softmax(logits, temperature=TEMPERATURE), TOP_K, TOP_P,
                      filter_apply_order="joint")))
    calls.append((f"rlk.sample on {rlk.explain('sample', logits).backend}, int seed",
                  lambda: rlk.sample(logits, temperature=TEMPERATURE, top_k=TOP_K,
                                     top_p=TOP_P, seed=1)))
    return calls
