"""`trl-grpo`: TRL's GRPOTrainer end to end, as is (peer `trl`) and patched by
rlk.integrations.trl (rows `rlk:<backend>`), without generation.

A random Qwen2.5-shaped model is built from a config (nothing downloaded; V = 151936):
0.5B and 1.5B whole, and the 7B shape with 8 of its 28 layers (the LM head, what rlk
replaces, whole). Generation is replaced by fixed completions (`FixedCompletions`, TRL's
`rollout_func`), so both runs see identical tokens. Training runs as TRL's defaults do on
a GPU: float32 parameters, bf16 autocast, gradient checkpointing, beta 0.04 (a reference
model), loss_type "dapo".

- mode `fwd+bwd`, the train step: TRL's `compute_loss` and its backward on one scored
  micro-batch (no optimizer step, no generation);
- mode `fwd`, scoring: the old and reference log-probs of the micro-batch (TRL's
  `_get_per_token_logps_and_entropies` on the policy and the reference model, no grad);
- row `backbone`, a floor: the same without the LM head and the loss (`backbone`), so that
  a row's time minus the floor's is its head's and loss's share.

A case's dims carry `tokens` (B x T) for tokens per second; its extra memory is the step's
own (activations and gradients) above the two models. `largest_micro_batch` (and
`python -m rlk.bench.workloads.trl_grpo --largest-micro-batch`) finds the largest B that
trains at a given T, as is and patched.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlk.bench.workload import (
    FORWARD,
    FORWARD_BACKWARD,
    Blocked,
    Call,
    Case,
    Cost,
    Error,
    Inputs,
    Outputs,
    Peer,
    Workload,
)

VOCAB = 151936  # Qwen2.5's
# Qwen2Config fields of each shape; "qwen2.5-7b-8l" has 8 of the 7B's 28 layers
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2,
                         tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2,
                         tie_word_embeddings=True),
    "qwen2.5-7b-8l": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=8,
                          num_attention_heads=28, num_key_value_heads=4,
                          tie_word_embeddings=False),
    # smoke: the same code path at a size a CPU trains in milliseconds
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                 vocab_size=512),
}
PROMPT_LENGTH = 32
PAD, EOS = 0, 1


class FixedCompletions:
    """TRL's `rollout_func` with fixed tokens instead of generation.

    Each call draws, from one seeded generator, a prompt of PROMPT_LENGTH tokens and a
    completion per prompt: uniform tokens, lengths uniform in [length // 2, length], the
    shorter ones ending in EOS. Two runs built with the same seed see identical batches.
    """

    def __init__(self, vocab: int, length: int, seed: int = 0, prompt_length: int = PROMPT_LENGTH):
        self.vocab, self.length, self.prompt_length = vocab, length, prompt_length
        self.generator = torch.Generator().manual_seed(seed)

    def _tokens(self, count: int) -> list[int]:
        return torch.randint(EOS + 1, self.vocab, (count,), generator=self.generator).tolist()

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        prompt_ids, completion_ids = [], []
        for _ in prompts:
            prompt_ids.append(self._tokens(self.prompt_length))
            size = int(torch.randint(max(1, self.length // 2), self.length + 1, (),
                                     generator=self.generator))
            completion = self._tokens(size)
            if size < self.length:
                completion[-1] = EOS
            completion_ids.append(completion)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def token_reward(completion_ids: list[list[int]], **_: Any) -> list[float | None]:
    """A reward with spread inside every group, from the tokens alone."""
    return [float(sum(ids) % 97) / 97 for ids in completion_ids]


def tokenizer() -> Any:
    """A tokenizer of the three special tokens: the completions are ids already."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<eos>": EOS, "<unk>": 2}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "<unk>")),
                                   pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def save_model(shape: str, directory: Path, seed: int = 0, **overrides: Any) -> Path:
    """A randomly initialised Qwen2 of `shape` (`overrides` replacing its config fields) and
    its tokenizer, saved to `directory` (TRL loads the reference model from the policy's
    path)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    fields = {**SHAPES[shape], **overrides}
    config = Qwen2Config(vocab_size=fields.pop("vocab_size", VOCAB), pad_token_id=PAD,
                         eos_token_id=EOS, bos_token_id=None, max_position_embeddings=32768,
                         **fields)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tokenizer().save_pretrained(directory)
    return directory


def trainer(model_dir: Path, output_dir: Path, length: int, batch: int, device: torch.device,
            seed: int = 0, **options: Any) -> Any:
    """TRL's GRPOTrainer on the saved model, with `FixedCompletions` for generation.

    Defaults: bf16 autocast (float32 parameters), gradient checkpointing, beta 0.04, one
    micro-batch of `batch` completions (an even number: groups of `batch // 2`, at least
    2); `options` override any GRPOConfig field.
    """
    from datasets import Dataset
    from transformers import AutoConfig
    from trl import GRPOConfig, GRPOTrainer

    group = max(2, batch // 2)
    settings: dict[str, Any] = dict(
        output_dir=str(output_dir), per_device_train_batch_size=batch, num_generations=group,
        max_completion_length=length, beta=0.04, bf16=True, gradient_checkpointing=True,
        use_cpu=device.type == "cpu", report_to=[], save_strategy="no", disable_tqdm=True,
        logging_steps=1, seed=seed)
    settings.update(options)
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    grpo = GRPOTrainer(
        model=str(model_dir), reward_funcs=token_reward, args=GRPOConfig(**settings),
        train_dataset=Dataset.from_dict({"prompt": ["-"] * max(batch, group)}),
        rollout_func=FixedCompletions(vocab, length, seed))
    # what Trainer.train sets before the first step, which the loss reads
    grpo.current_gradient_accumulation_steps = grpo.args.gradient_accumulation_steps
    return grpo


def scored_batch(grpo: Any, seed: int) -> dict[str, Any]:
    """One micro-batch as GRPOTrainer hands it to its loss: fixed completions, rewards,
    advantages, old and reference log-probs."""
    grpo.rollout_func.generator.manual_seed(seed)
    examples = [{"prompt": "-"} for _ in range(grpo.args.per_device_train_batch_size)]
    grpo.model.train()
    return grpo._generate_and_score_completions(examples)


def train_step(grpo: Any, batch: dict[str, Any]) -> torch.Tensor:
    """TRL's loss and its backward on one micro-batch, as Trainer.training_step runs them
    (no optimizer step); the gradients are freed after."""
    model = grpo.model_wrapped
    model.train()
    with grpo.compute_loss_context_manager():
        loss = grpo.compute_loss(model, batch)
    grpo.accelerator.backward(loss)
    grpo.model.zero_grad(set_to_none=True)
    return loss.detach()


def _sequences(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The micro-batch's prompt and completion ids, and their attention mask."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    return ids, mask


def _scored_models(grpo: Any) -> list[Any]:
    return [model for model in (grpo.model, grpo.ref_model) if model is not None]


@torch.no_grad()
def score(grpo: Any, batch: dict[str, Any]) -> torch.Tensor:
    """The old and reference log-probs of the micro-batch, as TRL scores them."""
    ids, mask = _sequences(batch)
    length = batch["completion_ids"].size(1)
    scores = [grpo._get_per_token_logps_and_entropies(model, ids, mask, length)[0]
              for model in _scored_models(grpo)]
    return torch.stack(scores)


def backbone(grpo: Any, batch: dict[str, Any], backward: bool) -> torch.Tensor:
    """The models without their LM head and loss (the floor under both runs: a step or
    scoring minus this is the head's and loss's share). Train step: the policy's decoder
    forward, under the autocast accelerate wraps the whole model's forward in, and its
    backward from a unit gradient; scoring: both models' decoders, no grad."""
    ids, mask = _sequences(batch)
    models = [grpo.model] if backward else _scored_models(grpo)
    if backward:
        grpo.model.train()
    found = []
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=grpo.args.bf16), \
            torch.set_grad_enabled(backward):
        for model in models:
            hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
            found.append(hidden.float().sum())
    if backward:
        found[0].backward()
        grpo.model.zero_grad(set_to_none=True)
    return torch.stack(found).detach()


