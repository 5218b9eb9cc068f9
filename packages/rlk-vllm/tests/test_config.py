"""VLLMSamplerConfig: the seed's dict shape, defaults, and an error for every kind of mistake."""

from __future__ import annotations

from typing import Any

import pytest

from rlk_vllm import VLLMSamplerConfig

SEED_SHAPE: dict[str, Any] = {
    "model": "/models/tiny",
    "sampler": {
        "num_generations": 4,
        "sampling_params": {"temperature": 0.7, "top_p": 0.9},
    },
    "vllm": {"engine_kwargs": {"dtype": "float16"}},
}


def with_changes(**sections: Any) -> dict[str, Any]:
    config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in SEED_SHAPE.items()}
    for key, value in sections.items():
        config[key] = value
    return config


def test_seed_shape_reads_every_field() -> None:
    config = VLLMSamplerConfig.from_model_config(SEED_SHAPE)
    assert config.model == "/models/tiny"
    assert config.num_generations == 4
    assert dict(config.sampling_params) == {"temperature": 0.7, "top_p": 0.9}
    assert config.temperature == 0.7
    assert config.seed is None
    assert config.engine_kwargs["dtype"] == "float16"


def test_prefix_caching_is_on_by_default_and_can_be_turned_off() -> None:
    config = VLLMSamplerConfig.from_model_config(SEED_SHAPE)
    assert config.engine_kwargs["enable_prefix_caching"] is True
    assert config.engine_args()["enable_prefix_caching"] is True
    assert config.engine_args()["model"] == "/models/tiny"
    off = with_changes(vllm={"engine_kwargs": {"enable_prefix_caching": False}})
    assert VLLMSamplerConfig.from_model_config(off).engine_kwargs["enable_prefix_caching"] is False


def test_defaults_for_a_minimal_config() -> None:
    config = VLLMSamplerConfig.from_model_config({"model": "m"})
    assert config.num_generations == 1
    assert config.request_mode == "n"
    assert config.pad_token_id == 0
    assert config.engine_kwargs["logprobs_mode"] == "processed_logprobs"
    assert config.temperature == 1.0


def test_round_trip_through_the_dict_form() -> None:
    config = VLLMSamplerConfig.from_model_config(SEED_SHAPE)
    again = VLLMSamplerConfig.from_model_config(config.to_model_config())
    assert again == config


def test_config_is_immutable() -> None:
    config = VLLMSamplerConfig.from_model_config(SEED_SHAPE)
    with pytest.raises(TypeError):
        config.sampling_params["temperature"] = 2.0  # type: ignore[index]


def test_missing_model_is_named() -> None:
    with pytest.raises(ValueError, match="missing required field 'model'"):
        VLLMSamplerConfig.from_model_config({"sampler": {"num_generations": 2}})
    with pytest.raises(ValueError, match="non-empty str"):
        VLLMSamplerConfig.from_model_config({"model": "  "})


@pytest.mark.parametrize("group", [0, -3])
def test_group_size_below_one(group: int) -> None:
    with pytest.raises(ValueError, match=f"num_generations must be >= 1.*got {group}"):
        VLLMSamplerConfig.from_model_config(with_changes(sampler={"num_generations": group}))


@pytest.mark.parametrize("group", ["4", 2.0, True])
def test_group_size_of_the_wrong_type(group: Any) -> None:
    with pytest.raises(TypeError, match="num_generations must be an int"):
        VLLMSamplerConfig.from_model_config(with_changes(sampler={"num_generations": group}))


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"model": "m", "samplr": {}}, "samplr"),
        ({"model": "m", "sampler": {"num_generation": 2}}, "num_generation"),
        ({"model": "m", "vllm": {"engine_kwarg": {}}}, "engine_kwarg"),
        ({"model": "m", "sampler": {"sampling_params": {"temprature": 1.0}}}, "temprature"),
    ],
)
def test_unknown_fields_are_named(config: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=f"unknown field.*'{named}'"):
        VLLMSamplerConfig.from_model_config(config)


@pytest.mark.parametrize(
    ("params", "error", "message"),
    [
        ({"temperature": "hot"}, TypeError, r"temperature must be a number, got str: 'hot'"),
        ({"temperature": -0.1}, ValueError, r"temperature must be >= 0"),
        ({"top_p": 1.5}, ValueError, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_k": 2.5}, TypeError, r"top_k must be an int"),
        ({"max_tokens": 0}, ValueError, r"max_tokens must be >= 1"),
        ({"seed": 1.5}, TypeError, r"seed must be an int or None"),
        ({"stop_token_ids": [1, "2"]}, TypeError, r"stop_token_ids must be a list of int"),
        ({"ignore_eos": 1}, TypeError, r"ignore_eos must be a bool"),
        ({"n": 4}, ValueError, r"sampling_params.n is not accepted: use sampler.num_generations"),
        ({"logprobs": 5}, ValueError, r"sampling_params.logprobs is not accepted"),
    ],
)
def test_ill_typed_sampling_params(params: dict[str, Any], error: type, message: str) -> None:
    config = {"model": "m", "sampler": {"sampling_params": params}}
    with pytest.raises(error, match=message):
        VLLMSamplerConfig.from_model_config(config)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"enable_prefix_caching": "yes"}, TypeError, r"enable_prefix_caching must be a bool"),
        ({"max_model_len": 0}, ValueError, r"max_model_len must be >= 1"),
        ({"gpu_memory_utilization": 1.5}, ValueError, r"gpu_memory_utilization must be in"),
        ({"logprobs_mode": "raw_logits"}, ValueError, r"logprobs_mode must be one of"),
        ({"model": "other"}, ValueError, r"top-level 'model'"),
    ],
)
def test_ill_typed_engine_kwargs(kwargs: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        VLLMSamplerConfig.from_model_config({"model": "m", "vllm": {"engine_kwargs": kwargs}})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("m", r"model config must be a dict, got str"),
        ({"model": "m", "sampler": [1]}, r"sampler must be a dict, got list"),
        ({"model": "m", "vllm": {"engine_kwargs": [("dtype", "half")]}},
         r"vllm.engine_kwargs must be a dict"),
        ({"model": "m", "sampler": {"request_mode": "batch"}}, r"request_mode must be one of"),
        ({"model": "m", "sampler": {"pad_token_id": -1}}, r"pad_token_id must be an int >= 0"),
    ],
)
def test_ill_shaped_sections(config: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        VLLMSamplerConfig.from_model_config(config)
