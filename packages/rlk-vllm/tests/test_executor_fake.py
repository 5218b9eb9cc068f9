"""RolloutExecutor against a fake engine: request shapes, seeds, batch layout, weight pushes."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest
import torch
from conftest import VOCAB, make_executor
from fakes import EOS, FakeLLM, FakeSamplingParams

from rlk_vllm import RolloutExecutor, VLLMSamplerConfig
from rlk_vllm import executor as executor_module

PROMPTS: list[dict[str, Any]] = [
    {"prompt_token_ids": [1, 5, 9, 4]},
    {"prompt_token_ids": [1, 7]},
    {"prompt_token_ids": torch.tensor([1, 3, 3, 8, 12, 30])},
]


def expected_logp(table: torch.Tensor, prev: int, token: int, temperature: float) -> float:
    """The float64 log-prob of `token` after `prev` under the bigram table at `temperature`."""
    return float((table[prev].double() / temperature).log_softmax(-1)[token])


def test_batch_layout_matches_the_engine_outputs(table: torch.Tensor) -> None:
    executor, llm = make_executor(table)
    batch = executor.generate(PROMPTS)
    group, prompts = 3, len(PROMPTS)
    rows = group * prompts
    assert batch.batch_size == rows and batch.group_size == group and batch.num_groups == prompts
    assert batch.group_ids.tolist() == [g for g in range(prompts) for _ in range(group)]
    assert batch.prompt_ids.shape == (rows, 6) and batch.prompt_ids.dtype == torch.int64
    assert batch.prompt_lengths.tolist() == [4] * 3 + [2] * 3 + [6] * 3
    width = int(batch.completion_lengths.max())
    assert batch.completion_ids.shape == (rows, width)
    assert batch.rollout_logp.dtype == torch.float32
    assert batch.completion_mask.dtype == torch.float32
    for row in range(rows):
        n, p = int(batch.completion_lengths[row]), int(batch.prompt_lengths[row])
        prompt = PROMPTS[row // group]["prompt_token_ids"]
        assert batch.prompt_ids[row, :p].tolist() == list(torch.as_tensor(prompt).tolist())
        assert (batch.prompt_ids[row, p:] == 0).all()
        assert batch.completion_mask[row].tolist() == [1.0] * n + [0.0] * (width - n)
        assert (batch.completion_ids[row, n:] == 0).all()
        assert (batch.rollout_logp[row, n:] == 0).all()
        prev = int(batch.prompt_ids[row, p - 1])
        for t in range(n):
            token = int(batch.completion_ids[row, t])
            want = expected_logp(table, prev, token, 0.7)
            assert batch.rollout_logp[row, t].item() == pytest.approx(want, abs=1e-5)
            prev = token
        last = int(batch.completion_ids[row, n - 1])
        assert batch.finish_reasons[row] == ("stop" if last == EOS else "length")
    assert batch.logp_temperature == 0.7
    assert batch.logprobs_mode == "processed_logprobs"
    assert len(llm.calls) == 1


def test_candidates_of_a_group_share_the_prompt_and_differ(table: torch.Tensor) -> None:
    executor, _ = make_executor(table, num_generations=4)
    batch = executor.generate(PROMPTS[:2])
    for g in range(2):
        rows = batch.prompt_ids[g * 4 : (g + 1) * 4]
        assert (rows == rows[0]).all()
        completions = {tuple(r.tolist()) for r in batch.completion_ids[g * 4 : (g + 1) * 4]}
        assert len(completions) > 1, "G candidates drawn with distinct seeds came out identical"


def test_request_shapes_and_their_seeds(table: torch.Tensor) -> None:
    n_exec, n_llm = make_executor(table, request_mode="n")
    sep_exec, sep_llm = make_executor(table, request_mode="separate")
    n_batch = n_exec.generate(PROMPTS, seed=100)
    sep_batch = sep_exec.generate(PROMPTS, seed=100)
    (n_prompts, n_params), = n_llm.calls
    (sep_prompts, sep_params), = sep_llm.calls
    assert [p.n for p in n_params] == [3, 3, 3]
    assert [p.seed for p in n_params] == [100, 103, 106]
    assert len(sep_prompts) == 9 and all(p.n == 1 for p in sep_params)
    assert [p.seed for p in sep_params] == list(range(100, 109))
    assert sep_prompts[0] == sep_prompts[2] == n_prompts[0]
    assert all(p.logprobs == 0 for p in n_params + sep_params)
    for field in ("completion_ids", "rollout_logp", "completion_mask", "prompt_ids"):
        assert torch.equal(getattr(n_batch, field), getattr(sep_batch, field)), field
    assert n_batch.finish_reasons == sep_batch.finish_reasons


def test_seeds_make_batches_reproducible(table: torch.Tensor) -> None:
    first, _ = make_executor(table)
    a1, a2 = first.generate(PROMPTS), first.generate(PROMPTS)
    replay, _ = make_executor(table)
    b1, b2 = replay.generate(PROMPTS), replay.generate(PROMPTS)
    assert torch.equal(a1.completion_ids, b1.completion_ids)
    assert torch.equal(a2.completion_ids, b2.completion_ids)
    assert not torch.equal(a1.completion_ids, a2.completion_ids), "successive calls repeated"
    explicit = first.generate(PROMPTS, seed=5)
    again = replay.generate(PROMPTS, seed=5)
    assert torch.equal(explicit.rollout_logp, again.rollout_logp)


def test_without_a_seed_requests_carry_none(table: torch.Tensor) -> None:
    executor, llm = make_executor(table, sampling_params={"max_tokens": 3})
    executor.generate(PROMPTS[:1])
    assert [p.seed for p in llm.calls[0][1]] == [None]


def test_text_prompts_and_texts(table: torch.Tensor) -> None:
    executor, llm = make_executor(table)
    batch = executor.generate(["hello", {"prompt": "abc"}])
    assert llm.calls[0][0] == ["hello", {"prompt": "abc"}]
    assert batch.prompt_lengths.tolist() == [5] * 3 + [3] * 3
    assert batch.completion_texts is not None and len(batch.completion_texts) == 6
    lengths = batch.completion_lengths.tolist()
    assert [len(t) for t in batch.completion_texts] == lengths


def test_no_texts_without_a_tokenizer(table: torch.Tensor) -> None:
    executor, _ = make_executor(table, engine_kwargs={"skip_tokenizer_init": True})
    assert executor.generate(PROMPTS[:1]).completion_texts is None


@pytest.mark.parametrize(
    ("mode", "temperature", "expected"),
    [("processed_logprobs", 0.5, 0.5), ("raw_logprobs", 0.5, 1.0),
     ("processed_logprobs", 0.0, 1.0)],
)
def test_logp_temperature_follows_vllm(
    table: torch.Tensor, mode: str, temperature: float, expected: float
) -> None:
    executor, _ = make_executor(
        table, engine_kwargs={"logprobs_mode": mode},
        sampling_params={"temperature": temperature, "max_tokens": 4, "seed": 1},
    )
    batch = executor.generate(PROMPTS[:1])
    assert batch.logp_temperature == expected
    prev = PROMPTS[0]["prompt_token_ids"][-1]
    token = int(batch.completion_ids[0, 0])
    assert batch.rollout_logp[0, 0].item() == pytest.approx(
        expected_logp(table, prev, token, expected), abs=1e-5)


@pytest.mark.parametrize(
    ("prompts", "error", "message"),
    [
        ([], ValueError, "at least one prompt"),
        ([""], ValueError, r"prompts\[0\] is an empty string"),
        ([{"prompt_token_ids": []}], ValueError, "is empty"),
        ([{"prompt_token_ids": [1, -2]}], ValueError, r"ints >= 0, got -2"),
        ([{"prompt_token_ids": [1, 2.0]}], ValueError, r"ints >= 0, got 2.0"),
        ([{"tokens": [1]}], ValueError, r"must have 'prompt_token_ids'"),
        ([[1, 2]], TypeError, r"must be a str or a mapping"),
        ([{"prompt_token_ids": torch.ones(2, 2, dtype=torch.int64)}], TypeError, "1-D integer"),
    ],
)
def test_bad_prompts(table: torch.Tensor, prompts: list[Any], error: type, message: str) -> None:
    executor, llm = make_executor(table)
    with pytest.raises(error, match=message):
        executor.generate(prompts)
    assert llm.calls == []


def test_missing_logprobs_is_an_error(table: torch.Tensor) -> None:
    executor, llm = make_executor(table)
    llm.drop_logprobs = True
    with pytest.raises(RuntimeError, match="expected a log-prob for each of"):
        executor.generate(PROMPTS[:1])


def test_executor_accepts_the_seed_dict(table: torch.Tensor) -> None:
    config = {"model": "m", "sampler": {"num_generations": 2,
                                        "sampling_params": {"max_tokens": 2}}}
    executor = RolloutExecutor(config, llm=FakeLLM(table), sampling_params_cls=FakeSamplingParams)
    assert executor.config.num_generations == 2
    assert executor.generate(PROMPTS[:2]).batch_size == 4


def test_update_weights_loads_and_resets_the_prefix_cache(table: torch.Tensor) -> None:
    executor, llm = make_executor(table, sampling_params={"temperature": 1.0, "max_tokens": 5})
    before = executor.generate(PROMPTS, seed=3)
    assert llm.calls and llm.resets == 0
    new_table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(99)) * 2
    executor.update_weights({"table": new_table.requires_grad_()})
    assert llm.resets == 1 and torch.equal(llm.model.table, new_table.detach())
    after = executor.generate(PROMPTS, seed=3)
    assert not torch.equal(before.rollout_logp, after.rollout_logp)
    token, prev = int(after.completion_ids[0, 0]), PROMPTS[0]["prompt_token_ids"][-1]
    assert after.rollout_logp[0, 0].item() == pytest.approx(
        expected_logp(new_table.detach(), prev, token, 1.0), abs=1e-5)


def test_update_weights_errors(table: torch.Tensor) -> None:
    executor, llm = make_executor(table)
    with pytest.raises(ValueError, match="no weights"):
        executor.update_weights({})
    llm.refuse_reset = True
    with pytest.raises(RuntimeError, match="prefix cache"):
        executor.update_weights([("table", table)])


class SyncMPClient:
    """Stands for vLLM's client of an engine core in another process."""


def test_update_weights_refuses_a_multiprocess_engine(table: torch.Tensor) -> None:
    executor, llm = make_executor(table)
    llm.llm_engine = types.SimpleNamespace(engine_core=SyncMPClient())  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        executor.update_weights({"table": table})
    assert llm.resets == 0


@dataclasses.dataclass
class FakeEngineArgs:
    model: str = ""
    dtype: str = "auto"
    block_size: int | None = None
    enable_prefix_caching: bool | None = None
    logprobs_mode: str = "raw_logprobs"


class RecordingLLM:
    def __init__(self, model: str, dtype: str = "auto", **kwargs: Any) -> None:
        self.kwargs = {"model": model, "dtype": dtype, **kwargs}


def fake_vllm_module(cpu: bool = True) -> types.ModuleType:
    """Stands for `vllm`, `vllm.engine.arg_utils` and `vllm.platforms` at once."""
    module = types.ModuleType("vllm")
    module.current_platform = types.SimpleNamespace(is_cpu=lambda: cpu)  # type: ignore[attr-defined]
    module.LLM = RecordingLLM  # type: ignore[attr-defined]
    module.SamplingParams = FakeSamplingParams  # type: ignore[attr-defined]
    module.EngineArgs = FakeEngineArgs  # type: ignore[attr-defined]
    return module


@pytest.mark.parametrize("cpu", [True, False])
def test_engine_starts_lazily_with_the_configured_kwargs(
    monkeypatch: pytest.MonkeyPatch, cpu: bool
) -> None:
    started: list[str] = []

    def require(feature: str = "", module: str = "vllm") -> types.ModuleType:
        started.append(module)
        return fake_vllm_module(cpu)

    monkeypatch.setattr(executor_module, "require_vllm", require)
    config = VLLMSamplerConfig(model="/m", engine_kwargs={"dtype": "half", "block_size": 32})
    executor = RolloutExecutor(config)
    assert started == []
    llm = executor.llm
    expected = {"model": "/m", "dtype": "half", "block_size": 32,
                "enable_prefix_caching": True, "logprobs_mode": "processed_logprobs"}
    if cpu:  # seeded requests with chunked prefill crash vLLM's CPU runner
        expected["enable_chunked_prefill"] = False
    assert llm.kwargs == expected
    assert executor.llm is llm


def test_unknown_engine_kwargs_are_named_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor_module, "require_vllm", lambda *a, **k: fake_vllm_module())
    executor = RolloutExecutor(VLLMSamplerConfig(model="/m", engine_kwargs={"blok_size": 32}))
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['blok_size'\]"):
        executor.llm  # noqa: B018
