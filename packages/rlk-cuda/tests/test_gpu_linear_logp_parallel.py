"""linear_logp with group= (vocabulary-parallel weights): two processes, one CUDA device, gloo.

Each process runs this file as a script (as rlk-core's tests/test_distributed.py does), holds an
uneven vocabulary shard of the weight and compares its outputs and its gradients (hidden, weight
shard, bias shard) with the float64 reference on the full weight. gloo runs all_gather and
all_reduce on CUDA tensors itself (it stages them through pinned host memory), so the library's
collectives run unchanged; only the transport differs from NCCL on real multi-GPU hosts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch import Tensor

pytestmark = pytest.mark.gpu

WORLD = 2
# a rank that fails stops taking part in collectives: its peer gives up after this long
COLLECTIVE_TIMEOUT_S = 60
DEADLINE_S = 300
N, H, V = 300, 64, 3000
# contiguous, uneven shards in rank order, neither a multiple of the 128-column chunks
SHARDS = (1100, 1900)
IGNORE = -100


def _inputs(dtype: torch.dtype) -> dict[str, Tensor]:
    """The same data on every rank (CPU generator, same seed): tokens hit both shards."""
    gen = torch.Generator().manual_seed(2025)
    tokens = torch.randint(0, V, (N,), generator=gen)
    tokens[::11] = IGNORE
    edge = SHARDS[0]
    tokens[:6] = torch.tensor([0, edge - 1, edge, V - 1, IGNORE, edge + 3])
    data = {
        "hidden": torch.randn(N, H, generator=gen) / 4,
        "weight": torch.randn(V, H, generator=gen) / 4,
        "bias": torch.randn(V, generator=gen) / 4,
    }
    floats = {name: t.to(dtype) for name, t in data.items()}
    return {
        **floats,
        "tokens": tokens,
        "temperature": torch.rand(N, generator=gen) + 0.5,
        "grad_logp": torch.randn(N, generator=gen),
        "grad_entropy": torch.randn(N, generator=gen),
    }


def _on_device(data: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: t.to("cuda") for name, t in data.items()}


def _close(name: str, got: Tensor | None, want: Tensor, tol: float) -> None:
    """Equal within tol * max(1, max |want|), NaN exactly where the reference has NaN."""
    assert got is not None, f"rank {os.environ['RANK']} {name}: not returned"
    finite = want[torch.isfinite(want)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    torch.testing.assert_close(
        got.double(),
        want.double(),
        atol=tol * scale,
        rtol=0.0,
        equal_nan=True,
        msg=lambda m: f"rank {os.environ['RANK']} {name}: {m}",
    )


def _tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """(forward, gradient) tolerances: float32 logits; the logits gradient is rounded to dtype
    once before the GEMMs, as in test_gpu_linear."""
    return (1e-4, 1e-4) if dtype == torch.float32 else (1e-4, 3e-2)


def _check_kernels(
    data: dict[str, Tensor],
    lo: int,
    hi: int,
    group: object,
    with_bias: bool,
    with_entropy: bool,
    ignore_index: int,
    temperature: float | Tensor,
) -> None:
    """rlk_cuda.linear_logp forward/backward on this rank's shard against the float64 reference."""
    from rlk.ops.linear_logp import reference
    from rlk.testing.poison import poisoned_allocations

    from rlk_cuda import linear_logp as linear

    hidden, weight, tokens = data["hidden"], data["weight"], data["tokens"]
    bias = data["bias"] if with_bias else None
    grad_logp = data["grad_logp"]
    grad_entropy = data["grad_entropy"] if with_entropy else None
    shard, shard_bias = weight[lo:hi], None if bias is None else bias[lo:hi]
    with poisoned_allocations():
        logp, entropy, lse = linear.forward(
            hidden, shard, tokens, shard_bias, temperature, ignore_index, with_entropy, group,
            None,
        )
        grads = linear.backward(
            grad_logp,
            grad_entropy,
            hidden,
            shard,
            tokens,
            shard_bias,
            temperature,
            ignore_index,
            group,
            lse,
            entropy,
            (True, True, with_bias),
            None,
        )
    want_logp, want_entropy = reference.linear_logp_entropy(
        hidden, weight, tokens, bias=bias, temperature=temperature, ignore_index=ignore_index
    )
    want_grads = reference.linear_logp_entropy_grad(
        hidden,
        weight,
        tokens,
        grad_logp,
        grad_entropy,
        bias=bias,
        temperature=temperature,
        ignore_index=ignore_index,
    )
    case = f"{hidden.dtype} bias={with_bias} entropy={with_entropy} ignore={ignore_index}"
    tol, gtol = _tolerances(hidden.dtype)
    _close(f"{case} logp", logp, want_logp, tol)
    if with_entropy:
        _close(f"{case} entropy", entropy, want_entropy, tol * 10)
    grad_hidden, grad_weight, grad_bias = grads
    assert grad_hidden is not None and grad_hidden.dtype == torch.float32, case
    _close(f"{case} grad hidden", grad_hidden, want_grads[0], gtol)
    _close(f"{case} grad weight", grad_weight, want_grads[1][lo:hi], gtol)
    if with_bias:
        assert want_grads[2] is not None
        _close(f"{case} grad bias", grad_bias, want_grads[2][lo:hi], gtol)


