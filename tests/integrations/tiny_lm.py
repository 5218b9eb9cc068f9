"""A tiny random Qwen2 and a character tokenizer, made locally (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch

SYMBOLS = "0123456789+=."
SPECIAL = ("<pad>", "<eos>", "<unk>")


def tokenizer():
    """A character-level fast tokenizer: one token per symbol, pad 0, eos 1."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate((*SPECIAL, *SYMBOLS))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>",
                                   eos_token="<eos>", unk_token="<unk>")


def save_tiny_qwen2(directory: Path, *, seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    """Write a randomly initialised Qwen2 and its tokenizer to `directory` and return it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory
