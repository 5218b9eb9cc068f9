"""Workloads over logits: `logp-native`, `logp`, `logp-bwd`, `logp-unaligned`, `logp-entropy`.

Logits are random with a standard deviation of 2 (about what language models emit)
and tokens uniform over the vocabulary; temperature 1, so peers without a
temperature argument compute the same thing. The cases sweep the vocabularies of the
model families RL runs use (32k, 128k, 152k, 256k) in every dtype of the run, plus rows
that are strided: a slice of a wider buffer, as logits[:, :V] of a padded LM head gives.
`logp-unaligned` takes vocabularies whose rows do not start on 16-byte boundaries (GPT-2's
50257, an embedding resized by one token, 32001) and a slice that leaves the row's tail off
the boundary (151665 of Qwen's padded 151936).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rlk.bench import checks, peers
from rlk.bench.workload import (
    FORWARD,
    FORWARD_BACKWARD,
    Call,
    Case,
    Cost,
    Error,
    Inputs,
    Outputs,
    Peer,
    Variant,
    Workload,
    element_size,
    grads,
    rlk_function,
)
from rlk.ops.logp import reference

V32K, V128K, V152K, V256K = 32768, 128256, 151936, 256000
VOCABULARIES = (V32K, V128K, V152K, V256K)
ROW_PADDING = 128  # strided cases: rows of V logits inside rows of V + 128


def case(n: int, v: int, strided: bool = False, sliced_from: int | None = None) -> Case:
    """N rows of V logits: contiguous, `strided` (rows V + 128 apart) or the first V columns
    of rows `sliced_from` wide."""
    if strided:
        return Case(f"N={n} V={v} strided", {"N": n, "V": v, "row_stride": v + ROW_PADDING})
    if sliced_from is not None:
        return Case(f"N={n} V={v} of {sliced_from}", {"N": n, "V": v, "row_stride": sliced_from})
    return Case(f"N={n} V={v}", {"N": n, "V": v})


SMOKE = (case(48, 1000),)


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, seed: int,
                backward: bool) -> Inputs:
    n, v = int(case.dims["N"]), int(case.dims["V"])
    stride = int(case.dims.get("row_stride", v))
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(n, stride, generator=gen, device=device, dtype=dtype).mul_(2.0)[:, :v]
    return {
        "logits": logits.requires_grad_(backward),
        "tokens": torch.randint(0, v, (n,), generator=gen, device=device),
        "grad_logp": torch.randn(n, generator=gen, device=device),
        "grad_entropy": torch.randn(n, generator=gen, device=device),
        "check_rows": checks.check_rows(n, device, seed=0),
    }


def cost(case: Case, dtype: torch.dtype, backward: bool, entropy: bool = False) -> Cost:
    """Read the logits once forward; backward reads them again and writes the gradient."""
    n, v = case.dims["N"], case.dims["V"]
    logits = n * v * element_size(dtype)
    small = n * (8 + 4 + (4 if entropy else 0))
    if backward:
        return Cost(3 * logits + 2 * small)
    return Cost(logits + small)


def reference_for(entropy: bool) -> Callable[[Inputs, bool], Any]:
    def expected(x: Inputs, backward: bool) -> dict[str, Tensor]:
        rows = x["check_rows"]
        logits, tokens = x["logits"].detach()[rows], x["tokens"][rows]
        logp, ent = reference.logp_entropy(logits, tokens)
        found = {"logp": logp}
        if entropy:
            found["entropy"] = ent
        if backward:
            upstream = x["grad_entropy"][rows] if entropy else None
            found["grad_logits"] = reference.logp_entropy_grad(
                logits, tokens, x["grad_logp"][rows], upstream)
        return found

    return expected


def compare(expected: dict[str, Tensor], outputs: Outputs, x: Inputs) -> list[Error]:
    return checks.compare_rows(expected, outputs, x["check_rows"])


def _wrap(function: Callable[[Tensor, Tensor], Any], backward: bool, entropy: bool) -> Call:
    """A call from `function(logits, tokens) -> logp` (or `(logp, entropy)`)."""

    def call(x: Inputs) -> Outputs:
        found = function(x["logits"], x["tokens"])
        logp, ent = found if entropy else (found, None)
        outputs = {"logp": logp.detach()}
        if ent is not None:
            outputs["entropy"] = ent.detach()
        if backward:
            produced = (logp, ent) if ent is not None else (logp,)
            upstream = (x["grad_logp"], x["grad_entropy"]) if ent is not None else (
                x["grad_logp"],)
            (outputs["grad_logits"],) = grads(produced, upstream, (x["logits"],))
        return outputs

    return call


def rlk_call(entropy: bool) -> Callable[[bool], Call]:
    def build(backward: bool) -> Call:
        function = rlk_function("logp_entropy" if entropy else "logp")
        return _wrap(function, backward, entropy)

    return build


def eager_logp(logits: Tensor, tokens: Tensor) -> Tensor:
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def eager_logp_entropy(logits: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), entropy


def _liger(case: Case, backward: bool, device: torch.device) -> Call:
    cross_entropy = peers.load("liger", "liger_kernel.transformers.functional",
                               "liger_cross_entropy", device)

    def logp(logits: Tensor, tokens: Tensor) -> Tensor:
        return -cross_entropy(logits, tokens, reduction="none")

    return _wrap(logp, backward, entropy=False)


def torch_peers(entropy: bool) -> dict[str, Peer]:
    function = eager_logp_entropy if entropy else eager_logp
    return {
        "eager": Peer("eager", lambda c, b, d: _wrap(function, b, entropy)),
        "compile": Peer("compile", lambda c, b, d: _wrap(peers.compiled(function), b, entropy)),
    }


def _quack(case: Case, backward: bool, device: torch.device) -> Call:
    cross_entropy = peers.load("quack", "quack.cross_entropy", "cross_entropy", device)

    def logp(logits: Tensor, tokens: Tensor) -> Tensor:
        return -cross_entropy(logits, tokens, reduction="none")

    return _wrap(logp, backward, entropy=False)


LIGER = Peer("liger", _liger, mutates=("logits",),
             note="loss in the logits' dtype; the gradient overwrites the logits in the forward")
QUACK = Peer("quack", _quack, note="cross_entropy, reduction='none'")


def _hopper_only(device: torch.device) -> str | None:
    if device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0):
        return None
    return "the bulk-copy (TMA) forward runs on sm_90 (Hopper) devices only"


# rlk-cuda's Hopper forward beside its default one (docs/backends/cuda.md).
CUDA_TMA = Variant("cuda", "tma", {"RLK_CUDA_LOGP_FORWARD": "tma"}, _hopper_only)


def _logp_workload(name: str, modes: tuple[str, ...], cases: tuple[Case, ...],
                   backends: tuple[str, ...] | None = None, with_peers: tuple[str, ...] = (),
                   variants: tuple[Variant, ...] = (), smoke: tuple[Case, ...] = SMOKE,
                   doc: str = "") -> Workload:
    available = {**torch_peers(False), "liger": LIGER, "quack": QUACK}
    return Workload(
        name=name, op="logp", modes=modes, cases=cases, smoke_cases=smoke,
        inputs=make_inputs, rlk_call=rlk_call(False), reference=reference_for(False),
        compare=compare, cost=lambda c, d, b: cost(c, d, b),
        peers={p: available[p] for p in with_peers}, backends=backends, variants=variants,
        doc=doc,
    )


LOGP_NATIVE = _logp_workload(
    "logp-native", (FORWARD, FORWARD_BACKWARD), (case(4096, V152K),), backends=("native",),
    with_peers=("eager",),
    doc="rlk.logp on the native (PyTorch) backend beside eager log_softmax(logits.float())")
SWEEP = (*(case(8192, v) for v in VOCABULARIES), case(8192, V152K, strided=True))
LOGP = _logp_workload(
    "logp", (FORWARD,), (*SWEEP, case(32768, V152K)),
    with_peers=("eager", "compile", "liger", "quack"), variants=(CUDA_TMA,),
    smoke=(*SMOKE, case(48, 1000, strided=True)), doc="rlk.logp forward")
LOGP_BWD = _logp_workload(
    "logp-bwd", (FORWARD_BACKWARD,), SWEEP, with_peers=("eager", "compile", "liger", "quack"),
    doc="rlk.logp forward and backward with a per-token upstream gradient")
UNALIGNED = (*(case(8192, v) for v in (32001, 50257, 65537, 200001)),
             case(8192, 151665, sliced_from=V152K), case(12345, 50257))
LOGP_UNALIGNED = _logp_workload(
    "logp-unaligned", (FORWARD, FORWARD_BACKWARD), UNALIGNED,
    with_peers=("eager", "compile", "liger", "quack"),
    smoke=(case(48, 1001), case(48, 997, sliced_from=1000)),
    doc="rlk.logp forward and forward+backward on rows off 16-byte boundaries")
LOGP_ENTROPY = Workload(
    name="logp-entropy", op="logp_entropy", modes=(FORWARD, FORWARD_BACKWARD),
    cases=(case(8192, V152K), case(8192, V256K)), smoke_cases=SMOKE, inputs=make_inputs,
    rlk_call=rlk_call(True), reference=reference_for(True), compare=compare,
    cost=lambda c, d, b: cost(c, d, b, entropy=True), peers=torch_peers(True),
    doc="rlk.logp_entropy, forward and forward+backward (upstream gradients on both outputs)")
WORKLOADS = (LOGP_NATIVE, LOGP, LOGP_BWD, LOGP_UNALIGNED, LOGP_ENTROPY)
