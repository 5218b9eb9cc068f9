"""The eager path of logp, logp_entropy, entropy and sample: taken outside tracing, the torch
operators under it, and the same bits either way (native backend)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rlk
from rlk.backend import drawn_logp
from rlk.dispatch import captured_policy
from rlk.ops.logp.op import LOGP
from rlk.ops.sample.op import SAMPLE

GEN = torch.Generator().manual_seed(11)


class _PassThrough(TorchDispatchMode):
    """A dispatch mode that changes nothing: under it an op must take its torch operator."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _node(tensor: torch.Tensor) -> str:
    """The autograd node under the views and casts the public function adds."""
    node = tensor.grad_fn
    while node is not None and type(node).__name__ in ("ViewBackward0", "ToCopyBackward0"):
        node = node.next_functions[0][0]
    return type(node).__name__


def _case(name: str):
    """(public function, logits, kwargs) for one argument form."""
    logits = torch.randn(3, 5, 37, generator=GEN) * 3
    tokens = torch.randint(0, 37, (3, 5), generator=GEN)
    if name == "plain":
        return rlk.logp, logits, {"tokens": tokens}
    if name == "temperature-ignore-dtype":
        tokens[1, 2] = 7
        return rlk.logp, logits.bfloat16(), {"tokens": tokens.int(), "temperature": 0.7,
                                             "ignore_index": 7, "dtype": torch.bfloat16}
    if name == "per-row-temperature-strided":
        wide = torch.randn(3, 5, 74, generator=GEN, dtype=torch.float16)
        return rlk.logp, wide[..., ::2], {"tokens": tokens,
                                           "temperature": torch.rand(3, 5, generator=GEN) + 0.5}
    if name == "0-d-temperature-mask":
        return rlk.logp, logits, {"tokens": tokens, "temperature": torch.tensor(1.3),
                                  "mask": torch.rand(3, 5, generator=GEN) > 0.3}
    if name == "rows":
        return rlk.logp, logits.double(), {"tokens": tokens, "rows": torch.tensor([14, 0, 3, 3])}
    if name == "tokens-per-row":
        return rlk.logp, logits, {"tokens": torch.randint(0, 37, (3, 5, 4), generator=GEN)}
    if name == "logp_entropy":
        return rlk.logp_entropy, logits, {"tokens": tokens, "temperature": 0.9}
    if name == "entropy":
        return rlk.entropy, logits, {"mask": torch.rand(3, 5, generator=GEN) > 0.3}
    assert name == "entropy-rows"
    return rlk.entropy, logits.bfloat16(), {"rows": torch.tensor([2, 9]), "temperature": 1.5}


CASES = ["plain", "temperature-ignore-dtype", "per-row-temperature-strided",
         "0-d-temperature-mask", "rows", "tokens-per-row", "logp_entropy", "entropy",
         "entropy-rows"]


def _run(function, logits: torch.Tensor, kwargs: dict) -> tuple[tuple, torch.Tensor]:
    """Outputs and d(sum of outputs with fixed weights) / d logits."""
    leaf = logits.clone().requires_grad_(True)
    tokens = kwargs.get("tokens")
    outputs = function(leaf, tokens, **{k: v for k, v in kwargs.items() if k != "tokens"}) \
        if tokens is not None else function(leaf, **kwargs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)).to(o.dtype)
               for i, o in enumerate(outputs)]
    (grad,) = torch.autograd.grad(outputs, leaf, weights)
    return outputs, grad


