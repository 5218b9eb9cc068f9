"""Which request shape is faster for GRPO groups: G separate requests or one with n=G?

Runs both shapes on the same engine, same prompts and seeds, checks that the tokens are
identical, and prints the median wall time of each. It lives here, not in rlk.bench,
because rlk-core never imports vLLM. Entry point (CPU, tiny model):

    VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \\
        python benchmarks/vllm/request_mode.py --prompts 16 --group 8
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence

import torch

from rlk_vllm import RolloutExecutor, VLLMSamplerConfig
from rlk_vllm.tiny import save_tiny_llama


def request_mode(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", help="model path (default: a tiny random Llama)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(save_tiny_llama(tmp))
        config = VLLMSamplerConfig(
            model=model,
            num_generations=args.group,
            sampling_params={"temperature": 1.0, "max_tokens": args.max_tokens, "seed": 0,
                             "ignore_eos": True},
            engine_kwargs={"skip_tokenizer_init": True, "dtype": args.dtype,
                           "enforce_eager": True, "max_model_len": 512, "block_size": 32},
        )
        shared = RolloutExecutor(config)
        gen = torch.Generator().manual_seed(0)
        prompts = [{"prompt_token_ids": torch.randint(3, 500, (args.prompt_len,),
                                                      generator=gen).tolist()}
                   for _ in range(args.prompts)]
        times: dict[str, list[float]] = {"separate": [], "n": []}
        tokens: dict[str, torch.Tensor] = {}
        for rep in range(args.warmup + args.repeats):
            for mode in ("separate", "n") if rep % 2 else ("n", "separate"):
                executor = RolloutExecutor(
                    VLLMSamplerConfig(**{**config.__dict__, "request_mode": mode}),
                    llm=shared.llm,
                )
                shared.llm.reset_prefix_cache()
                start = time.perf_counter()
                batch = executor.generate(prompts, seed=1234)
                elapsed = time.perf_counter() - start
                if rep >= args.warmup:  # new batch shapes are slow the first time
                    times[mode].append(elapsed)
                tokens[mode] = batch.completion_ids
        same = torch.equal(tokens["separate"], tokens["n"])
        print(f"prompts={args.prompts} G={args.group} prompt_len={args.prompt_len} "
              f"max_tokens={args.max_tokens} identical_tokens={same}")
        for mode, values in times.items():
            print(f"  {mode:9s} median {statistics.median(values) * 1e3:8.1f} ms "
                  f"(min {min(values) * 1e3:.1f}, max {max(values) * 1e3:.1f}, n={len(values)})")
    return 0
