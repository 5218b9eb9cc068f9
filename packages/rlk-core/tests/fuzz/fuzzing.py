"""What the fuzz modules share: the run's mode, its example count and device, the tally of
examples per op, and the helpers and strategies more than one op family uses.

Two modes (docs/testing.md):
- replay (RLK_FUZZ_SEED unset): derandomized, the same examples every run, as CI's test
  command runs them;
- random: RLK_FUZZ_SEED=random draws a fresh seed, RLK_FUZZ_SEED=<int> replays that one; the
  run prints the seed in its summary, so a failure can be reproduced.
RLK_FUZZ_EXAMPLES sets the examples per test (100), RLK_FUZZ_DEVICE where the op's inputs
live (cpu); references always run in float64 on the CPU.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import hypothesis
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlk.testing.compare import assert_bitwise_equal


def _seed() -> int | None:
    raw = os.environ.get("RLK_FUZZ_SEED", "").strip()
    if not raw:
        return None
    return secrets.randbelow(2**32) if raw == "random" else int(raw)


SEED = _seed()
EXAMPLES = int(os.environ.get("RLK_FUZZ_EXAMPLES", "100"))
DEVICE = torch.device(os.environ.get("RLK_FUZZ_DEVICE", "cpu"))
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
COUNTS: collections.Counter[str] = collections.Counter()
INTERRUPTED = False  # a SIGINT arrived (see stop_at_the_next_example_on_interrupt)

# The replay does not shrink: a sub-case marked xfail would spend its time there, and CI
# reports the failing example as drawn. A random pass shrinks, to report a minimal one.
_PHASES = tuple(p for p in hypothesis.Phase if SEED is not None or p != hypothesis.Phase.shrink)
_SETTINGS = settings(max_examples=EXAMPLES, derandomize=SEED is None, deadline=None,
                     database=None, print_blob=True, phases=_PHASES,
                     suppress_health_check=list(hypothesis.HealthCheck))


def fuzz(**strategies: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """`@given(**strategies)` under this run's settings, seeded with SEED in random mode."""

    def wrap(test: Callable[..., None]) -> Callable[..., None]:
        run = _SETTINGS(given(**strategies)(test))
        return run if SEED is None else hypothesis.seed(SEED)(run)

    return wrap


def tally(op: str) -> None:
    """Count one example of `op` (the run's summary prints the counts); an interrupted run
    stops here if its KeyboardInterrupt was dropped."""
    if INTERRUPTED:
        raise KeyboardInterrupt("SIGINT received earlier, where Python dropped its exception")
    COUNTS[op] += 1


def _interrupt(signum: int, frame: Any) -> None:
    global INTERRUPTED
    INTERRUPTED = True
    signal.default_int_handler(signum, frame)


def stop_at_the_next_example_on_interrupt() -> None:
    """Make a SIGINT stop the run even where its KeyboardInterrupt is dropped.

    Python prints and drops an exception raised in a gc callback, and Hypothesis times the
    collector with one, so a long run's interrupt (tools/gpu/fuzz_long.sh) that lands there
    was lost and the process ran on until killed, its counts unreported. The handler also
    sets INTERRUPTED, and the next example's tally raises again."""
    on_main_thread = threading.current_thread() is threading.main_thread()  # signal's rule
    if on_main_thread and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)


def on_device(value: Any) -> Any:
    """`value` moved to the fuzzed device when it is a tensor."""
    return value.to(DEVICE) if isinstance(value, torch.Tensor) else value


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Set (or, for None, leave alone) environment variables for the body only."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is not None:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def generator(draw: Any) -> torch.Generator:
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))


def snapshot(**values: Any) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in values.items()
            if isinstance(value, torch.Tensor)}


def unchanged(before: dict[str, torch.Tensor], **after: Any) -> None:
    for name, value in before.items():
        assert_bitwise_equal(f"input {name} after the call", after[name].cpu(), value.cpu())