def _check_out_of_range(data: dict[str, Tensor], lo: int, hi: int, group: object) -> None:
    """Tokens outside the group's vocabulary give NaN logp; the entropy stays defined."""
    from rlk.ops.linear_logp import reference

    from rlk_cuda import linear_logp as linear

    tokens = data["tokens"].clone()
    tokens[[7, 8]] = torch.tensor([V, -3], device=tokens.device)
    hidden, weight, temperature = data["hidden"], data["weight"], data["temperature"]
    logp, entropy, _ = linear.forward(
        hidden, weight[lo:hi], tokens, None, temperature, IGNORE, True, group, None
    )
    want_logp, want_entropy = reference.linear_logp_entropy(
        hidden, weight, tokens, temperature=temperature, ignore_index=IGNORE
    )
    assert torch.isnan(logp[[7, 8]]).all(), f"rank {os.environ['RANK']}: {logp[[7, 8]]}"
    tol, _ = _tolerances(hidden.dtype)
    _close("out-of-range logp", logp, want_logp, tol)
    _close("out-of-range entropy", entropy, want_entropy, tol * 10)


def _check_public_api(data: dict[str, Tensor], lo: int, hi: int, group: object) -> None:
    """rlk.linear_logp_entropy(group=) selects this backend and its autograd matches."""
    import rlk
    from rlk.ops.linear_logp import reference

    hidden, weight, bias = data["hidden"], data["weight"], data["bias"]
    tokens, temperature = data["tokens"], data["temperature"]
    leaves = [t.clone().requires_grad_(True) for t in (hidden, weight[lo:hi], bias[lo:hi])]
    # strict: the forward fails rather than fall back to native. The backward dispatches again
    # (maybe on autograd's device thread, outside this scope): cuda has the top priority there.
    with rlk.use_backends("cuda", strict=True):
        logp, entropy = rlk.linear_logp_entropy(
            leaves[0], leaves[1], tokens, bias=leaves[2], temperature=temperature, group=group
        )
        torch.autograd.backward((logp, entropy), (data["grad_logp"], data["grad_entropy"]))
    want_logp, want_entropy = reference.linear_logp_entropy(
        hidden, weight, tokens, bias=bias, temperature=temperature
    )
    want = reference.linear_logp_entropy_grad(
        hidden,
        weight,
        tokens,
        data["grad_logp"],
        data["grad_entropy"],
        bias=bias,
        temperature=temperature,
    )
    tol, gtol = _tolerances(hidden.dtype)
    _close("public logp", logp, want_logp, tol)
    _close("public entropy", entropy, want_entropy, tol * 10)
    assert want[2] is not None
    for name, leaf, expected in zip(
        ("hidden", "weight", "bias"), leaves, (want[0], want[1][lo:hi], want[2][lo:hi]), strict=True
    ):
        _close(f"public grad {name}", leaf.grad, expected, gtol)


