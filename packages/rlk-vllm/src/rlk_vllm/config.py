"""Validated rollout configuration, read from the seed's model-config dictionary.

Shape accepted by `VLLMSamplerConfig.from_model_config`::

    {"model": "/path/or/name",
     "sampler": {"num_generations": 4,
                 "sampling_params": {"temperature": 0.7, "top_p": 0.9, "max_tokens": 256},
                 "request_mode": "separate", "pad_token_id": 0},
     "vllm": {"engine_kwargs": {"dtype": "float16"}}}

Every mistake is reported before an engine starts: a typo or a wrong type would
otherwise surface minutes later from deep inside vLLM, or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

REQUEST_MODES = ("separate", "n")
# Measured (benchmarks/vllm/request_mode.py, CPU, tiny model): one request with n=G was 3-6%
# faster than G separate requests, with identical tokens. See docs/backends/vllm.md.
DEFAULT_REQUEST_MODE = "n"
# The two vLLM modes that return log-probs (the *_logits modes return logits instead).
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")

_Check = Callable[[Any], bool]
# name -> (expected type in words, type check, range check or None, range in words)
_Field = tuple[str, _Check, _Check | None, str]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(_is_int(v) for v in value)


def _is_str_or_str_list(value: Any) -> bool:
    if isinstance(value, str):
        return True
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


_SAMPLING_FIELDS: dict[str, _Field] = {
    "temperature": ("a number", _is_number, lambda v: v >= 0, ">= 0"),
    "top_p": ("a number", _is_number, lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": ("an int", _is_int, lambda v: v >= -1, ">= -1 (0 or -1 disable it)"),
    "min_p": ("a number", _is_number, lambda v: 0 <= v <= 1, "in [0, 1]"),
    "max_tokens": ("an int", _is_int, lambda v: v >= 1, ">= 1"),
    "min_tokens": ("an int", _is_int, lambda v: v >= 0, ">= 0"),
    "seed": ("an int or None", lambda v: v is None or _is_int(v), None, ""),
    "stop": ("a str or a list of str", _is_str_or_str_list, None, ""),
    "stop_token_ids": ("a list of int", _is_int_list, None, ""),
    "ignore_eos": ("a bool", lambda v: isinstance(v, bool), None, ""),
    "presence_penalty": ("a number", _is_number, None, ""),
    "frequency_penalty": ("a number", _is_number, None, ""),
    "repetition_penalty": ("a number", _is_number, lambda v: v > 0, "> 0"),
    "include_stop_str_in_output": ("a bool", lambda v: isinstance(v, bool), None, ""),
    "skip_special_tokens": ("a bool", lambda v: isinstance(v, bool), None, ""),
    "detokenize": ("a bool", lambda v: isinstance(v, bool), None, ""),
}
# Set by RolloutExecutor itself; accepting them would silently break the batch layout.
_RESERVED_SAMPLING = {
    "n": "use sampler.num_generations",
    "logprobs": "RolloutExecutor always asks vLLM for the sampled token's log-prob",
    "prompt_logprobs": "RolloutExecutor does not return prompt log-probs",
}
# Engine arguments checked here; any other key is checked against vLLM's EngineArgs when
# the engine starts (vLLM has too many to mirror, and they change between releases).
_ENGINE_FIELDS: dict[str, _Field] = {
    "enable_prefix_caching": ("a bool", lambda v: isinstance(v, bool), None, ""),
    "enforce_eager": ("a bool", lambda v: isinstance(v, bool), None, ""),
    "skip_tokenizer_init": ("a bool", lambda v: isinstance(v, bool), None, ""),
    "dtype": ("a str", lambda v: isinstance(v, str), None, ""),
    "tokenizer": ("a str", lambda v: isinstance(v, str), None, ""),
    "seed": ("an int", _is_int, None, ""),
    "max_model_len": ("an int", _is_int, lambda v: v >= 1, ">= 1"),
    "block_size": ("an int", _is_int, lambda v: v >= 1, ">= 1"),
    "tensor_parallel_size": ("an int", _is_int, lambda v: v >= 1, ">= 1"),
    "gpu_memory_utilization": ("a number", _is_number, lambda v: 0 < v <= 1, "in (0, 1]"),
    "logprobs_mode": ("a str", lambda v: v in LOGPROBS_MODES, None, ""),
}
_ENGINE_DEFAULTS: dict[str, Any] = {
    "enable_prefix_caching": True,
    # Rollout log-probs must include the temperature, as the trainer's rlk.logp does.
    "logprobs_mode": "processed_logprobs",
}
_TOP_LEVEL = ("model", "sampler", "vllm")
_SAMPLER_KEYS = ("num_generations", "sampling_params", "request_mode", "pad_token_id")
_VLLM_KEYS = ("engine_kwargs",)


def _check_keys(where: str, given: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in given if k not in allowed)
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {unknown}; expected some of {list(allowed)}"
        )


def _section(where: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} must be a dict, got {type(value).__name__}: {value!r}")
    for key in value:
        if not isinstance(key, str):
            raise TypeError(f"{where}: keys must be str, got {type(key).__name__}: {key!r}")
    return value


def _check_typed(where: str, values: Mapping[str, Any], table: Mapping[str, _Field]) -> None:
    for name, value in values.items():
        if name not in table:
            continue
        expected, type_ok, range_ok, bounds = table[name]
        if name == "logprobs_mode" and isinstance(value, str) and not type_ok(value):
            raise ValueError(f"{where}.{name} must be one of {list(LOGPROBS_MODES)}, "
                             f"got {value!r}")
        if not type_ok(value):
            raise TypeError(
                f"{where}.{name} must be {expected}, got {type(value).__name__}: {value!r}"
            )
        if range_ok is not None and not range_ok(value):
            raise ValueError(f"{where}.{name} must be {bounds}, got {value!r}")


def _check_sampling_params(params: Mapping[str, Any]) -> None:
    where = "sampler.sampling_params"
    for name in params:
        if name in _RESERVED_SAMPLING:
            raise ValueError(f"{where}.{name} is not accepted: {_RESERVED_SAMPLING[name]}")
    _check_keys(where, params, tuple(_SAMPLING_FIELDS))
    _check_typed(where, params, _SAMPLING_FIELDS)


def _check_engine_kwargs(kwargs: Mapping[str, Any]) -> None:
    where = "vllm.engine_kwargs"
    if "model" in kwargs:
        raise ValueError(f"{where}.model is not accepted: give the model as the top-level "
                         "'model' field")
    _check_typed(where, kwargs, _ENGINE_FIELDS)


@dataclass(frozen=True)
class VLLMSamplerConfig:
    """Everything RolloutExecutor needs: the model, the group size G, sampling and engine options.

    Validated on construction, so a config object that exists is usable.
    """

    model: str
    num_generations: int = 1
    sampling_params: Mapping[str, Any] = field(default_factory=dict)
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    request_mode: str = DEFAULT_REQUEST_MODE
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"model must be a non-empty str (a path or a model name), "
                             f"got {self.model!r}")
        if not _is_int(self.num_generations):
            raise TypeError(f"sampler.num_generations must be an int, got "
                            f"{type(self.num_generations).__name__}: {self.num_generations!r}")
        if self.num_generations < 1:
            raise ValueError(f"sampler.num_generations must be >= 1 (the GRPO group size G), "
                             f"got {self.num_generations}")
        if self.request_mode not in REQUEST_MODES:
            raise ValueError(f"sampler.request_mode must be one of {list(REQUEST_MODES)}, "
                             f"got {self.request_mode!r}")
        if not _is_int(self.pad_token_id) or self.pad_token_id < 0:
            raise ValueError(f"sampler.pad_token_id must be an int >= 0, "
                             f"got {self.pad_token_id!r}")
        params = dict(_section("sampler.sampling_params", self.sampling_params))
        _check_sampling_params(params)
        engine = dict(_section("vllm.engine_kwargs", self.engine_kwargs))
        _check_engine_kwargs(engine)
        engine = {**_ENGINE_DEFAULTS, **engine}
        object.__setattr__(self, "sampling_params", MappingProxyType(params))
        object.__setattr__(self, "engine_kwargs", MappingProxyType(engine))

    @classmethod
    def from_model_config(cls, config: Mapping[str, Any]) -> VLLMSamplerConfig:
        """Read the seed's nested dict; unknown keys and wrong types raise before any engine."""
        config = _section("model config", config)
        _check_keys("model config", config, _TOP_LEVEL)
        if "model" not in config:
            raise ValueError("model config: missing required field 'model' "
                             "(a local path or a model name)")
        sampler = _section("sampler", config.get("sampler"))
        _check_keys("sampler", sampler, _SAMPLER_KEYS)
        vllm = _section("vllm", config.get("vllm"))
        _check_keys("vllm", vllm, _VLLM_KEYS)
        return cls(
            model=config["model"],
            num_generations=sampler.get("num_generations", 1),
            sampling_params=sampler.get("sampling_params") or {},
            engine_kwargs=vllm.get("engine_kwargs") or {},
            request_mode=sampler.get("request_mode", DEFAULT_REQUEST_MODE),
            pad_token_id=sampler.get("pad_token_id", 0),
        )

    def to_model_config(self) -> dict[str, Any]:
        """The nested dict form; `from_model_config(c.to_model_config()) == c`."""
        return {
            "model": self.model,
            "sampler": {
                "num_generations": self.num_generations,
                "sampling_params": dict(self.sampling_params),
                "request_mode": self.request_mode,
                "pad_token_id": self.pad_token_id,
            },
            "vllm": {"engine_kwargs": dict(self.engine_kwargs)},
        }

    @property
    def temperature(self) -> float:
        """Sampling temperature (vLLM's default 1.0 when unset)."""
        return float(self.sampling_params.get("temperature", 1.0))

    @property
    def seed(self) -> int | None:
        """Base seed for the rollouts; None draws fresh randomness every call."""
        seed = self.sampling_params.get("seed")
        return None if seed is None else int(seed)

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for `vllm.LLM`: the model plus the engine kwargs with defaults."""
        return {"model": self.model, **self.engine_kwargs}
