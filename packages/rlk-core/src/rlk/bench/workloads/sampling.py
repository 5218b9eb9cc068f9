"""`sample`: one token per row with top-k 50 and top-p 0.9, as a rollout engine draws them.

Sampling is random, so the check is by membership and by value: every returned token
must lie in the float64 top-k/top-p set of its row, and the log-probs returned with it
must match the float64 values for that token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rlk.bench import checks, peers
from rlk.bench.workload import (
    FORWARD,
    Call,
    Case,
    Cost,
    Error,
    Inputs,
    Outputs,
    Peer,
    Workload,
    element_size,
    rlk_function,
)

TEMPERATURE, TOP_K, TOP_P, MIN_P = 1.0, 50, 0.9, 0.0


def case(b: int, v: int, dtype: torch.dtype | None = None) -> Case:
    suffix = "" if dtype is None else f" {str(dtype).replace('torch.', '')}"
    return Case(f"B={b} V={v}{suffix}", {"B": b, "V": v}, dtype=dtype)


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, seed: int,
                backward: bool) -> Inputs:
    b, v = int(case.dims["B"]), int(case.dims["V"])
    gen = torch.Generator(device=device).manual_seed(seed)
    return {
        "logits": torch.randn(b, v, generator=gen, device=device, dtype=dtype).mul_(2.0),
        "seed": seed,  # an int, as trainers pass it: rlk derives the row seeds
        "check_rows": checks.check_rows(b, device, seed=0),
    }


def rlk_call(backward: bool) -> Call:
    sample = rlk_function("sample")

    def call(x: Inputs) -> Outputs:
        tokens, logp, processed = sample(x["logits"], temperature=TEMPERATURE, top_k=TOP_K,
                                         top_p=TOP_P, min_p=MIN_P, seed=x["seed"])
        return {"tokens": tokens, "logp": logp, "processed_logp": processed}

    return call


def eager_sample(logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Sort-based top-k/top-p in PyTorch, with the token's log-prob and processed log-prob."""
    log_probs = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)
    top, index = log_probs.topk(TOP_K, dim=-1)
    probs = top.exp()
    probs = probs / probs.sum(-1, keepdim=True)
    keep = (probs.cumsum(-1) - probs) < TOP_P
    kept = torch.where(keep, probs, 0.0)
    choice = torch.multinomial(kept, 1)
    tokens = index.gather(-1, choice).squeeze(-1)
    processed = (kept.gather(-1, choice) / kept.sum(-1, keepdim=True)).log().squeeze(-1)
    return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), processed


def _torch_peer(compile_it: bool) -> Peer:
    def build(case: Case, backward: bool, device: torch.device) -> Call:
        function: Callable[[Tensor], Any] = (
            peers.compiled(eager_sample) if compile_it else eager_sample)

        def call(x: Inputs) -> Outputs:
            tokens, logp, processed = function(x["logits"])
            return {"tokens": tokens, "logp": logp, "processed_logp": processed}

        return call

    return Peer("compile" if compile_it else "eager", build)


def _flashinfer(case: Case, backward: bool, device: torch.device) -> Call:
    sample = peers.load("flashinfer", "flashinfer.sampling", "top_k_top_p_sampling_from_logits",
                        device)
    return lambda x: {"tokens": sample(x["logits"], TOP_K, TOP_P)}


def expected(x: Inputs, backward: bool) -> dict[str, Tensor]:
    logits = x["logits"][x["check_rows"]]
    logp, keep = checks.kept_tokens(logits, TEMPERATURE, TOP_K, TOP_P, MIN_P)
    return {"logp": logp, "keep": keep, "processed_logp": checks.processed_logp(logp, keep)}


def compare(found: dict[str, Tensor], outputs: Outputs, x: Inputs) -> list[Error]:
    rows = x["check_rows"]
    tokens = outputs["tokens"][rows.to(outputs["tokens"].device)].to(torch.int64)
    vocab = found["keep"].shape[-1]
    inside = (tokens >= 0) & (tokens < vocab)
    safe = tokens.clamp(0, vocab - 1).unsqueeze(-1).to(found["keep"].device)
    valid = inside.to(safe.device) & found["keep"].gather(-1, safe).squeeze(-1)
    errors = [Error("tokens", 0.0, 0.0, invalid=int((~valid).sum()))]
    for name in ("logp", "processed_logp"):
        if name in outputs:
            want = found[name].gather(-1, safe).squeeze(-1)
            errors.append(checks.error(name, outputs[name][rows.to(outputs[name].device)], want))
    return errors


def cost(case: Case, dtype: torch.dtype, backward: bool) -> Cost:
    b, v = case.dims["B"], case.dims["V"]
    return Cost(b * v * element_size(dtype) + b * 24)


SAMPLE = Workload(
    name="sample", op="sample", modes=(FORWARD,),
    cases=(case(256, 151936, torch.float32), case(256, 151936)),
    smoke_cases=(case(8, 500, torch.float32),), inputs=make_inputs, rlk_call=rlk_call,
    reference=expected, compare=compare, cost=cost,
    peers={"eager": _torch_peer(False), "compile": _torch_peer(True),
           "flashinfer": Peer("flashinfer", _flashinfer, note="tokens only, no log-probs")},
    doc="rlk.sample: top_k=50, top_p=0.9, temperature 1, an int seed; returns logp too")
WORKLOADS = (SAMPLE,)
