"""The kernel's wrapping of QuACK's epilogue (against a CPU fake) and the calls it declines."""

from __future__ import annotations

import pytest
import torch
from fake_quack import DECOY, FakeQuack

from rlk_quack.kernel import check, forward

HALF = (torch.bfloat16, torch.float16)


def _inputs(rows: int, width: int, vocab: int, dtype: torch.dtype,
            seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, generator=gen).to(dtype)
    weight = (torch.randn(vocab, width, generator=gen) * 3.0 / width**0.5).to(dtype)
    tokens = torch.randint(0, vocab, (rows,), generator=gen)
    return hidden, weight, tokens


def _float64_logp(hidden: torch.Tensor, weight: torch.Tensor,
                  tokens: torch.Tensor) -> torch.Tensor:
    log_probs = torch.log_softmax(hidden.double() @ weight.double().T, dim=-1)
    return log_probs.gather(1, tokens.clamp(0, weight.shape[0] - 1).unsqueeze(1)).squeeze(1)


def _forward(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor,
             ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    return forward(hidden, weight, tokens, None, 1.0, ignore_index, False, None, None)


@pytest.mark.parametrize("dtype", HALF)
def test_logp_is_the_target_logit_less_the_lse(fake: FakeQuack, dtype: torch.dtype):
    seed = torch.seed() % 2**31
    hidden, weight, tokens = _inputs(37, 64, 301, dtype, seed)
    logp, entropy, lse = _forward(hidden, weight, tokens)
    assert entropy is None
    assert (logp.dtype, lse.dtype, logp.shape, lse.shape) == (
        torch.float32, torch.float64, (37,), (37,))
    torch.testing.assert_close(logp.double(), _float64_logp(hidden, weight, tokens),
                               atol=2e-5, rtol=1e-5, msg=f"seed {seed}")
    expected_lse = torch.logsumexp(hidden.double() @ weight.double().T, dim=-1)
    torch.testing.assert_close(lse, expected_lse, atol=2e-5, rtol=1e-5, msg=f"seed {seed}")


def test_one_gemm_without_the_logits_and_without_autotuning(fake: FakeQuack):
    hidden, weight, tokens = _inputs(5, 32, 40, torch.bfloat16, 1)
    _forward(hidden, weight, tokens)
    [call] = fake.calls
    assert call["store_d"] is False  # the logits are never written
    assert call["tuned"] is False  # an autotune sweep per new row count would stall training
    assert call["A"] is hidden
    assert call["B"].shape == (32, 40) and call["B"].data_ptr() == weight.data_ptr()


def test_ignored_tokens_give_zero_and_out_of_range_tokens_nan(fake: FakeQuack):
    hidden, weight, tokens = _inputs(8, 32, 50, torch.bfloat16, 2)
    tokens[[0, 5]] = -100
    tokens[[2, 3]] = torch.tensor([50, -7])  # QuACK leaves these slots unwritten
    logp, _, _ = _forward(hidden, weight, tokens)
    assert logp[[0, 5]].tolist() == [0.0, 0.0]
    assert logp[[2, 3]].isnan().all() and not (logp == DECOY).any()
    keep = torch.tensor([1, 4, 6, 7])
    torch.testing.assert_close(logp[keep].double(),
                               _float64_logp(hidden, weight, tokens)[keep], atol=2e-5, rtol=1e-5)


def test_an_ignore_index_inside_the_vocabulary_still_gives_zero(fake: FakeQuack):
    hidden, weight, tokens = _inputs(6, 32, 50, torch.float16, 3)
    tokens[4] = 9
    logp, _, _ = _forward(hidden, weight, tokens, ignore_index=9)
    assert logp[4].item() == 0.0 and (logp[[0, 1, 2, 3, 5]] < 0).all()


def test_a_row_without_a_finite_lse_gives_nan_unless_ignored(fake: FakeQuack):
    hidden, weight, tokens = _inputs(4, 32, 50, torch.bfloat16, 4)
    hidden[1, 3] = float("nan")
    hidden[2, 0] = float("inf")
    tokens[2] = -100
    logp, _, lse = _forward(hidden, weight, tokens)
    assert logp[1].isnan() and logp[2].item() == 0.0 and lse[1].isnan()
    assert logp[[0, 3]].isfinite().all()


def test_unaligned_hidden_rows_are_copied_not_refused(fake: FakeQuack):
    hidden, weight, tokens = _inputs(6, 32, 40, torch.bfloat16, 5)
    strided = torch.zeros(6, 40, dtype=torch.bfloat16)[:, 3:35]  # rows start off 16 bytes
    strided.copy_(hidden)
    assert check(hidden=strided, weight=weight, bias=None, temperature=1.0, group=None,
                 softcap=None) is None
    logp, _, _ = _forward(strided, weight, tokens)
    torch.testing.assert_close(logp, _forward(hidden, weight, tokens)[0], atol=0, rtol=0)
    assert fake.calls[0]["A"].is_contiguous()


def test_no_rows_call_nothing(fake: FakeQuack):
    hidden, weight, _ = _inputs(0, 32, 40, torch.bfloat16, 6)
    logp, entropy, lse = _forward(hidden, weight, torch.zeros(0, dtype=torch.int64))
    assert (logp.shape, lse.shape, entropy, fake.calls) == ((0,), (0,), None, [])


def _check(**changes: object) -> str | None:
    hidden, weight, _ = _inputs(4, 64, 40, torch.bfloat16, 7)
    args: dict[str, object] = {"hidden": hidden, "weight": weight, "bias": None,
                               "temperature": 1.0, "group": None, "softcap": None,
                               "tokens": torch.zeros(4, dtype=torch.int64),
                               "ignore_index": -100, "with_entropy": False}
    args.update(changes)
    return check(**args)  # type: ignore[arg-type]


def test_check_takes_the_plain_no_bias_call():
    assert _check() is None


@pytest.mark.parametrize(("changes", "words"), [
    ({"bias": torch.zeros(40, dtype=torch.bfloat16)}, "a bias"),
    ({"temperature": 0.7}, "temperature"),
    ({"temperature": torch.ones(4)}, "temperature"),
    ({"softcap": 30.0}, "soft cap"),
    ({"group": object()}, "vocabulary-sharded"),
    ({"weight": torch.zeros(40, 64)}, "float32 weight beside a bfloat16 hidden"),
    ({"hidden": torch.zeros(4, 12, dtype=torch.bfloat16),
      "weight": torch.zeros(40, 12, dtype=torch.bfloat16)}, "H=12"),
    ({"weight": torch.zeros(64, 40, dtype=torch.bfloat16).T}, "weight whose rows"),
    ({"weight": torch.zeros(40 * 64 + 1, dtype=torch.bfloat16)[1:].view(40, 64)},
     "weight whose rows"),
])
def test_check_declines_what_the_epilogue_cannot_compute(changes: dict[str, object],
                                                         words: str):
    reason = _check(**changes)
    assert reason is not None and words in reason, reason
