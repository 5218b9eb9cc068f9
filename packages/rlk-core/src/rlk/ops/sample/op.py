"""`sample`: one token per row with temperature, top-k, top-p and min-p, seeded per row."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rlk._runtime import kernel_checks, validate
from rlk._runtime import temperature as temperatures
from rlk._runtime.contract import Out
from rlk._runtime.operator import Operator
from rlk._runtime.signature import Signature, plain
from rlk._runtime.spec import NativeKernel, OpSpec, Sample, Tolerance
from rlk.dispatch import ScopedPolicy, current_policy, get_dispatcher
from rlk.ops.sample import reference

_U64 = (1 << 64) - 1


class Sampled(NamedTuple):
    """What `sample` returns: tokens (int64, -1 for a row with no valid token), the
    token's logp under softmax(logits / T) (T = 1 when greedy) and its log-probability
    under the truncated, renormalised distribution (0 when greedy)."""

    tokens: Tensor
    logp: Tensor
    processed_logp: Tensor


def _mix64(value: int) -> int:
    """A 64-bit finaliser (splitmix64), so that nearby integer seeds share nothing."""
    z = (value + 0x9E3779B97F4A7C15) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    z ^= z >> 31
    return z - (1 << 64) if z >= 1 << 63 else z


def _seeds(seed: int | Tensor | None, lead: tuple[int, ...], device: torch.device) -> Tensor:
    """One int64 seed per row: given, derived from an int seed, or derived from one base drawn
    from torch's generator on the device (so CUDA graphs and torch.compile keep drawing fresh
    ones)."""
    if isinstance(seed, Tensor):
        validate.tensor("seed", seed, (torch.int64,))
        validate.shape("seed", seed, lead, " (one seed per row of logits)")
        if seed.device != device:
            raise ValueError(f"seed is on {seed.device} but logits is on {device}; "
                             "move them to one device")
        return seed.reshape(-1)
    base: int | Tensor
    if seed is None:
        base = torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)
    else:  # a Python or NumPy int; unrelated to the base of seed s + 1
        try:
            base = _mix64(validate.integer("seed", seed))
        except TypeError:
            raise TypeError("seed must be None, an int or an int64 tensor, got "
                            f"{type(seed).__name__}") from None
    return torch.arange(math.prod(lead), dtype=torch.int64, device=device) ^ base


def _prepare(logits: Tensor, temperature: float, top_k: int, top_p: float, min_p: float,
             seed: int | Tensor | None) -> tuple[dict[str, Any], tuple[int, ...]]:
    validate.tensor("logits", logits, validate.FLOATS)
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must be [..., V] with V >= 1; got shape {tuple(logits.shape)}")
    temp = temperatures.scalar("temperature", temperature, allow_zero=True)
    k = validate.integer("top_k", top_k)
    if k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off); got {top_k}")
    p = validate.real("top_p", top_p)
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1 = off); got {top_p}")
    floor = validate.real("min_p", min_p)
    if not 0.0 <= floor < 1.0:
        raise ValueError(f"min_p must be in [0, 1) (0 = off); got {min_p}")
    lead = tuple(logits.shape[:-1])
    args = {"logits": logits.reshape(-1, logits.shape[-1]), "temperature": temp, "top_k": k,
            "top_p": p, "min_p": floor, "seeds": _seeds(seed, lead, logits.device)}
    return args, lead


SIGNATURE = Signature((plain("logits", "Tensor"), plain("temperature", "float"),
                       plain("top_k", "int"), plain("top_p", "float"), plain("min_p", "float"),
                       plain("seeds", "Tensor")))


def drawn_logp(logits: Tensor, tokens: Tensor, temperature: float) -> Tensor:
    """`logp` output of a `sample` kernel whose backend has no logp kernel of its own.

    The logp op's kernel on the drawn tokens at the sampling temperature (1 when greedy), so
    it equals what the caller's rlk.logp returns bit for bit; a row with no token (-1) gets
    NaN, as the logp contract gives every token outside [0, V). It runs outside any strict
    scope the caller opened for `sample`, which the nested op's backends need not satisfy.

    logits `[B, V]` and tokens int64 `[B]` come from a sample kernel, already checked: the
    logp op runs on them without rlk.logp's argument checks (which would refuse -1), with the
    kernel arguments rlk.logp would build from them.
    """
    from rlk.ops.logp.op import LOGP

    if tokens.dtype != torch.int64 or tokens.shape != logits.shape[:1] or logits.dim() != 2:
        raise ValueError(f"drawn_logp takes logits [B, V] and int64 tokens [B]; got logits "
                         f"{tuple(logits.shape)} and {tokens.dtype} tokens "
                         f"{tuple(tokens.shape)}")
    args = {"logits": logits, "tokens": tokens,
            "temperature": temperature if temperature > 0.0 else 1.0, "ignore_index": -100,
            "rows": None, "out": None, "with_entropy": False}
    policy = current_policy(get_dispatcher())
    if not policy.strict:
        return LOGP.call(args)[0]
    with ScopedPolicy(dataclasses.replace(policy, strict=False)):
        return LOGP.call(args)[0]


def sample(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int | Tensor | None = None,
) -> Sampled:
    """Draw one token per row of `logits` `[..., V]`; returns (tokens, logp, processed_logp).

    Filters apply in order: temperature (0 = greedy), top_k (0 = off), top_p
    (1 = off), min_p relative to the most likely token (0 = off). `seed`: an int64
    tensor with one seed per row (a row's result depends only on its logits and its
    seed), an int (row r uses a seed derived from it and r), or None (drawn from
    torch's generator). `logp` equals `rlk.logp(logits, tokens, temperature=T)` bit
    for bit (T = 1 when greedy). A row with no valid token gives token -1 and NaN.
    """
    args, lead = _prepare(logits, temperature, top_k, top_p, min_p, seed)
    args["logits"] = args["logits"].detach()  # sampling is not differentiable: use rlk.logp
    tokens, logp, processed = SAMPLE.call(args)
    if len(lead) == 1:  # [B, V] logits: the kernel's [B] outputs as they are (3 views cost 2 µs)
        return Sampled(tokens, logp, processed)
    return Sampled(tokens.view(lead), logp.view(lead), processed.view(lead))


# ---------------------------------------------------------------------------
# conformance samples and the spec


def _samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
    gen = torch.Generator().manual_seed(17)

    def case(name: str, rows: int = 6, vocab: int = 50, **options: Any) -> Sample:
        args = {
            "logits": (torch.randn(rows, vocab, generator=gen) * 3).to(device=device,
                                                                        dtype=dtype),
            "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
            "seeds": torch.randint(-(2**62), 2**62, (rows,), generator=gen).to(device),
        }
        args.update(options)
        return Sample(name, args, check_backward=False)

    yield case("plain")
    yield case("greedy", temperature=0.0)
    yield case("greedy-ignores-filters", temperature=0.0, top_k=3, top_p=0.5)
    yield case("temperature", temperature=0.6)
    # the smallest temperature: greedy in effect, and logits / T must not overflow
    yield case("tiny-temperature", temperature=temperatures.MIN_TEMPERATURE)
    yield case("top-k", top_k=5)
    yield case("top-k-one", top_k=1, temperature=1.3)
    yield case("top-k-above-vocab", top_k=80)
    yield case("top-p", top_p=0.7)
    yield case("min-p", min_p=0.1)
    yield case("all-filters", temperature=0.8, top_k=20, top_p=0.9, min_p=0.02)
    yield case("wide-vocab", rows=3, vocab=5000, top_p=0.95, top_k=100)
    yield case("vocab-one", vocab=1, top_p=0.5)
    sample = case("invalid-rows", top_p=0.8)
    sample.args["logits"][1, 4] = float("nan")
    sample.args["logits"][3] = float("-inf")
    sample.args["logits"][4, 0] = float("inf")
    yield sample
    sample = case("partial-neg-inf", top_k=4)
    sample.args["logits"][:, :30] = float("-inf")
    yield sample
    sample = case("non-contiguous", temperature=0.9)
    sample.args["logits"] = sample.args["logits"].t().contiguous().t()
    yield sample
    yield case("empty", rows=0)


def _options(args: Mapping[str, Any]) -> dict[str, Any]:
    return {key: args[key] for key in ("temperature", "top_k", "top_p", "min_p")}


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    """Per row: 1 (token in the support), 0 (logp error), 0 (processed_logp error); NaN rows."""
    log_q = reference.sample_log_probs(args["logits"].detach().cpu(), **_options(args))
    bad = torch.isnan(log_q[:, 0]) if log_q.shape[1] else torch.zeros(0, dtype=torch.bool)
    zeros = torch.zeros(log_q.shape[0], dtype=torch.float64).masked_fill(bad, torch.nan)
    return torch.ones(log_q.shape[0], dtype=torch.float64), zeros, zeros.clone()


def _outputs(result: Any, args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    """Sampling is random, so compare what must hold whatever token was drawn: the token
    lies in the reference support (or is -1 for an invalid row), and both log-probabilities
    equal the float64 reference at that token."""
    tokens, logp, processed = (t.detach().cpu() for t in result)
    logits = args["logits"].detach().cpu()
    log_q = reference.sample_log_probs(logits, **_options(args))
    temperature = args["temperature"] or 1.0
    log_p = torch.log_softmax(logits.to(torch.float64) / temperature, dim=1)
    invalid = torch.isnan(log_q[:, 0]) if log_q.shape[1] else torch.zeros(0, dtype=torch.bool)
    safe = tokens.clamp(0, max(logits.shape[1] - 1, 0)).unsqueeze(1)
    in_range = (tokens >= 0) & (tokens < logits.shape[1])
    q_at = log_q.gather(1, safe).squeeze(1)
    in_support = torch.where(invalid, tokens == -1, in_range & (q_at > -torch.inf))
    logp_error = torch.where(invalid, logp.double(), logp.double() - log_p.gather(1, safe)[:, 0])
    processed_error = torch.where(invalid, processed.double(), processed.double() - q_at)
    return in_support.to(torch.float64), logp_error, processed_error


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    return torch.ops.rlk.sample.default, SIGNATURE.encode(args)


def _batch_slice(args: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    return dict(args, logits=args["logits"][start:stop], seeds=args["seeds"][start:stop])


def _public_prepare(logits: Tensor, *, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0, min_p: float = 0.0,
                    seed: int | Tensor | None = None) -> dict[str, Any]:
    return _prepare(logits, temperature, top_k, top_p, min_p, seed)[0]


def _output_meta(logits: Tensor, *_: Any, **__: Any) -> tuple[Out | None, ...]:
    rows = (logits.shape[0],)
    return (Out(rows, torch.int64, logits.device), Out(rows, torch.float32, logits.device),
            Out(rows, torch.float32, logits.device))


def _nan_rule(named: Mapping[str, Any], outputs: tuple[Any, ...]) -> tuple[Tensor | bool, ...]:
    fine = kernel_checks.fine_rows(named["logits"], None)
    return False, ~fine, ~fine


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(shape) < 2:
        raise ValueError(f"takes --shape B,V; got {shape}")
    return (torch.empty(shape, dtype=dtype, device="meta"),), {}


SAMPLE = OpSpec(
    name="sample",
    main_input="logits",
    prepare=_public_prepare,
    flags=lambda args: (args["temperature"] == 0.0, args["top_k"] > 0, args["top_p"] < 1.0,
                        args["min_p"] > 0.0),
    reference=_reference,
    outputs=_outputs,
    samples=_samples,
    tolerances={dtype: Tolerance(atol=2e-5, rtol=0.0) for dtype in validate.FLOATS},
    dtypes=validate.FLOATS,
    opcheck_case=_opcheck_case,
    batch_slice=_batch_slice,
    operator=Operator(SIGNATURE, returns=("Tensor", "Tensor", "Tensor")),
    doc="one token per row: temperature, top-k, top-p, min-p, per-row seeds",
    native=NativeKernel("rlk.ops.sample.native:sample", uses=("logp",)),
    output_meta=_output_meta,
    shape_call=_shape_call,
    shape_help="B,V",
    nan_rule=_nan_rule,
)