@pytest.mark.parametrize("name", CASES)
def test_eager_path_matches_the_torch_operator_bit_for_bit(name):
    """Forward and backward through the eager path equal the torch operator's (taken under a
    dispatch mode) exactly, in every argument form: temperatures, ignore_index, mask,
    strided and lead-shaped logits, rows, K tokens per row, output dtype."""
    function, logits, kwargs = _case(name)
    with rlk.use_backends("native"):
        eager_out, eager_grad = _run(function, logits, kwargs)
        leaf = logits.clone().requires_grad_(True)
        rest = {k: v for k, v in kwargs.items() if k != "tokens"}
        args = (leaf, kwargs["tokens"]) if "tokens" in kwargs else (leaf,)
        assert _node(function(*args, **rest)[0] if function is rlk.logp_entropy
                     else function(*args, **rest)) == "_KernelFunctionBackward"
        with _PassThrough():
            op_out, op_grad = _run(function, logits, kwargs)
            traced = function(*args, **rest)
    traced = traced[0] if isinstance(traced, tuple) else traced
    assert _node(traced).startswith("GeneratedBackward")  # torch.library's autograd node
    for got, want in zip(eager_out, op_out, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert eager_grad.dtype == logits.dtype and torch.equal(eager_grad, op_grad)


def test_an_unused_output_counts_as_a_zero_gradient():
    """logp_entropy with only entropy (or only logp) differentiated: the eager backward gets
    zeros for the other output, as the torch operator's autograd does."""
    logits = torch.randn(6, 19, generator=GEN)
    tokens = torch.randint(0, 19, (6,), generator=GEN)
    for index in (0, 1):
        grads = []
        for mode in (None, _PassThrough()):
            leaf = logits.clone().requires_grad_(True)
            if mode is None:
                output = rlk.logp_entropy(leaf, tokens)[index]
            else:
                with mode:
                    output = rlk.logp_entropy(leaf, tokens)[index]
            grads.append(torch.autograd.grad(output.sum(), leaf)[0])
        assert torch.equal(*grads)


def test_without_grad_no_autograd_node_is_made():
    logits = torch.randn(4, 9, generator=GEN)
    tokens = torch.randint(0, 9, (4,), generator=GEN)
    assert rlk.logp(logits, tokens).grad_fn is None
    with torch.no_grad():
        assert rlk.logp(logits.requires_grad_(True), tokens).grad_fn is None
        assert rlk.entropy(logits).grad_fn is None


def test_a_temperature_tensor_gets_no_gradient():
    """Only logits are differentiated: a temperature tensor that requires grad is read as a
    value, on every path (the torch operators returned no gradient for it either)."""
    logits = torch.randn(4, 9, generator=GEN)
    tokens = torch.randint(0, 9, (4,), generator=GEN)
    temperature = torch.full((4,), 0.8, requires_grad=True)
    assert not rlk.logp(logits, tokens, temperature=temperature).requires_grad
    leaf = logits.clone().requires_grad_(True)
    rlk.logp(leaf, tokens, temperature=temperature).sum().backward()
    assert leaf.grad is not None and temperature.grad is None


@pytest.mark.parametrize("function", ["logp", "logp_entropy", "entropy"])
def test_a_double_backward_is_refused_by_name(function):
    """As through the torch operator (whose backward op has no autograd formula), a second
    backward raises; the eager path names the op, also when the upstream gradient does
    not require grad (the gradient depends on the logits: taking it as constant would be
    silently wrong)."""
    logits = torch.randn(4, 9, generator=GEN, requires_grad=True)
    tokens = torch.randint(0, 9, (4,), generator=GEN)
    outputs = rlk.entropy(logits) if function == "entropy" else getattr(rlk, function)(logits,
                                                                                      tokens)
    output = outputs[0] if isinstance(outputs, tuple) else outputs
    (grad,) = torch.autograd.grad(output.sum(), logits, create_graph=True)
    assert grad.requires_grad
    with pytest.raises(RuntimeError, match=rf"rlk\.{function} has no double backward"):
        grad.pow(2).sum().backward()


def test_in_place_change_of_the_logits_before_backward_raises():
    leaf = torch.randn(4, 9, generator=GEN, requires_grad=True)
    logits = leaf * 1.0
    output = rlk.logp(logits, torch.randint(0, 9, (4,), generator=GEN))
    with torch.no_grad():
        logits.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        output.sum().backward()


def test_out_is_written_on_the_eager_path_and_under_a_dispatch_mode():
    logits = torch.randn(2, 3, 11, generator=GEN)
    tokens = torch.randint(0, 11, (2, 3), generator=GEN)
    want = rlk.logp(logits, tokens)
    for out in (torch.empty(2, 3), torch.empty(2, 3, dtype=torch.float64)):
        for mode in (None, _PassThrough()):
            out.fill_(0.0)
            if mode is None:
                rlk.logp(logits, tokens, out=out)
            else:
                with mode:
                    rlk.logp(logits, tokens, out=out)
            assert torch.equal(out, want.to(out.dtype))
    pair = (torch.empty(2, 3), torch.empty(2, 3))
    rlk.logp_entropy(logits, tokens, out=pair)
    assert torch.equal(pair[0], want) and torch.equal(pair[1], rlk.entropy(logits))
    entropy_out = torch.empty(2, 3)
    rlk.entropy(logits, out=entropy_out)
    assert torch.equal(entropy_out, rlk.entropy(logits))


def test_torch_compile_graph_holds_the_logp_operator():
    """Compiled (fullgraph), rlk.logp is one rlk::logp node and its backward rlk::logp_backward;
    loss and gradient equal the eager path's bit for bit."""
    logits = torch.randn(4, 6, 40, generator=GEN)
    tokens = torch.randint(0, 40, (4, 6), generator=GEN)
    graphs = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    def loss(x):
        return (rlk.logp(x, tokens, temperature=0.8) * 2.0).sum()

    eager_x, compiled_x = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    eager_loss = loss(eager_x)
    eager_loss.backward()
    compiled_loss = torch.compile(loss, backend=backend, fullgraph=True)(compiled_x)
    compiled_loss.backward()
    targets = {str(node.target) for graph in graphs for node in graph.graph.nodes}
    assert "rlk.logp.default" in targets
    assert torch.equal(compiled_loss, eager_loss) and torch.equal(compiled_x.grad, eager_x.grad)


def test_sample_runs_its_kernel_directly_and_its_operator_when_traced():
    from torch.fx.experimental.proxy_tensor import make_fx

    logits = torch.randn(5, 30, generator=GEN)
    seeds = torch.arange(5)
    original = SAMPLE.torch_op

    def refuse(*args):
        raise AssertionError("the eager call reached the torch operator")

    object.__setattr__(SAMPLE, "torch_op", refuse)
    try:
        eager = rlk.sample(logits, seed=seeds, top_k=4)
    finally:
        object.__setattr__(SAMPLE, "torch_op", original)
    with _PassThrough():
        traced = rlk.sample(logits, seed=seeds, top_k=4)
    for got, want in zip(eager, traced, strict=True):
        assert torch.equal(got, want)
    graph = make_fx(lambda x: rlk.sample(x, seed=seeds, top_k=4).tokens)(logits)
    assert "rlk.sample.default" in {str(node.target) for node in graph.graph.nodes}


def test_drawn_logp_is_logp_with_nan_where_nothing_was_drawn():
    logits = torch.randn(6, 25, generator=GEN).bfloat16()
    tokens = torch.tensor([3, -1, 24, 0, -1, 7])
    got = drawn_logp(logits, tokens, 0.7)
    want = rlk.logp(logits, tokens.clamp(min=0), temperature=0.7)
    drawn = tokens >= 0
    assert torch.equal(got[drawn], want[drawn]) and got[~drawn].isnan().all()
    assert torch.equal(drawn_logp(logits, tokens, 0.0)[drawn],
                       rlk.logp(logits, tokens.clamp(min=0))[drawn])
    with pytest.raises(ValueError, match=r"int64 tokens \[B\]"):
        drawn_logp(logits, tokens.int(), 1.0)


def test_drawn_logp_runs_outside_the_callers_strict_scope():
    """Its logp dispatches under the caller's policy made non-strict (and under the caller's
    own policy when that is not strict: no scope is entered then)."""
    logits = torch.randn(3, 8, generator=GEN)
    tokens = torch.tensor([1, 2, 3])
    seen = []
    original = LOGP.call

    def spy(args):
        seen.append(captured_policy())
        return original(args)

    object.__setattr__(LOGP, "call", spy)
    try:
        with rlk.use_backends("native", strict=True) as strict:
            drawn_logp(logits, tokens, 1.0)
        with rlk.use_backends("native") as relaxed:
            drawn_logp(logits, tokens, 1.0)
    finally:
        object.__delattr__(LOGP, "call")
    assert strict.strict and seen[0].order == strict.order and not seen[0].strict
    assert seen[1] is relaxed
