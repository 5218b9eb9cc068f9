"""Conformance cases of `logp` and `logp_entropy`: shapes, temperatures, the gradient's
tolerance edges (dominant tokens), ignored and out-of-range tokens, non-finite rows, `rows`,
`out`, K tokens per row, strides and empty inputs."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from rlk._runtime import logits_args
from rlk._runtime import temperature as temperatures
from rlk._runtime.spec import Sample
from rlk._runtime.temperature import Temperature


def _random_logits(rows: int, vocab: int, dtype: torch.dtype, device: torch.device,
                   gen: torch.Generator, scale: float = 4.0) -> Tensor:
    values = torch.randn(rows, vocab, generator=gen, dtype=torch.float32) * scale
    return values.to(device=device, dtype=dtype)


def _random_tokens(rows: int, vocab: int, device: torch.device, gen: torch.Generator) -> Tensor:
    return torch.randint(0, max(vocab, 1), (rows,), generator=gen).to(device)


def dominant_logits(rows: int, vocab: int, dtype: torch.dtype, device: torch.device,
                    gen: torch.Generator, level: float,
                    margin: float) -> tuple[Tensor, Tensor]:
    """Logits near `level` whose token leads the rest by about `margin`: the gradient's
    tolerance edge, where 1 - p(token) is small against float32's spacing at level / T."""
    values = level + torch.randn(rows, vocab, generator=gen)
    tokens = torch.randint(0, vocab, (rows,), generator=gen)
    lead = margin + torch.rand(rows, generator=gen)
    values[torch.arange(rows), tokens] = values.amax(dim=1) + lead
    return values.to(device=device, dtype=dtype), tokens.to(device)


def samples_for(with_entropy: bool) -> Callable[[torch.device, torch.dtype], Iterator[Sample]]:
    """The conformance cases of logp (with_entropy False) or logp_entropy."""

    def samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
        gen = torch.Generator().manual_seed(1234)

        def case(name: str, rows: int, vocab: int, check_backward: bool = True, **extra: Any):
            args = {
                "logits": _random_logits(rows, vocab, dtype, device, gen),
                "tokens": _random_tokens(rows, vocab, device, gen),
                "temperature": 1.0,
                "ignore_index": -100,
                "rows": None,
                "out": None,
                "with_entropy": with_entropy,
            }
            args.update(extra)
            return Sample(name, args, check_backward)

        def dominant(name: str, rows: int, vocab: int, level: float, margin: float,
                     temperature: Temperature = 1.0) -> Sample:
            sample = case(name, rows, vocab, temperature=temperature)
            sample.args["logits"], sample.args["tokens"] = dominant_logits(
                rows, vocab, dtype, device, gen, level, margin)
            return sample

        yield case("small", 5, 11)
        yield case("wide-odd", 7, 1031)
        yield case("vocab-one", 3, 1)
        yield case("large-vocab", 4, 40_000)
        yield case("temperature", 6, 257, temperature=0.7)
        sample = case("per-row-temperature", 6, 129)
        sample.args["temperature"] = (
            torch.rand(6, generator=gen).to(device) * 1.5 + 0.25
        )
        yield sample
        # the gradient's tolerance edge: the token dominates and logits / T is large
        sample = case("dominant-token-issue-19", 1, 4)
        sample.args["logits"] = torch.tensor([[70.0, 63.0, 62.0, 60.0]], dtype=dtype,
                                             device=device)
        sample.args["tokens"] = torch.zeros(1, dtype=torch.int64, device=device)
        yield sample
        yield dominant("dominant-token", 8, 300, level=60.0, margin=9.0)
        yield dominant("dominant-token-wide", 3, 5000, level=40.0, margin=12.0)
        # every other term below float32's spacing at 1: a sum 1 + tail loses the tail
        yield dominant("dominant-token-large-vocab", 2, 65536, level=40.0, margin=17.0)
        yield dominant("dominant-token-cold", 8, 64, level=2.0, margin=1.0, temperature=0.125)
        sample = dominant("dominant-token-per-row-temperature", 6, 96, level=20.0, margin=2.0)
        sample.args["temperature"] = torch.tensor([0.25, 0.5, 0.125, 1.0, 0.3, 0.2],
                                                  device=device)
        yield sample
        # the smallest temperature: logits / T overflows float32 unless shifted first
        yield case("tiny-temperature", 5, 40, temperature=temperatures.MIN_TEMPERATURE)
        sample = case("invalid-temperature-rows", 6, 30, check_backward=False)
        sample.args["temperature"] = torch.tensor([1.0, math.nan, 0.5, math.nan, 2.0, 1.0],
                                                  device=device)
        yield sample
        sample = case("ignore-index", 8, 64)
        sample.args["tokens"][[1, 5]] = -100
        yield sample
        sample = case("ignore-index-custom", 4, 64, ignore_index=3)
        sample.args["tokens"][2] = 3
        yield sample
        sample = case("out-of-range", 6, 50, check_backward=False)
        sample.args["tokens"][[0, 4]] = torch.tensor([50, -7], device=device)
        yield sample
        sample = case("nan-row", 5, 33, check_backward=False)
        sample.args["logits"][2, 7] = float("nan")
        yield sample
        sample = case("neg-inf-row", 5, 33, check_backward=False)
        sample.args["logits"][1] = float("-inf")
        yield sample
        sample = case("partial-neg-inf", 5, 33)
        sample.args["logits"][3, :10] = float("-inf")
        sample.args["tokens"][3] = 20
        yield sample
        sample = case("rows", 9, 77)
        sample.args["rows"] = torch.tensor([8, 0, 3, 5], device=device)
        yield sample
        sample = case("rows-repeated", 6, 50)
        sample.args["rows"] = torch.tensor([3, 1, 3, 5, 3], device=device)
        yield sample
        sample = case("rows-empty", 4, 20)
        sample.args["rows"] = torch.zeros(0, dtype=torch.int64, device=device)
        yield sample
        sample = case("out", 6, 100, check_backward=False)
        sample.args["out"] = torch.empty(6, dtype=logits_args.compute_dtype(
            sample.args["logits"]), device=device)
        yield sample
        if not with_entropy:
            sample = case("tokens-per-row", 5, 70)
            tokens = torch.randint(0, 70, (5, 4), generator=gen)
            tokens[1, 2] = -100
            tokens[3, 1] = tokens[3, 0]
            sample.args["tokens"] = tokens.to(device)
            yield sample
        sample = case("non-contiguous", 6, 90)
        wide = _random_logits(6, 180, dtype, device, gen)
        sample.args["logits"] = wide[:, ::2]
        yield sample
        sample = case("transposed-storage", 5, 40)
        sample.args["logits"] = _random_logits(40, 5, dtype, device, gen).t()
        yield sample
        yield case("empty", 0, 16)
        yield case("empty-vocab", 0, 0)

    return samples
