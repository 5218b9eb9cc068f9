"""Every public op under torch.cuda.graph on rlk:cuda (issue #29 item 2): each op alone, forward
and forward+backward where it is differentiable, and the compositions trainers use, captured
after a warm-up on a side stream (torch's recipe), replayed on fresh inputs copied into the
captured ones, and compared bit for bit with eager calls on those inputs.

group_advantages is captured with group_size= (consecutive groups): group_ids= renumbers the
labels with torch.unique, whose output size the host must read (docs/backends/cuda.md)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import rlk
import torch
from rlk.testing.capture import captured

pytestmark = pytest.mark.gpu
B, T, H, V = 4, 24, 64, 1000  # N = B * T = 96 tokens
Inputs = dict[str, torch.Tensor]
Outputs = tuple[torch.Tensor, ...]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _logits(seed: int, dtype: torch.dtype = torch.bfloat16) -> Inputs:
    gen = _gen(seed)
    return {"logits": (torch.randn(B * T, V, generator=gen, device="cuda") * 2).to(dtype),
            "tokens": torch.randint(0, V, (B * T,), generator=gen, device="cuda"),
            "g": torch.randn(B * T, generator=gen, device="cuda"),
            "g2": torch.randn(B * T, generator=gen, device="cuda")}


def _head(seed: int) -> Inputs:
    gen = _gen(seed)
    return {"hidden": torch.randn(B * T, H, generator=gen, device="cuda").to(torch.bfloat16),
            "weight": (torch.randn(V, H, generator=gen, device="cuda") / 4).to(torch.bfloat16),
            "tokens": torch.randint(0, V, (B * T,), generator=gen, device="cuda"),
            "g": torch.randn(B * T, generator=gen, device="cuda"),
            "g2": torch.randn(B * T, generator=gen, device="cuda")}


def _policy(seed: int) -> Inputs:
    gen = _gen(seed)
    old = -torch.rand(B, T, generator=gen, device="cuda") * 3
    return {"old_logp": old,
            "logp": old + torch.randn(B, T, generator=gen, device="cuda") * 0.1,
            "advantages": torch.randn(B, generator=gen, device="cuda"),
            "mask": (torch.rand(B, T, generator=gen, device="cuda") > 0.2).float(),
            "g": torch.randn(B * T, generator=gen, device="cuda")}


def _grads(outputs: Outputs, upstream: Outputs, leaves: Outputs) -> Outputs:
    return tuple(torch.autograd.grad(outputs, leaves, upstream))


# Each case: (fresh inputs from a seed, names of the inputs that require grad, the call).
Case = tuple[Callable[[int], Inputs], tuple[str, ...], Callable[[Inputs], Outputs]]


def _logp(x: Inputs) -> Outputs:
    return (rlk.logp(x["logits"], x["tokens"]),)


def _logp_entropy(x: Inputs) -> Outputs:
    return rlk.logp_entropy(x["logits"], x["tokens"])


def _entropy(x: Inputs) -> Outputs:
    return (rlk.entropy(x["logits"]),)


def _linear_logp(x: Inputs) -> Outputs:
    return (rlk.linear_logp(x["hidden"], x["weight"], x["tokens"]),)


def _linear_logp_entropy(x: Inputs) -> Outputs:
    return rlk.linear_logp_entropy(x["hidden"], x["weight"], x["tokens"])


def _linear_policy_loss(x: Inputs) -> Outputs:
    loss, metrics = rlk.linear_policy_loss(x["hidden"], x["weight"], x["tokens"].view(B, T),
                                           x["old_logp"], x["advantages"], x["mask"])
    return (loss, metrics["logp"])


def _policy_loss(x: Inputs) -> Outputs:
    loss, metrics = rlk.policy_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"],
                                    clip_high=0.28)
    return (loss, *metrics.values())


def _token_kl(x: Inputs) -> Outputs:
    return (rlk.token_kl(x["logp"], x["old_logp"], kl_estimator="k3"),)


def _advantages(x: Inputs) -> Outputs:
    return (rlk.group_advantages(x["advantages"].repeat(4), group_size=4),)


def _sample(x: Inputs) -> Outputs:
    drawn = rlk.sample(x["logits"], temperature=0.8, top_k=50, seed=x["seeds"])
    plain = rlk.sample(x["logits"], temperature=1.2, seed=x["seeds"])
    return (*drawn, *plain)


def _with_seeds(seed: int) -> Inputs:
    x = _logits(seed)
    x["seeds"] = torch.randint(-(2**62), 2**62, (B * T,), generator=_gen(seed + 1), device="cuda")
    return x


def _linear_logp_then_policy_loss(x: Inputs) -> Outputs:
    logp = rlk.linear_logp(x["hidden"], x["weight"], x["tokens"]).view(B, T)
    loss, metrics = rlk.policy_loss(logp, x["old_logp"], x["advantages"], x["mask"])
    return (loss, metrics["clip_fraction"])


def _logp_then_policy_loss(x: Inputs) -> Outputs:
    logp = rlk.logp(x["logits"], x["tokens"]).view(B, T)
    loss, metrics = rlk.policy_loss(logp, x["old_logp"], x["advantages"], x["mask"])
    return (loss, metrics["clip_fraction"])


def _sample_then_logp(x: Inputs) -> Outputs:
    tokens, _, _ = rlk.sample(x["logits"], temperature=1.0, seed=x["seeds"])
    return (tokens, rlk.logp(x["logits"], tokens))


def _head_and_policy(seed: int) -> Inputs:
    return {**_head(seed), **_policy(seed + 1)}


def _logits_and_policy(seed: int) -> Inputs:
    return {**_logits(seed), **_policy(seed + 1)}


CASES: dict[str, Case] = {
    "logp": (_logits, ("logits",), _logp),
    "logp_entropy": (_logits, ("logits",), _logp_entropy),
    "entropy": (_logits, ("logits",), _entropy),
    "linear_logp": (_head, ("hidden", "weight"), _linear_logp),
    "linear_logp_entropy": (_head, ("hidden", "weight"), _linear_logp_entropy),
    "linear_policy_loss": (_head_and_policy, ("hidden", "weight"), _linear_policy_loss),
    "policy_loss": (_policy, ("logp",), _policy_loss),
    "token_kl": (_policy, ("logp",), _token_kl),
    "group_advantages": (_policy, (), _advantages),
    "sample": (_with_seeds, (), _sample),
    "linear_logp -> policy_loss": (_head_and_policy, ("hidden", "weight"),
                                   _linear_logp_then_policy_loss),
    "logp -> policy_loss": (_logits_and_policy, ("logits",), _logp_then_policy_loss),
    "sample -> logp": (_with_seeds, (), _sample_then_logp),
}


def _step(call: Callable[[Inputs], Outputs], leaves: tuple[str, ...],
          backward: bool) -> Callable[[Inputs], Outputs]:
    """The call, and with `backward` the gradients of its differentiable outputs (random
    upstream gradients "g", "g2", a scalar loss's 1) to the leaves."""

    def run(x: Inputs) -> Outputs:
        outputs = call(x)
        if not backward:
            return outputs
        live = tuple(o for o in outputs if o.requires_grad)
        upstream = tuple(torch.ones_like(o) if o.dim() == 0 else x[name].view_as(o)
                         for o, name in zip(live, ("g", "g2"), strict=False))
        return (*outputs, *_grads(live, upstream, tuple(x[name] for name in leaves)))

    return run


def _equal(got: torch.Tensor, want: torch.Tensor) -> bool:
    same_nan = torch.equal(got.isnan(), want.isnan()) if got.is_floating_point() else True
    return same_nan and torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))


