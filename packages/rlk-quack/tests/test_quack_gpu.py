"""The backend on a Hopper or Blackwell GPU with the real QuACK (marker `gpu`; skipped elsewhere).

Log-probabilities are compared with float64 on the same rounded inputs, beside rlk-cuda's on
the same call, over odd and large vocabularies, odd row counts, logit scales 2-4 and seeds
drawn afresh each run (printed) as well as fixed ones.
"""

from __future__ import annotations

import time

import pytest
import torch

import rlk
from rlk.testing.capture import captured
from rlk.testing.poison import poisoned_allocations
from rlk_quack.kernel import forward
from rlk_quack.probe import probe

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
DEVICE = torch.device("cuda")
if probe(DEVICE) is not None:
    pytest.skip(f"the quack backend cannot serve this machine: {probe(DEVICE)}",
                allow_module_level=True)

HALF = (torch.bfloat16, torch.float16)
RANDOM_SEED = int(torch.randint(0, 2**31 - 1, ()).item())
# (N, H, V, logit scale): odd row counts, unpadded and padded vocabularies
SHAPES = [(1, 64, 11, 3.0), (7, 128, 1000, 2.0), (1000, 512, 32001, 4.0),
          (4099, 1024, 50257, 3.0), (513, 2048, 151936, 2.0), (256, 4096, 128256, 3.0)]


def _inputs(rows: int, width: int, vocab: int, scale: float, dtype: torch.dtype,
            seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    hidden = torch.randn(rows, width, generator=gen, device=DEVICE).to(dtype)
    weight = (torch.randn(vocab, width, generator=gen, device=DEVICE)
              * (scale / width**0.5)).to(dtype)
    tokens = torch.randint(0, vocab, (rows,), generator=gen, device=DEVICE)
    return hidden, weight, tokens


def _float64_logp(hidden: torch.Tensor, weight: torch.Tensor,
                  tokens: torch.Tensor) -> torch.Tensor:
    found = torch.empty(hidden.shape[0], dtype=torch.float64, device=DEVICE)
    for start in range(0, hidden.shape[0], 1024):  # 1024 rows of float64 logits at a time
        rows = slice(start, start + 1024)
        log_probs = torch.log_softmax(hidden[rows].double() @ weight.double().T, dim=-1)
        found[rows] = log_probs.gather(1, tokens[rows].unsqueeze(1)).squeeze(1)
    return found


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.double() - want).abs().max().item()


def test_probe_accepts_this_machine():
    assert probe(DEVICE) is None


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N={} H={} V={} std={}".format(*s))
@pytest.mark.parametrize("seed", [0, RANDOM_SEED], ids=["fixed", f"random{RANDOM_SEED}"])
def test_logp_matches_float64_as_closely_as_rlk_cuda(shape: tuple[int, int, int, float],
                                                     dtype: torch.dtype, seed: int):
    hidden, weight, tokens = _inputs(*shape, dtype, seed)
    want = _float64_logp(hidden, weight, tokens)
    with torch.no_grad(), rlk.use_backends("quack", strict=True):
        served = rlk.linear_logp(hidden, weight, tokens)
    with torch.no_grad(), rlk.use_backends("cuda", strict=True):
        cuda = rlk.linear_logp(hidden, weight, tokens)
    quack_error, cuda_error = _error(served, want), _error(cuda, want)
    assert quack_error <= max(1e-4, 2 * cuda_error), (quack_error, cuda_error, seed)


def test_ignored_out_of_range_and_nan_rows_with_poisoned_allocations():
    hidden, weight, tokens = _inputs(64, 256, 5003, 3.0, torch.bfloat16, 1)
    tokens[[0, 9]] = -100
    tokens[[3, 4]] = torch.tensor([5003, -2], device=DEVICE)
    hidden[7, 5] = float("nan")
    with poisoned_allocations():
        logp, entropy, lse = forward(hidden, weight, tokens, None, 1.0, -100, False, None, None)
    assert entropy is None
    assert logp[[0, 9]].tolist() == [0.0, 0.0]
    assert logp[[3, 4, 7]].isnan().all() and lse[7].isnan()
    rest = torch.ones(64, dtype=torch.bool, device=DEVICE)
    rest[[0, 9, 3, 4, 7]] = False
    assert _error(logp[rest], _float64_logp(hidden[rest], weight, tokens[rest])) <= 1e-4
    expected_lse = torch.logsumexp(hidden[rest].double() @ weight.double().T, dim=-1)
    assert _error(lse[rest], expected_lse) <= 1e-4


def test_selection_takes_scoring_calls_and_leaves_the_rest_to_rlk_cuda():
    """By priority alone: no backend named."""
    hidden, weight, tokens = _inputs(32, 128, 1000, 2.0, torch.bfloat16, 2)
    with torch.no_grad():
        assert rlk.explain("linear_logp", hidden, weight, tokens).backend == "quack"
        for kwargs in ({"temperature": 0.7}, {"bias": torch.zeros_like(weight[:, 0])},
                       {"softcap": 30.0}, {"logit_scale": 0.5}):
            chosen = rlk.explain("linear_logp", hidden, weight, tokens, **kwargs)
            assert chosen.backend == "cuda" and "quack" in chosen.rejected, kwargs
        assert rlk.explain("linear_logp", hidden, weight.float(), tokens).backend == "cuda"
        assert rlk.explain("linear_logp_entropy", hidden, weight, tokens).backend == "cuda"
    chosen = rlk.explain("linear_logp", hidden.requires_grad_(True), weight, tokens)
    assert chosen.backend == "cuda" and "backward" in chosen.rejected["quack"]
    logp = rlk.linear_logp(hidden, weight, tokens)  # trains through rlk-cuda
    logp.sum().backward()
    assert hidden.grad is not None and hidden.grad.isfinite().all()


def test_autocast_scoring_is_served_in_the_autocast_dtype():
    hidden, weight, tokens = _inputs(48, 256, 3001, 3.0, torch.float32, 3)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        assert rlk.explain("linear_logp", hidden, weight.bfloat16(), tokens).backend == "quack"
        logp = rlk.linear_logp(hidden, weight.bfloat16(), tokens)
    want = _float64_logp(hidden.bfloat16(), weight.bfloat16(), tokens)
    assert _error(logp, want) <= 1e-4


def test_a_new_row_count_does_not_compile_again():
    """tuned=False: one kernel per dtype and layout, whatever N is (RL batches vary)."""
    hidden, weight, tokens = _inputs(4096, 1024, 32000, 2.0, torch.bfloat16, 4)
    with torch.no_grad(), rlk.use_backends("quack", strict=True):
        rlk.linear_logp(hidden, weight, tokens)  # compiles for this dtype, if not yet
        torch.cuda.synchronize()
        seconds = []
        for rows in (4095, 1777, 333):
            start = time.perf_counter()
            rlk.linear_logp(hidden[:rows], weight, tokens[:rows])
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
    assert max(seconds) < 0.5, seconds  # a compile takes seconds


def test_capture_replays_equal_eager_calls():
    hidden, weight, tokens = _inputs(96, 256, 1000, 3.0, torch.bfloat16, 5)

    def run() -> torch.Tensor:
        with torch.no_grad():
            return rlk.linear_logp(hidden, weight, tokens)

    with rlk.use_backends("quack", strict=True):
        graph, replayed = captured(run)
        for seed in (11, 12):
            fresh = _inputs(96, 256, 1000, 3.0, torch.bfloat16, seed)
            for static, value in zip((hidden, weight, tokens), fresh, strict=True):
                static.copy_(value)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(replayed, run()), seed
