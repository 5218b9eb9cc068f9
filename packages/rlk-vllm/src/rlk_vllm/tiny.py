"""A tiny random Llama checkpoint made locally, for tests and CPU examples.

Nothing is downloaded: the model is built from a config with transformers and
saved with `save_pretrained`, so vLLM can load it with `skip_tokenizer_init=True`
and token prompts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
    # Large initial weights give peaked next-token distributions, like a trained model,
    # rather than the near-uniform ones of the default 0.02.
    "initializer_range": 0.2,
}


def save_tiny_llama(directory: str | Path, *, seed: int = 0, **overrides: Any) -> Path:
    """Create and save a random LlamaForCausalLM (float32) in `directory`; returns the path."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise ImportError("save_tiny_llama needs transformers: pip install transformers") from exc
    path = Path(directory)
    config = LlamaConfig(**{**TINY_CONFIG, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    return path


def load_tiny_llama(directory: str | Path) -> Any:
    """The saved checkpoint as a transformers model (float32, eval mode): the trainer's copy."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    return model