def _leaf_inputs(x: Inputs, leaves: tuple[str, ...]) -> Inputs:
    return {k: v.requires_grad_(True) if k in leaves else v for k, v in x.items()}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
def test_capture_replays_equal_eager_calls(name: str, backward: bool) -> None:
    _capture_and_compare(name, backward)


@pytest.mark.parametrize("name", ["linear_logp_entropy", "linear_logp -> policy_loss"])
def test_linear_logp_in_vocabulary_chunks(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A logits budget of 0.1 MiB makes the forward take 8 vocabulary chunks at these sizes:
    its side stream and the events that hand each chunk's buffer back are captured too."""
    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", "0.1")
    _capture_and_compare(name, True)


def _replay_on(graph: torch.cuda.CUDAGraph, static: Inputs, x: Inputs) -> None:
    with torch.no_grad():
        for key, value in x.items():
            static[key].copy_(value)
    graph.replay()
    torch.cuda.synchronize()


def _capture_and_compare(name: str, backward: bool) -> None:
    fresh, leaves, call = CASES[name]
    if backward and not leaves:
        pytest.skip(f"{name} is not differentiable")
    run = _step(call, leaves, backward)
    static = _leaf_inputs(fresh(0), leaves)
    with rlk.use_backends("cuda", strict=True):
        graph, replayed = captured(lambda: run(static))
        for seed in (11, 12, 13):
            x = fresh(seed)
            _replay_on(graph, static, x)
            eager = run(_leaf_inputs(x, leaves))
            for index, (got, want) in enumerate(zip(replayed, eager, strict=True)):
                assert _equal(got, want.detach()), f"{name}: output {index}, inputs {seed}"


def test_trainer_step_accumulates_into_grad() -> None:
    """linear_logp -> policy_loss as a trainer runs it: loss.backward() into the leaves' .grad
    (set to None before each step, so every replay writes fresh gradients), replayed on fresh
    inputs and compared with an eager step."""
    fresh, leaves, call = CASES["linear_logp -> policy_loss"]
    static = _leaf_inputs(fresh(0), leaves)

    def step(x: Inputs) -> Outputs:
        for name in leaves:
            x[name].grad = None
        loss = call(x)[0]
        loss.backward()
        return (loss,)

    with rlk.use_backends("cuda", strict=True):
        graph, (loss,) = captured(lambda: step(static))
        for seed in (21, 22):
            x = fresh(seed)
            _replay_on(graph, static, x)
            eager = _leaf_inputs(x, leaves)
            (want,) = step(eager)
            assert _equal(loss, want.detach())
            for name in leaves:
                assert _equal(static[name].grad, eager[name].grad), name
