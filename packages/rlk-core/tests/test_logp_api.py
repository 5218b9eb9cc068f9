"""The public logp / logp_entropy functions: semantics, errors, autograd, torch.compile."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import rlk
from rlk.ops.logp import reference

GEN = torch.Generator().manual_seed(7)


def _data(*lead: int, vocab: int = 50, dtype=torch.float32):
    logits = (torch.randn(*lead, vocab, generator=GEN) * 3).to(dtype)
    tokens = torch.randint(0, vocab, lead, generator=GEN)
    return logits, tokens


def _close(actual, expected, atol=2e-5):
    torch.testing.assert_close(actual.double(), expected, atol=atol, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_leading_dimensions_and_dtypes(dtype):
    logits, tokens = _data(3, 4, dtype=dtype)
    tokens[1, 2] = -100
    got_logp, got_entropy = rlk.logp_entropy(logits, tokens.int(), temperature=1.3)
    want_logp, want_entropy = reference.logp_entropy(logits, tokens, temperature=1.3)
    assert got_logp.shape == (3, 4) and got_logp.dtype == torch.float32
    _close(got_logp, want_logp)
    _close(got_entropy, want_entropy)
    assert got_logp[1, 2] == 0 and got_entropy[1, 2] == 0
    _close(rlk.logp(logits, tokens, temperature=1.3), want_logp)


def test_rows_out_and_per_row_temperature():
    logits, tokens = _data(2, 5)
    temperature = torch.rand(2, 5, generator=GEN) + 0.5
    rows = torch.tensor([9, 0, 4])
    out = torch.full((3,), float("nan"))
    result = rlk.logp(logits, tokens, temperature=temperature, rows=rows, out=out)
    assert result is out
    want, _ = reference.logp_entropy(logits, tokens, temperature=temperature)
    _close(out, want.reshape(-1)[rows])
    pair = (torch.empty(2, 5), torch.empty(2, 5))
    got_logp, got_entropy = rlk.logp_entropy(logits, tokens, out=pair)
    want_logp, want_entropy = reference.logp_entropy(logits, tokens)
    _close(got_logp, want_logp)
    _close(got_entropy, want_entropy)


def test_out_of_range_gives_nan_and_check_inputs_names_the_position(fresh_rlk):
    logits, tokens = _data(2, 3, vocab=10)
    tokens[1, 2] = 10
    result = rlk.logp(logits, tokens)
    assert torch.isnan(result[1, 2]) and not torch.isnan(result[0]).any()
    rlk.check_inputs(True)
    with pytest.raises(ValueError, match=r"tokens\[\(1, 2\)\] = 10 is outside \[0, 10\)"):
        rlk.logp(logits, tokens)
    rlk.check_inputs(False)
    assert torch.isnan(rlk.logp(logits, tokens)[1, 2])
    from rlk import config

    config.reset_check_inputs()
    fresh_rlk.setenv("RLK_CHECK_INPUTS", "1")
    assert rlk.check_inputs()
    with pytest.raises(ValueError, match="outside"):
        rlk.logp(logits, tokens, rows=torch.tensor([5]))
    with pytest.raises(ValueError, match=r"rows\[0\] = 7 is outside \[0, 6\)"):
        rlk.logp(logits, torch.zeros_like(tokens), rows=torch.tensor([7]))


def test_nan_and_neg_inf_rows_stay_in_their_row():
    logits, tokens = _data(4)
    logits[1, 3] = float("nan")
    logits[2] = float("-inf")
    logp, entropy = rlk.logp_entropy(logits, tokens)
    assert torch.isnan(logp[1]) and torch.isnan(logp[2]) and torch.isnan(entropy[2])
    assert torch.isfinite(logp[[0, 3]]).all() and torch.isfinite(entropy[[0, 3]]).all()


def test_empty_and_non_contiguous_inputs():
    logits, tokens = _data(0, 7)
    assert rlk.logp(logits, tokens).shape == (0, 7)
    wide, tokens = _data(6, vocab=80)
    strided = wide[:, ::2]
    _close(rlk.logp(strided, tokens.clamp(max=39)),
           reference.logp_entropy(strided, tokens.clamp(max=39))[0])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"logits": torch.zeros(2, 3, dtype=torch.int64)}, TypeError, "logits must have dtype"),
        ({"tokens": torch.zeros(2, dtype=torch.float32)}, TypeError, "tokens must have dtype"),
        ({"tokens": torch.zeros(3, dtype=torch.int64)}, ValueError, r"shape \(2,\).*got \(3,\)"),
        ({"tokens": torch.zeros(2, 3, 1, dtype=torch.int64)}, ValueError,
         r"\(2,\) \(the leading dimensions of logits\) or \(2, 'K'\)"),
        ({"logits": torch.zeros(2, 0)}, ValueError, "V >= 1 columns when it has rows"),
        ({"temperature": 0.0}, ValueError, "temperature must be finite and > 0"),
        ({"temperature": 1e-40}, ValueError, r"at least 1\.17549\d*e-38 \(the smallest normal"),
        ({"temperature": float("inf")}, ValueError, "temperature must be finite"),
        ({"temperature": torch.ones(3)}, ValueError, "one per row"),
        ({"temperature": torch.ones(2, dtype=torch.int64)}, TypeError,
         "temperature must have dtype"),
        ({"temperature": "hot"}, TypeError, "temperature must be a float"),
        ({"ignore_index": 1.5}, TypeError, "ignore_index must be an int"),
        ({"ignore_index": 2**63}, ValueError, r"ignore_index must fit in int64.*got 9223"),
        ({"mask": torch.ones(3, dtype=torch.bool)}, ValueError,
         r"mask must have shape \(2,\) \(the shape of tokens\)"),
        ({"mask": torch.ones(2, dtype=torch.complex64)}, TypeError, "mask must have dtype"),
        ({"dtype": torch.int64}, TypeError, "dtype must be one of"),
        ({"dtype": torch.float16, "out": torch.zeros(2)}, TypeError,
         "out has dtype torch.float32 but dtype=torch.float16"),
        ({"rows": torch.zeros(1, 1, dtype=torch.int64)}, ValueError, "1-D int64"),
        ({"rows": torch.zeros(1, dtype=torch.int32)}, TypeError, "rows must have dtype int64"),
        ({"out": torch.zeros(3)}, ValueError, r"out must have shape \(2,\)"),
        ({"out": torch.zeros(2, dtype=torch.int64)}, TypeError, "out must have dtype"),
        ({"tokens": torch.zeros(2, dtype=torch.int64, device="meta")}, ValueError, "one device"),
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs, error, match):
    call = {"logits": torch.randn(2, 3), "tokens": torch.zeros(2, dtype=torch.int64)}
    call.update(kwargs)
    logits, tokens = call.pop("logits"), call.pop("tokens")
    with pytest.raises(error, match=match):
        rlk.logp(logits, tokens, **call)


def test_out_refuses_autograd():
    logits = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not support autograd"):
        rlk.logp(logits, torch.zeros(2, dtype=torch.int64), out=torch.empty(2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_matches_reference(dtype):
    logits, tokens = _data(3, 4, dtype=dtype)
    tokens[0, 1] = -100
    temperature = torch.rand(3, 4, generator=GEN) + 0.5
    leaf = logits.clone().requires_grad_(True)
    logp, entropy = rlk.logp_entropy(leaf, tokens, temperature=temperature)
    g_logp, g_entropy = torch.randn(3, 4, generator=GEN), torch.randn(3, 4, generator=GEN)
    (logp * g_logp + entropy * g_entropy).sum().backward()
    want = reference.logp_entropy_grad(logits, tokens, g_logp, g_entropy,
                                       temperature=temperature)
    assert leaf.grad is not None and leaf.grad.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(leaf.grad.double(), want, atol=1e-6, rtol=tol)
    assert (leaf.grad[0, 1] == 0).all()


def test_rows_backward_touches_only_selected_rows():
    logits, tokens = _data(6)
    leaf = logits.clone().requires_grad_(True)
    rows = torch.tensor([4, 1])
    rlk.logp(leaf, tokens, rows=rows).sum().backward()
    assert leaf.grad is not None
    untouched = [0, 2, 3, 5]
    assert (leaf.grad[untouched] == 0).all()
    upstream = torch.zeros(6)
    upstream[rows] = 1.0
    want = reference.logp_entropy_grad(logits, tokens, upstream, None)
    torch.testing.assert_close(leaf.grad.double(), want, atol=1e-6, rtol=1e-5)


def test_chunking_does_not_change_results(fresh_rlk):
    logits, tokens = _data(64, vocab=4096)
    whole = rlk.logp_entropy(logits, tokens)
    fresh_rlk.setenv("RLK_NATIVE_CHUNK_MB", "0.1")  # ~2 rows per chunk
    from rlk._runtime.chunks import rows_per_chunk

    assert rows_per_chunk(4096, 3) == 2
    chunked = rlk.logp_entropy(logits, tokens)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=0)
    fresh_rlk.setenv("RLK_NATIVE_CHUNK_MB", "-1")
    with pytest.raises(ValueError, match="RLK_NATIVE_CHUNK_MB"):
        rlk.logp(logits, tokens)


@pytest.mark.parametrize("op", ["logp", "logp_entropy", "entropy"])
def test_torch_compile_fullgraph_with_out(op):
    """Issue #31 regression: the out= overlap check called torch's is_fake, which dynamo
    refuses to trace ("Attempted to call function marked as skipped")."""
    logits, tokens = _data(4, 6, vocab=64)

    def call(x, *out):
        if op == "entropy":
            return rlk.entropy(x, out=out[0])
        if op == "logp":
            return rlk.logp(x, tokens, out=out[0])
        return rlk.logp_entropy(x, tokens, out=out)

    def buffers():
        return tuple(torch.empty(4, 6) for _ in range(2 if op == "logp_entropy" else 1))

    eager, compiled = buffers(), buffers()
    want = call(logits, *eager)
    got = torch.compile(call, fullgraph=True, backend="aot_eager")(logits, *compiled)
    for value, expected, buffer in zip(
            got if isinstance(got, tuple) else (got,),
            want if isinstance(want, tuple) else (want,), compiled, strict=True):
        torch.testing.assert_close(value, expected)
        torch.testing.assert_close(buffer, expected)


def test_torch_compile_fullgraph_matches_eager():
    logits, tokens = _data(4, 6, vocab=64)
    temperature = torch.rand(4, 6, generator=GEN) + 0.5

    def loss(x):
        logp, entropy = rlk.logp_entropy(x, tokens, temperature=temperature)
        return (logp * 2.0 - 0.1 * entropy).sum()

    eager_x = logits.clone().requires_grad_(True)
    loss(eager_x).backward()
    compiled_x = logits.clone().requires_grad_(True)
    compiled = torch.compile(loss, fullgraph=True)
    compiled(compiled_x).backward()
    torch.testing.assert_close(compiled_x.grad, eager_x.grad)
    torch.testing.assert_close(compiled(logits), loss(logits))


def test_torch_ops_are_registered():
    for name in ("logp", "logp_entropy", "logp_out", "logp_backward"):
        assert hasattr(torch.ops.rlk, name)


def test_import_loads_no_plugin():
    code = (
        "import sys, rlk\n"
        "from rlk import dispatch\n"
        "assert dispatch._dispatcher is None\n"
        "assert 'rlk.native' not in sys.modules\n"
        "assert not [m for m in sys.modules if m.startswith('rlk_')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