def _check_linear_policy_loss(data: dict[str, Tensor], lo: int, hi: int, group: object) -> None:
    """rlk.linear_policy_loss(group=) on the cuda backend against the unsharded op: with 0.25 MiB
    chunks (14 rows), token-level in chunks inside the 100-token sequences, GSPO in two passes."""
    import rlk

    tokens = data["tokens"].view(3, 100)
    old = torch.full((3, 100), -8.0, device="cuda")
    mask = (tokens != IGNORE).float()
    advantages = torch.tensor([1.0, -0.5, 0.25], device="cuda")
    tol = 1e-4 if data["hidden"].dtype == torch.float32 else 3e-2
    for options in ({"kl_coef": 0.05, "ref_logp": old + 0.5, "entropy_coef": 0.01},
                    {"ratio_level": "sequence", "clip_low": 0.03, "clip_high": 0.04}):
        with rlk.use_backends("cuda", strict=True):
            full = [t.clone().requires_grad_(True) for t in (data["hidden"], data["weight"])]
            want, _ = rlk.linear_policy_loss(full[0], full[1], tokens, old, advantages, mask,
                                             **options)
            want.backward()
            part = [t.clone().requires_grad_(True) for t in (data["hidden"], data["weight"][lo:hi])]
            got, _ = rlk.linear_policy_loss(part[0], part[1], tokens, old, advantages, mask,
                                            group=group, **options)
            got.backward()
        case = f"linear_policy_loss {sorted(options)} {data['hidden'].dtype}"
        _close(f"{case} loss", got, want, 1e-5)
        _close(f"{case} grad hidden", part[0].grad, full[0].grad, tol)
        _close(f"{case} grad weight", part[1].grad, full[1].grad[lo:hi], tol)


def _check_no_rows(data: dict[str, Tensor], lo: int, hi: int, group: object) -> None:
    """Zero rows still run the collectives on every rank and return empty results."""
    from rlk_cuda import linear_logp as linear

    hidden, weight, tokens = data["hidden"][:0], data["weight"][lo:hi], data["tokens"][:0]
    logp, entropy, lse = linear.forward(hidden, weight, tokens, None, 1.0, IGNORE, True, group,
                                        None)
    assert entropy is not None and logp.shape == entropy.shape == lse.shape == (0,)
    grad_hidden, grad_weight, _ = linear.backward(
        logp,
        entropy,
        hidden,
        weight,
        tokens,
        None,
        1.0,
        IGNORE,
        group,
        lse,
        entropy,
        (True, True, False),
        None,
    )
    assert grad_hidden is not None and grad_hidden.shape == (0, H)
    assert grad_weight is not None and bool((grad_weight == 0).all())


def _worker(rank: int, world: int, store: str) -> None:
    import torch.distributed as dist

    os.environ["RANK"] = str(rank)
    torch.cuda.set_device(0)  # every rank shares the one device
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    try:
        group = dist.new_group(list(range(world)))
        lo = sum(SHARDS[:rank])
        hi = lo + SHARDS[rank]
        for dtype in (torch.float32, torch.bfloat16):
            data = _on_device(_inputs(dtype))
            for with_bias in (False, True):
                for with_entropy in (False, True):
                    _check_kernels(
                        data, lo, hi, group, with_bias, with_entropy, IGNORE, data["temperature"]
                    )
            # ignore_index a real token owned by rank 1 (tokens[5]), scalar temperature; -100
            # would then be out of range (NaN gradients), so those rows take token 7
            custom = dict(data, tokens=data["tokens"].masked_fill(data["tokens"] == IGNORE, 7))
            _check_kernels(custom, lo, hi, group, True, True, SHARDS[0] + 3, 0.8)
            _check_out_of_range(data, lo, hi, group)
            _check_public_api(data, lo, hi, group)
            _check_linear_policy_loss(data, lo, hi, group)
        _check_no_rows(_on_device(_inputs(torch.float32)), lo, hi, group)
    finally:
        dist.destroy_process_group()


def _run_ranks(tmp_path: Path) -> list[tuple[int, str]]:
    """Start every rank; once one fails, stop the others. (exit code, output) per rank."""
    store = tmp_path / "rendezvous"
    # 0.25 MiB logits buffers: several vocabulary chunks in every shard, a partial one last
    env = dict(os.environ, OMP_NUM_THREADS="1", RLK_CUDA_CHUNK_MB="0.25")
    logs = [tmp_path / f"rank{rank}.log" for rank in range(WORLD)]
    procs = []
    for rank, log in enumerate(logs):
        with log.open("w") as out:
            command = [sys.executable, __file__, str(rank), str(WORLD), str(store)]
            procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + DEADLINE_S
    while any(proc.poll() is None for proc in procs):
        failed = any(proc.returncode not in (None, 0) for proc in procs)
        if failed or time.monotonic() > deadline:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        time.sleep(0.2)
    return [(proc.wait(), log.read_text()) for proc, log in zip(procs, logs, strict=True)]


def test_vocab_parallel_two_ranks_on_one_device(tmp_path: Path) -> None:
    results = _run_ranks(tmp_path)
    failures = [
        f"rank {rank} exited {code}:\n{output[-4000:]}"
        for rank, (code, output) in enumerate(results)
        if code != 0
    ]
    assert not failures, "\n".join(failures)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