def grads(outputs: tuple[torch.Tensor, ...], inputs: list[torch.Tensor],
          seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Random upstream gradients for `outputs` and the gradients they give `inputs`."""
    gen = torch.Generator().manual_seed(seed)
    upstream = [torch.randn(out.shape, generator=gen) for out in outputs]
    total = sum((out.double() * g.to(out.device)).sum()
                for out, g in zip(outputs, upstream, strict=True))
    return upstream, [g.cpu() for g in torch.autograd.grad(total, inputs)]


def temperature(draw: Any, gen: torch.Generator,
                lead: tuple[int, ...]) -> float | torch.Tensor:
    """A float, a 0-d tensor or one value per row, from 0.2 to 2.5."""
    kind = draw(st.sampled_from(["float", "tensor", "0-d"]))
    if kind == "float":
        return float(draw(st.sampled_from([1.0, 0.7, 0.25, 2.5])))
    if kind == "0-d":
        return torch.tensor(draw(st.sampled_from([0.6, 1.3])))
    rows = int(torch.tensor(lead).prod()) if lead else 1
    return (torch.rand(rows, generator=gen) * 2 + 0.2).reshape(lead)


def per_row(value: float | torch.Tensor, lead: tuple[int, ...]) -> float | torch.Tensor:
    """A temperature as the references take it: a float, or one value per flattened row."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.dim() == 0:
        return float(value)
    return value.reshape(-1)


def autocast(dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """torch.autocast on the fuzzed device in `dtype`, or nothing for None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(DEVICE.type, dtype=dtype)


# ---------------------------------------------------------------------------
# the LM head and the policy loss: drawn by the linear and the policy-loss modules


@st.composite
def heads(draw: Any, rows: tuple[int, ...] = (0, 1, 3, 8),
          softcaps: tuple[float | None, ...] = (None, 30.0, 2.0),
          dtypes: tuple[torch.dtype, ...] = FLOATS) -> tuple[Any, ...]:
    """(hidden [N, H], weight [V, H], bias or None, tokens [N], temperature, head options)."""
    gen = generator(draw)
    dtype = draw(st.sampled_from(dtypes))
    count = draw(st.sampled_from(rows))
    width = draw(st.sampled_from([1, 4, 16]))
    vocab = draw(st.sampled_from([1, 7, 64, 300]))
    scale = draw(st.sampled_from([0.1, 1.0, 3.0]))
    hidden = torch.randn(count, width, generator=gen)
    weight = torch.randn(vocab, width, generator=gen) * scale / width**0.5
    bias = torch.randn(vocab, generator=gen) if draw(st.booleans()) else None
    tokens = torch.randint(0, vocab, (count,), generator=gen)
    if count and draw(st.booleans()):
        tokens[draw(st.integers(0, count - 1))] = -100
    head = {"softcap": draw(st.sampled_from(softcaps)),
            "logit_scale": draw(st.sampled_from([1.0, 0.5]))}
    cast = [None if t is None else t.to(dtype) for t in (hidden, weight, bias)]
    return (*cast, tokens, temperature(draw, gen, (count,)), head)


@st.composite
def loss_options(draw: Any, objectives: tuple[str, ...] = ("ppo", "cispo", "vespo"),
                 bias_corrected: bool = False) -> Any:
    """PolicyLossOptions over every objective, ratio level, KL estimator, aggregation and
    normaliser; kl_bias_correction on every draw with `bias_corrected` (its own regime),
    off otherwise."""
    from rlk.ops.policy_loss.options import PolicyLossOptions

    objective = draw(st.sampled_from(objectives))
    chosen: dict[str, Any] = {
        "objective": objective,
        "clip_low": draw(st.sampled_from([0.1, 0.2, 0.9])),
        "clip_high": draw(st.sampled_from([0.2, 0.28, 3.0])),
        "agg": draw(st.sampled_from(["token-mean", "token-sum", "seq-mean-token-mean",
                                     "seq-mean-token-sum", "seq-mean-token-sum-norm"])),
        "ratio_level": "token" if objective == "vespo" else draw(
            st.sampled_from(["token", "sequence", "sequence-token"])),
        "kl_coef": draw(st.sampled_from([0.0, 0.04, 1.0])),
        "kl_estimator": draw(st.sampled_from(["k1", "k2", "k3", "abs", "k1+", "k3+", "abs+"])),
        "kl_clamp": draw(st.sampled_from([None, 10.0, 0.05])),
        "kl_bias_correction": bias_corrected,
        "scale": draw(st.sampled_from([1.0, 0.25])),
    }
    if objective == "ppo":
        chosen["dual_clip"] = draw(st.sampled_from([None, 1.5, 3.0]))
        chosen["ratio_cap"] = draw(st.sampled_from([None, 1.5]))
    if objective == "sapo":
        chosen["sapo_temperature_pos"] = draw(st.sampled_from([1.0, 0.5, 4.0]))
        chosen["sapo_temperature_neg"] = draw(st.sampled_from([1.05, 0.3, 2.0]))
    if objective == "vespo":
        chosen["vespo_k_pos"] = draw(st.sampled_from([2.0, 0.0, 5.0]))
        chosen["vespo_lambda_pos"] = draw(st.sampled_from([3.0, 0.5]))
        chosen["vespo_k_neg"] = draw(st.sampled_from([3.0, 1.0]))
        chosen["vespo_lambda_neg"] = draw(st.sampled_from([2.0, 8.0]))
    if objective != "vespo" and draw(st.booleans()):
        chosen["log_ratio_min"], chosen["log_ratio_max"] = -20.0, 20.0
    if draw(st.booleans()):
        chosen["tis_cap"] = draw(st.sampled_from([0.5, 2.0]))
    if draw(st.booleans()):
        chosen["divisor"] = draw(st.sampled_from([7.0, 512.0]))
    if chosen["agg"].startswith("seq-mean") and draw(st.booleans()):
        chosen["count_empty_rows"] = True
    return PolicyLossOptions(**chosen)


def needs_ref(options: Any) -> bool:
    return bool(options.kl_coef) or options.kl_clamp is not None or options.kl_bias_correction


@st.composite
def loss_inputs(draw: Any, options: Any, batch: int, length: int,
                spreads: tuple[float, ...] = (0.01, 0.3, 1.5, 6.0)
                ) -> tuple[torch.Tensor, dict[str, Any]]:
    """logp and the tensors of a policy-loss call for `options` (ref_logp when its KL needs
    one), with log ratios of standard deviation `spreads`: from near 0 to the extremes
    where cancellation shows."""
    gen = generator(draw)
    spread = draw(st.sampled_from(spreads))
    logp = -torch.rand(batch, length, generator=gen) * 4
    old = logp + torch.randn(batch, length, generator=gen) * spread
    mask = torch.rand(batch, length, generator=gen) > draw(st.sampled_from([0.0, 0.3, 0.9]))
    shape = draw(st.sampled_from([(batch,), (batch, 1), (batch, length)]))
    tensors: dict[str, Any] = {"old_logp": old, "advantages": torch.randn(shape, generator=gen),
                               "mask": mask.to(draw(st.sampled_from([torch.bool, torch.int64,
                                                                     torch.float32])))}
    if needs_ref(options) or draw(st.booleans()):
        tensors["ref_logp"] = logp + torch.randn(batch, length, generator=gen) * spread
    if options.tis_cap is not None or draw(st.booleans()):  # tis_cap needs it
        tensors["rollout_logp"] = old + torch.randn(batch, length, generator=gen) * spread
    if draw(st.booleans()):
        tensors["importance_weights"] = torch.rand(batch, length, generator=gen) * 2
    return logp, tensors


def in_range(truth: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The float64 truth as a result in `dtype` can hold it: beyond the dtype's largest
    finite value, rounding gives ±inf (a float16 gradient of 7e4 is inf, as torch's own)."""
    beyond = truth.abs() > torch.finfo(dtype).max
    return truth.masked_fill(beyond, float("inf")).copysign(truth) if bool(beyond.any()) \
        else truth