# ---------------------------------------------------------------------------
# the workload


@dataclass(frozen=True)
class Shape:
    model: str
    length: int
    batch: int

    @property
    def case(self) -> Case:
        return Case(f"{self.model} T={self.length} B={self.batch}",
                    {"T": self.length, "B": self.batch, "tokens": self.length * self.batch},
                    dtype=torch.bfloat16)


# The full run, sized to fit about 6 minutes of an H200 with one rlk backend beside TRL:
# 16 completions at 512 and 1024 tokens (the 0.5B/1024 point), fewer at 4096 and
# 16384 (a group needs 2; the largest micro-batch at 16384 is `largest_micro_batch`'s).
FULL = (Shape("qwen2.5-0.5b", 512, 16), Shape("qwen2.5-0.5b", 1024, 16),
        Shape("qwen2.5-0.5b", 4096, 4), Shape("qwen2.5-0.5b", 16384, 2),
        Shape("qwen2.5-1.5b", 512, 16), Shape("qwen2.5-1.5b", 4096, 2),
        Shape("qwen2.5-7b-8l", 512, 8), Shape("qwen2.5-7b-8l", 4096, 2))
SMOKE = (Shape("tiny", 16, 4),)


class _Models:
    """The trainer of the current case (one at a time: the 1.5B and 7B shapes' models take
    GBs of device memory) and every shape's saved model (the runner visits each case once
    per mode; the three full shapes take about 20 GB of disk in float32)."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._trainer: Any = None
        self._work = tempfile.TemporaryDirectory(prefix="rlk-trl-grpo-")

    def trainer(self, shape: Shape, device: torch.device) -> Any:
        key = (shape, str(device))
        if key != self._key:
            self._trainer = None
            root = Path(self._work.name)
            model_dir = root / shape.model
            if not model_dir.exists():
                save_model(shape.model, model_dir)
            self._trainer = trainer(model_dir, root / "out", shape.length, shape.batch, device)
            self._key = key
        return self._trainer


_MODELS: _Models | None = None


def _shape(case: Case) -> Shape:
    model = case.label.split(" ")[0]
    return Shape(model, int(case.dims["T"]), int(case.dims["B"]))


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, seed: int,
                backward: bool) -> Inputs:
    global _MODELS
    try:
        import trl  # noqa: F401
    except ImportError:
        raise Blocked("TRL is not installed (pip install trl==1.16.0)") from None
    if _MODELS is None:
        _MODELS = _Models()
    grpo = _MODELS.trainer(_shape(case), device)
    # the head's weight stands for the models: one buffer, never a rotation of models
    return {"trainer": grpo, "batch": scored_batch(grpo, seed),
            "lm_head_weight": grpo.model.get_output_embeddings().weight}


def _backbone_call(backward: bool) -> Call:
    def call(inputs: Inputs) -> Outputs:
        return {"value": backbone(inputs["trainer"], inputs["batch"], backward)}
    return call


def _call(patched: bool, backward: bool) -> Call:
    """A row's call, TRL patched or as is. The row's first call (a warm-up) makes or undoes
    the patch and the others find it made, as a trainer patches once: patching inside every
    timed call measured the patch itself (1-2 ms of host time a call, 13-37 ms before its
    module scan was kept), which rows that synchronise each call show whole."""
    def call(inputs: Inputs) -> Outputs:
        from rlk.integrations import trl as rlk_trl

        if patched:
            rlk_trl.patch()
        else:
            rlk_trl.unpatch()
        run = train_step if backward else score
        return {"value": run(inputs["trainer"], inputs["batch"])}
    return call


def _parameters(model: str) -> float:
    fields = SHAPES[model]
    width, layers = fields["hidden_size"], fields["num_hidden_layers"]
    heads, kv = fields["num_attention_heads"], fields["num_key_value_heads"]
    attention = width * width * 2 + 2 * width * (width // heads) * kv
    mlp = 3 * width * fields["intermediate_size"]
    return layers * (attention + mlp) + fields.get("vocab_size", VOCAB) * width


def cost(case: Case, dtype: torch.dtype, backward: bool) -> Cost:
    """Matrix FLOPs of the linear layers: the train step's forward, its recomputation
    (gradient checkpointing) and backward, 8 P per token; scoring, two models, 4 P."""
    tokens = case.dims["tokens"] + case.dims["B"] * PROMPT_LENGTH
    per_token = 8.0 if backward else 4.0
    return Cost(0.0, per_token * _parameters(_shape(case).model) * tokens)


WORKLOAD = Workload(
    name="trl-grpo",
    op="linear_logp",
    modes=(FORWARD, FORWARD_BACKWARD),
    cases=tuple(shape.case for shape in FULL),
    smoke_cases=tuple(shape.case for shape in SMOKE),
    inputs=make_inputs,
    rlk_call=functools.partial(_call, True),
    reference=lambda inputs, backward: None,
    compare=lambda expected, outputs, inputs: list[Error](),
    cost=cost,
    peers={"trl": Peer("trl", lambda case, backward, device: _call(False, backward),
                       note="TRL 1.16 as is"),
           "backbone": Peer("backbone", lambda case, backward, device: _backbone_call(backward),
                            note="the models without LM head and loss", floor=True)},
    doc="TRL's GRPOTrainer step and scoring, as is and patched",
)
WORKLOADS = (WORKLOAD,)


# ---------------------------------------------------------------------------
# the largest micro-batch


def _fits(shape: Shape, device: torch.device, patched: bool, work: Path) -> bool:
    try:
        grpo = trainer(work / shape.model, work / "out", shape.length, shape.batch, device)
        _call(patched, True)({"trainer": grpo, "batch": scored_batch(grpo, 0)})
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        grpo = None
        if device.type == "cuda":
            torch.cuda.empty_cache()


def largest_micro_batch(model: str, length: int, device: torch.device, patched: bool,
                        limit: int = 64) -> int:
    """The largest B (a power of two from 2 up to `limit`) whose train step fits at length
    T; 0 when not even 2 does."""
    with tempfile.TemporaryDirectory(prefix="rlk-trl-grpo-") as workdir:
        work = Path(workdir)
        save_model(model, work / model)
        best, batch = 0, 2
        while batch <= limit and _fits(Shape(model, length, batch), device, patched, work):
            best, batch = batch, batch * 2
        return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the largest GRPO micro-batch, as is and "
                                                 "patched")
    parser.add_argument("--largest-micro-batch", action="store_true", required=True)
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    found: dict[str, Any] = {"model": args.model, "T": args.length, "limit": args.limit}
    for name, patched in (("trl", False), ("rlk", True)):
        found[name] = largest_micro_batch(args.model, args.length, device, patched, args.limit)
    print(json.dumps(found))
    return 0

if __name__ == "__main__":
    sys.exit(main())
