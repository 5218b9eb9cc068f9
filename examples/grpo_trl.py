"""TRL's GRPOTrainer with rlk: the project's addition task, every log-prob and loss from rlk.

A tiny Qwen2, randomly initialised from a config (nothing downloaded), learns
single-digit addition ("7+5=" -> "12.", "." ends the answer) from a partial-credit
reward, trained by TRL's own GRPOTrainer with `rlk.integrations.trl.patched()`
routing the fused LM head's log-probs and entropies and the GRPO loss to rlk.

    pip install "trl==1.16.0" "transformers==5.24.0"
    python examples/grpo_trl.py              # CPU by default
    python examples/grpo_trl.py --check      # exit 1 unless greedy accuracy improved
    python examples/grpo_trl.py --unpatched  # TRL's own code, for comparison

Walk-through and the option table: docs/integrations/trl.md.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlk.integrations import trl as rlk_trl

SYMBOLS = "0123456789+=."
SPECIAL = ("<pad>", "<eos>", "<unk>")
END = "."


def tiny_tokenizer() -> Any:
    """A character-level fast tokenizer: one token per symbol, pad 0, eos 1."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate((*SPECIAL, *SYMBOLS))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>",
                                   eos_token="<eos>", unk_token="<unk>")


def save_tiny_qwen2(directory: Path, *, seed: int = 0, width: int = 32, layers: int = 2) -> Path:
    """Write a randomly initialised Qwen2 and its tokenizer to `directory`; return it.

    GRPOTrainer loads the reference model from the policy's path, hence a directory.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def problems() -> list[tuple[str, str]]:
    """Every one-digit problem and its answer: ("7+5=", "12."), ("3+4=", "07.")."""
    return [(f"{a}+{b}=", f"{a + b:02d}{END}") for a in range(10) for b in range(10)]


def partial_credit(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """The share of answer positions right, up to the completion's first END."""
    rewards = []
    for text, target in zip(completions, answer, strict=True):
        text = text[:text.index(END) + 1] if END in text else text
        rewards.append(sum(a == b for a, b in zip(text, target, strict=False)) / len(target))
    return rewards


@torch.no_grad()
def greedy_accuracy(model: Any, tokenizer: Any) -> float:
    """Exact answers at temperature 0 over all 100 problems."""
    prompts, answers = zip(*problems(), strict=True)
    batch = tokenizer(list(prompts), return_tensors="pt").to(model.device)
    out = model.generate(**batch, max_new_tokens=len(answers[0]), do_sample=False,
                         pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(text.startswith(answer) for text, answer in zip(texts, answers, strict=True)) / 100


def train(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    random.seed(args.seed)
    rows = [problem for problem in problems() for _ in range(args.repeats)]
    random.shuffle(rows)
    dataset = Dataset.from_dict({"prompt": [p for p, _ in rows], "answer": [a for _, a in rows]})
    config = GRPOConfig(
        output_dir=str(workdir / "out"), max_steps=args.steps, learning_rate=args.lr,
        lr_scheduler_type="constant",
        per_device_train_batch_size=args.prompts * args.group_size,
        num_generations=args.group_size, max_completion_length=3, temperature=1.0,
        loss_type=args.loss_type, beta=args.beta,
        epsilon=0.2, epsilon_high=0.28, logging_steps=args.log_every, report_to=[],
        use_cpu=args.device == "cpu", bf16=False, seed=args.seed, save_strategy="no",
        disable_tqdm=True)
    trainer = GRPOTrainer(model=str(save_tiny_qwen2(workdir / "model", seed=args.seed,
                                                    width=args.width)),
                          reward_funcs=partial_credit, args=config, train_dataset=dataset)
    before = greedy_accuracy(trainer.model, trainer.processing_class)
    with contextlib.nullcontext() if args.unpatched else rlk_trl.patched():
        trainer.train()
    after = greedy_accuracy(trainer.model, trainer.processing_class)
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return {"accuracy_before": before, "accuracy_after": after,
            "reward_first": rewards[0], "reward_last": rewards[-1]}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "auto"), default="cpu",
                   help="cpu, or auto to let TRL pick an accelerator")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=400, help="GRPO steps")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group-size", type=int, default=16, help="completions per prompt")
    p.add_argument("--repeats", type=int, default=20, help="times each problem is in the data")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (constant)")
    p.add_argument("--width", type=int, default=64, help="model hidden size")
    p.add_argument("--loss-type", default="dapo", help="GRPOConfig.loss_type")
    p.add_argument("--beta", type=float, default=0.0, help="GRPOConfig.beta (KL coefficient)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--unpatched", action="store_true",
                   help="train with TRL's own log-probs and loss (for comparison)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless the mean reward and greedy accuracy went up")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory() as workdir:
        summary = train(args, Path(workdir))
    print(f"mean reward      {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}")
    print(f"greedy accuracy  {summary['accuracy_before']:.3f} -> "
          f"{summary['accuracy_after']:.3f} (exact answers over all 100 problems)")
    learned = (summary["reward_last"] > summary["reward_first"] + 0.2
               and summary["accuracy_after"] > summary["accuracy_before"])
    if args.check and not learned:
        print("--check: the policy did not learn", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
