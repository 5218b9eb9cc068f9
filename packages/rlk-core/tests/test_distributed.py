"""Vocabulary parallelism on CPU with torch.distributed (gloo), 2 and 4 processes.

Each process runs this file as a script (so the workers need no import path) and
checks, on its own shard, that forward and backward equal the unsharded op.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

import rlk

N, H, V = 13, 8, 41
# contiguous, uneven shards in rank order; a one-token shard included
SHARDS = {2: (15, 26), 4: (5, 17, 1, 18)}
ATOL = RTOL = 2e-5


def _inputs() -> dict[str, torch.Tensor]:
    """The same data on every rank (same seed): tokens hit every shard, one is ignored."""
    gen = torch.Generator().manual_seed(2024)
    tokens = torch.randint(0, V, (N,), generator=gen)
    tokens[:5] = torch.tensor([0, 5, 22, 40, -100])
    return {
        "hidden": torch.randn(N, H, generator=gen),
        "weight": torch.randn(V, H, generator=gen) * 0.7,
        "bias": torch.randn(V, generator=gen),
        "tokens": tokens,
        "temperature": torch.rand(N, generator=gen) + 0.5,
        "logits": torch.randn(N, V, generator=gen) * 3,
        "grad_logp": torch.randn(N, generator=gen),
        "grad_entropy": torch.randn(N, generator=gen),
    }


def _close(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL, equal_nan=True,
                               msg=lambda m: f"rank {os.environ['RANK']} {name}: {m}")


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.clone().requires_grad_(True) for t in tensors]


def _check_linear_logp(data: dict[str, torch.Tensor], lo: int, hi: int, group) -> None:
    tokens, temperature = data["tokens"], data["temperature"]
    upstream = (data["grad_logp"], data["grad_entropy"])
    full = _leaves(data["hidden"], data["weight"], data["bias"])
    want = rlk.linear_logp_entropy(full[0], full[1], tokens, bias=full[2],
                                   temperature=temperature)
    torch.autograd.backward(want, upstream)
    part = _leaves(data["hidden"], data["weight"][lo:hi], data["bias"][lo:hi])
    got = rlk.linear_logp_entropy(part[0], part[1], tokens, bias=part[2],
                                  temperature=temperature, group=group)
    torch.autograd.backward(got, upstream)
    _close("linear logp", got[0], want[0])
    _close("linear entropy", got[1], want[1])
    _close("grad hidden", part[0].grad, full[0].grad)
    _close("grad weight", part[1].grad, full[1].grad[lo:hi])
    _close("grad bias", part[2].grad, full[2].grad[lo:hi])
    only = rlk.linear_logp(data["hidden"], data["weight"][lo:hi], tokens, group=group)
    _close("linear logp without bias", only, rlk.linear_logp(data["hidden"], data["weight"],
                                                             tokens))


def _check_sharded_logits(data: dict[str, torch.Tensor], lo: int, hi: int, group) -> None:
    tokens, temperature = data["tokens"], data["temperature"]
    upstream = (data["grad_logp"], data["grad_entropy"])
    (full,) = _leaves(data["logits"])
    want = rlk.logp_entropy(full, tokens, temperature=temperature)
    torch.autograd.backward(want, upstream)
    (part,) = _leaves(data["logits"][:, lo:hi])
    got = rlk.distributed.logp_entropy(part, tokens, group=group, temperature=temperature)
    torch.autograd.backward(got, upstream)
    _close("sharded logp", got[0], want[0])
    _close("sharded entropy", got[1], want[1])
    _close("sharded grad logits", part.grad, full.grad[:, lo:hi])
    (part,) = _leaves(data["logits"][:, lo:hi])
    only = rlk.distributed.logp(part.view(1, N, hi - lo), tokens.view(1, N), group=group)
    assert only.shape == (1, N)
    only.sum().backward()
    (full,) = _leaves(data["logits"])
    rlk.logp(full, tokens).sum().backward()
    _close("sharded logp alone", only[0], rlk.logp(data["logits"], tokens))
    _close("sharded logp grad", part.grad, full.grad[:, lo:hi])


def _check_edge_rows(data: dict[str, torch.Tensor], lo: int, hi: int, group) -> None:
    """NaN in one shard's row, a row -inf on the first shard, tokens outside the vocabulary."""
    logits, tokens = data["logits"].clone(), data["tokens"].clone()
    logits[1, 3] = float("nan")
    logits[2, :5] = float("-inf")
    logits[3] = float("-inf")
    tokens[2], tokens[6], tokens[7] = 30, V, -3
    want = rlk.logp_entropy(logits, tokens)
    got = rlk.distributed.logp_entropy(logits[:, lo:hi], tokens, group=group)
    _close("edge logp", got[0], want[0])
    _close("edge entropy", got[1], want[1])
    assert torch.isnan(got[0][[1, 3, 6, 7]]).all() and torch.isfinite(got[0][[0, 2, 5]]).all()


