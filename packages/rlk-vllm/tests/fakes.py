"""A fake vLLM engine with vLLM's call shapes, backed by a random bigram model.

The next-token logits after token t are `table[t]`, so a test can compute the exact
log-probs the "engine" should report, and a trainer-side forward is one index.
Sampling and child seeding follow vLLM: `n=G` children are seeded `seed + j`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

EOS = 2


@dataclass
class FakeSamplingParams:
    n: int = 1
    seed: int | None = None
    temperature: float = 1.0
    max_tokens: int = 16
    logprobs: int | None = None
    ignore_eos: bool = False
    top_p: float = 1.0
    detokenize: bool = True


@dataclass
class FakeLogprob:
    logprob: float


@dataclass
class FakeCompletion:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, FakeLogprob]] | None
    finish_reason: str
    text: str


@dataclass
class FakeRequestOutput:
    prompt_token_ids: list[int]
    outputs: list[FakeCompletion]
    num_cached_tokens: int


class FakeModel:
    """The engine's model: the bigram table, replaced by `reload_weights`."""

    def __init__(self, table: torch.Tensor):
        self.table = table

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in weights:
            assert name == "table", name
            self.table = tensor.clone()


@dataclass
class FakeLLM:
    table: torch.Tensor
    logprobs_mode: str = "processed_logprobs"
    drop_logprobs: bool = False
    refuse_reset: bool = False
    calls: list[tuple[list[Any], list[FakeSamplingParams]]] = field(default_factory=list)
    resets: int = 0

    def __post_init__(self) -> None:
        self.model = FakeModel(self.table)
        self._seen_prefixes: set[tuple[int, ...]] = set()

    def _tokens(self, prompt: Any) -> list[int]:
        text = prompt if isinstance(prompt, str) else prompt.get("prompt")
        if text is not None:  # a "tokenizer": one token per character
            return [3 + (ord(ch) % 30) for ch in text]
        return list(prompt["prompt_token_ids"])

    def _complete(self, prompt: list[int], params: FakeSamplingParams, seed: int | None,
                  index: int) -> FakeCompletion:
        gen = torch.Generator()
        gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**31, (1,))))
        last, tokens, logps = prompt[-1], [], []
        temp = params.temperature
        for _ in range(params.max_tokens):
            logits = self.model.table[last].double()
            scaled = logits if temp < 1e-5 or self.logprobs_mode == "raw_logprobs" else (
                logits / temp
            )
            if temp < 1e-5:
                token = int(logits.argmax())
            else:
                token = int(torch.multinomial((logits / temp).softmax(-1), 1, generator=gen))
            tokens.append(token)
            logps.append(float(scaled.log_softmax(-1)[token]))
            last = token
            if token == EOS and not params.ignore_eos:
                break
        finish = "stop" if tokens[-1] == EOS and not params.ignore_eos else "length"
        positions = None if self.drop_logprobs else [
            {t: FakeLogprob(v)} for t, v in zip(tokens, logps, strict=True)
        ]
        text = "".join(chr(97 + t % 26) for t in tokens) if params.detokenize else ""
        return FakeCompletion(index, tokens, positions, finish, text)

    def generate(self, prompts: list[Any], params: list[FakeSamplingParams],
                 use_tqdm: bool = True) -> list[FakeRequestOutput]:
        assert len(prompts) == len(params)
        self.calls.append((list(prompts), list(params)))
        outs = []
        for prompt, p in zip(prompts, params, strict=True):
            ids = self._tokens(prompt)
            key = tuple(ids)
            cached = len(ids) - 1 if key in self._seen_prefixes else 0
            self._seen_prefixes.add(key)
            comps = [
                self._complete(ids, p, None if p.seed is None else p.seed + j, j)
                for j in range(p.n)
            ]
            outs.append(FakeRequestOutput(ids, list(reversed(comps)), cached))
        return outs

    def collective_rpc(self, method: str, kwargs: dict[str, Any]) -> list[None]:
        assert method == "reload_weights", method
        self.model.load_weights(list(kwargs["weights_iterator"]))
        return [None]

    def reset_prefix_cache(self) -> bool:
        self.resets += 1
        self._seen_prefixes.clear()
        return not self.refuse_reset
