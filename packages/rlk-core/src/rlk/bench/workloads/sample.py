"""`sample`: one token per row, as a rollout engine draws them, in the settings users run.

Each case names its filters: none (plain sampling at temperature 1, as on-policy RL rollouts
draw), top-k 50 with top-p 0.9 (a common default) and top-p 0.95 with min-p 0.05 (a common
reasoning-model setting), over batches of 64 to 1024 rows and
vocabularies of 128k and 256k, in every dtype of the run. Logits have a standard deviation
of 3 (language models emit 2 to 4; near-uniform logits would make every filter keep most
of the vocabulary), and every row has its own random seed, as a trainer that tracks
per-sequence seeds passes them.

Sampling is random, so the check is by membership and by value: every returned token
must lie in the float64 kept set of its row, and the log-probs returned with it must
match the float64 values for that token.
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

TEMPERATURE, LOGIT_STD = 1.0, 3.0
PLAIN = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
TOP_K_TOP_P = {"top_k": 50, "top_p": 0.9, "min_p": 0.0}
TOP_P_MIN_P = {"top_k": 0, "top_p": 0.95, "min_p": 0.05}


def case(b: int, v: int, filters: dict[str, float], dtype: torch.dtype | None = None) -> Case:
    """B rows of V logits under `filters` (the ones switched on are named in the label)."""
    named = " ".join(f"{name}={value:g}" for name, value in filters.items()
                     if value not in (0, 1.0)) or "no filter"
    suffix = "" if dtype is None else f" {str(dtype).replace('torch.', '')}"
    return Case(f"B={b} V={v} {named}{suffix}", {"B": b, "V": v, **filters}, dtype=dtype)


def _filters(x: Inputs | Case) -> dict[str, Any]:
    dims = x.dims if isinstance(x, Case) else x["filters"]
    return {"temperature": TEMPERATURE, "top_k": int(dims["top_k"]),
            "top_p": float(dims["top_p"]), "min_p": float(dims["min_p"])}


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, seed: int,
                backward: bool) -> Inputs:
    b, v = int(case.dims["B"]), int(case.dims["V"])
    gen = torch.Generator(device=device).manual_seed(seed)
    return {
        "logits": torch.randn(b, v, generator=gen, device=device, dtype=dtype).mul_(LOGIT_STD),
        "seed": torch.randint(-(2**62), 2**62, (b,), generator=gen, device=device),
        "filters": {k: case.dims[k] for k in ("top_k", "top_p", "min_p")},
        "check_rows": checks.check_rows(b, device, seed=0),
    }


def rlk_call(backward: bool) -> Call:
    sample = rlk_function("sample")

    def call(x: Inputs) -> Outputs:
        tokens, logp, processed = sample(x["logits"], seed=x["seed"], **_filters(x))
        return {"tokens": tokens, "logp": logp, "processed_logp": processed}

    return call


def eager_sample(logits: Tensor, temperature: float, top_k: int, top_p: float,
                 min_p: float) -> tuple[Tensor, Tensor, Tensor]:
    """Sort-based filters in PyTorch (top-k by torch.topk first when asked; no sort without a
    filter), with the token's log-prob and processed log-prob, as trainers without a fused
    sampler write it."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    if (top_k, top_p, min_p) == (0, 1.0, 0.0):  # no filter: no sort either
        tokens = torch.multinomial(log_probs.exp(), 1).squeeze(-1)
        logp = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return tokens, logp, logp
    if top_k > 0:
        top, index = log_probs.topk(top_k, dim=-1)
    else:
        top, index = log_probs.sort(dim=-1, descending=True)
    probs = top.exp()
    probs = probs / probs.sum(-1, keepdim=True)
    keep = (probs.cumsum(-1) - probs) < top_p
    if min_p > 0.0:
        keep &= probs >= min_p * probs[..., :1]
    kept = torch.where(keep, probs, 0.0)
    choice = torch.multinomial(kept, 1)
    tokens = index.gather(-1, choice).squeeze(-1)
    processed = (kept.gather(-1, choice) / kept.sum(-1, keepdim=True)).log().squeeze(-1)
    return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), processed


def _torch_peer(compile_it: bool) -> Peer:
    def build(case: Case, backward: bool, device: torch.device) -> Call:
        function: Callable[..., Any] = (
            peers.compiled(eager_sample) if compile_it else eager_sample)

        def call(x: Inputs) -> Outputs:
            tokens, logp, processed = function(x["logits"], **_filters(x))
            return {"tokens": tokens, "logp": logp, "processed_logp": processed}

        return call

    return Peer("compile" if compile_it else "eager", build)


def _flashinfer(case: Case, backward: bool, device: torch.device) -> Call:
    """FlashInfer as its users drive it: with no filter, its fused logits sampler (Gumbel-max,
    one pass); else as SGLang does, its softmax, then one fused rejection sampler (top-k and
    top-p jointly), or with min-p the renormalisations and the min-p sampler."""
    load = lambda name: peers.load("flashinfer", "flashinfer.sampling", name, device)  # noqa: E731
    filters = _filters(case)
    top_k, top_p, min_p = filters["top_k"], filters["top_p"], filters["min_p"]
    if (top_k, top_p, min_p) == (0, 1.0, 0.0):
        from_logits = load("sampling_from_logits")
        return lambda x: {"tokens": from_logits(x["logits"])}
    softmax = load("softmax")
    if min_p == 0.0:
        joint = load("top_k_top_p_sampling_from_probs")
        k = top_k or int(case.dims["V"])  # FlashInfer's joint sampler has no "off" for top-k
        return lambda x: {"tokens": joint(softmax(x["logits"], TEMPERATURE), k, top_p,
                                          filter_apply_order="joint")}
    top_k_renorm, top_p_renorm = load("top_k_renorm_probs"), load("top_p_renorm_probs")
    min_p_sample = load("min_p_sampling_from_probs")

    def call(x: Inputs) -> Outputs:
        probs = softmax(x["logits"], TEMPERATURE)
        if top_k > 0:
            probs = top_k_renorm(probs, top_k)
        if top_p < 1.0:
            probs = top_p_renorm(probs, top_p)
        return {"tokens": min_p_sample(probs, min_p)}

    return call


def expected(x: Inputs, backward: bool) -> dict[str, Tensor]:
    logits = x["logits"][x["check_rows"]]
    filters = _filters(x)
    logp, keep = checks.kept_tokens(logits, filters["temperature"], filters["top_k"],
                                    filters["top_p"], filters["min_p"])
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
    cases=tuple(case(b, v, filters) for filters in (PLAIN, TOP_K_TOP_P, TOP_P_MIN_P)
                for v in (128256, 256000) for b in (64, 256, 1024)),
    smoke_cases=(case(8, 500, TOP_P_MIN_P, torch.float32),),
    inputs=make_inputs, rlk_call=rlk_call, reference=expected, compare=compare, cost=cost,
    peers={"eager": _torch_peer(False), "compile": _torch_peer(True),
           "flashinfer": Peer("flashinfer", _flashinfer, note="tokens only, no log-probs")},
    doc="rlk.sample: no filter, top-k 50/top-p 0.9 and top-p 0.95/min-p 0.05, temperature 1, "
        "a random seed per row; returns logp and processed_logp too")
WORKLOADS = (SAMPLE,)