def _check_linear_policy_loss(data: dict[str, torch.Tensor], lo: int, hi: int, group) -> None:
    """Every path (token-level loss: chunks across sequences; GSPO: whole sequences in the
    default chunks, two passes in 2-row chunks) against the unsharded op."""
    tokens = data["tokens"].view(1, N)
    old = torch.full((1, N), -3.0) + data["grad_logp"].view(1, N) * 0.1
    mask = torch.ones(1, N)
    mask[0, 7] = 0.0  # a masked position with an out-of-range token
    settings = [{"kl_coef": 0.05, "ref_logp": old + 0.2, "entropy_coef": 0.01},
                {"ratio_level": "sequence", "clip_low": 0.03, "clip_high": 0.04},
                {"kl_coef": 0.05, "ref_logp": old + 0.2, "softcap": 1.5},
                {"ratio_level": "sequence", "clip_low": 0.03, "clip_high": 0.04,
                 "softcap": 2.0}]
    for chunk_mb in (None, "0.002"):
        if chunk_mb is not None:
            os.environ["RLK_NATIVE_CHUNK_MB"] = chunk_mb
        for options in settings:
            full = _leaves(data["hidden"], data["weight"], data["bias"])
            want, _ = rlk.linear_policy_loss(full[0], full[1], tokens, old, torch.ones(1), mask,
                                             bias=full[2], **options)
            want.backward()
            part = _leaves(data["hidden"], data["weight"][lo:hi], data["bias"][lo:hi])
            got, metrics = rlk.linear_policy_loss(part[0], part[1], tokens, old, torch.ones(1),
                                                  mask, bias=part[2], group=group, **options)
            got.backward()
            case = f"linear_policy_loss {options} chunk {chunk_mb}"
            _close(case, got, want)
            _close(f"{case} grad hidden", part[0].grad, full[0].grad)
            _close(f"{case} grad weight", part[1].grad, full[1].grad[lo:hi])
            _close(f"{case} grad bias", part[2].grad, full[2].grad[lo:hi])
            assert metrics["logp"][0, 7] == 0, case
            with torch.no_grad():  # the forward-only (two-pass) route, soft cap included
                alone, alone_metrics = rlk.linear_policy_loss(
                    part[0], part[1], tokens, old, torch.ones(1), mask, bias=part[2],
                    group=group, **options)
            _close(f"{case} no_grad", alone, want)
            _close(f"{case} no_grad logp", alone_metrics["logp"], metrics["logp"])
    os.environ.pop("RLK_NATIVE_CHUNK_MB", None)


def _worker(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        sizes = SHARDS[world]
        lo = sum(sizes[:rank])
        hi = lo + sizes[rank]
        group = dist.new_group(list(range(world)))
        data = _inputs()
        _check_linear_logp(data, lo, hi, group)
        _check_linear_policy_loss(data, lo, hi, group)
        _check_sharded_logits(data, lo, hi, group)
        _check_edge_rows(data, lo, hi, group)
        rlk.check_inputs(True)
        bad = data["tokens"].clone()
        bad[4] = V
        try:
            rlk.linear_logp(data["hidden"], data["weight"][lo:hi], bad, group=group)
        except ValueError as exc:
            assert f"[0, {V}) (the vocabulary over the group)" in str(exc), exc
        else:
            raise AssertionError("RLK_CHECK_INPUTS did not catch a token outside the group's V")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("world", [2, 4])
def test_vocab_parallel_equals_unsharded(world):
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen([sys.executable, __file__, str(rank), str(world), str(port)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(world)
    ]
    failures = []
    for rank, proc in enumerate(procs):
        try:
            output, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"rank {rank} exited {proc.returncode}:\n{output[-3000:]}")
    assert not failures, "\n".join(failures)


def test_group_needs_an_initialised_process_group():
    logits, tokens = torch.randn(2, 5), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(TypeError, match="group is required"):
        rlk.distributed.logp(logits, tokens, group=None)
    with pytest.raises(TypeError, match=r"group must be a torch\.distributed\.ProcessGroup"):
        rlk.distributed.logp(logits, tokens, group=object())


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
