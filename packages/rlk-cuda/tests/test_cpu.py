"""What must hold on a machine without a GPU: import, probe reasons, clean errors, registration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import rlk_cuda
from rlk_cuda import _ext, logp, plugin, probe, sample
from rlk_cuda import linear_logp as linear

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-device path")


def test_extension_imports_and_lists_its_architectures() -> None:
    assert _ext.import_error() is None
    archs = _ext.architectures()
    assert archs, "the extension must record the architectures it was built for"
    for arch in archs:
        probe._parse(arch)  # every recorded entry is one the probe understands


def test_version_matches_the_plugin() -> None:
    assert plugin.RLK_PLUGIN_API.split(".")[0] == "1"
    assert rlk_cuda.__version__ == "0.1.0"


def test_probe_rejects_non_cuda_devices() -> None:
    reason = probe.probe(torch.device("cpu"))
    assert reason is not None and reason.startswith("no CUDA device")


@no_cuda
def test_probe_says_no_cuda_device() -> None:
    assert probe.probe(torch.device("cuda")) == "no CUDA device"
    assert probe.probe(torch.device("cuda", 1)) == "no CUDA device"


@pytest.mark.parametrize(
    ("archs", "capability", "expected"),
    [
        (["80", "90a", "100a", "120"], (9, 0), None),
        (["80", "90a", "100a", "120"], (8, 6), None),  # sm_80 machine code runs on sm_86
        (["80", "90a", "100a", "120"], (10, 3), None),  # PTX of compute_80 compiles there
        (["80", "90a"], (7, 5), "built for sm_80;sm_90a, device is sm_75"),
        (["90a"], (8, 0), "built for sm_90a, device is sm_80"),
        (["90a"], (10, 0), "built for sm_90a, device is sm_100"),  # arch-specific: exact chip
        (["80-real"], (9, 0), "built for sm_80-real, device is sm_90"),  # no PTX to JIT
        (["80-real"], (8, 9), None),
        (["120"], (12, 1), None),
    ],
)
def test_arch_mismatch(archs: list[str], capability: tuple[int, int], expected: str | None) -> None:
    assert probe.arch_mismatch(archs, capability) == expected


def test_bad_arch_string_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unrecognised CUDA architecture 'sm90'"):
        probe.runs_on("sm90", (9, 0))


def test_probe_reports_a_broken_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(_ext, "import_error", lambda: "ImportError: libcuda.so.1: not found")
    assert probe.probe(torch.device("cuda", 0)) == (
        "extension failed to import: ImportError: libcuda.so.1: not found"
    )


def test_probe_reports_an_architecture_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (7, 5))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(_ext, "architectures", lambda: ["80", "90a"])
    assert probe.probe(torch.device("cuda", 0)) == "built for sm_80;sm_90a, device is sm_75"


def test_failed_import_is_remembered_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(name: str) -> None:
        raise ImportError("undefined symbol: cudaLaunchKernel")

    monkeypatch.setattr(_ext, "_module", None)
    monkeypatch.setattr(_ext, "_error", None)
    monkeypatch.setattr(_ext.importlib, "import_module", fail)
    with pytest.raises(ImportError, match="undefined symbol: cudaLaunchKernel"):
        _ext.load()
    assert _ext.import_error() == "ImportError: undefined symbol: cudaLaunchKernel"


@no_cuda
def test_kernels_without_a_device_raise_a_clean_error() -> None:
    logits = torch.randn(4, 10)
    tokens = torch.randint(0, 10, (4,))
    with pytest.raises(RuntimeError, match="need a CUDA device and none is available"):
        logp.forward(logits, tokens, 1.0, -100, None, None, False)
    with pytest.raises(RuntimeError, match="need a CUDA device"):
        sample.sample(logits, 1.0, 0, 1.0, 0.0, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="need a CUDA device"):
        logp.backward(
            torch.ones(4), None, logits, tokens, 1.0, -100, None, torch.zeros(4), None, False
        )


def test_integer_logits_are_a_type_error() -> None:
    from rlk_cuda._launch import dtype_code

    with pytest.raises(TypeError, match=r"float32, bfloat16 or float16 .* got torch.int32"):
        dtype_code("logits", torch.zeros(2, 2, dtype=torch.int32))


def test_the_kernel_table_follows_the_op_table() -> None:
    """Every op rlk-cuda serves is an op of rlk's table, and its kernels live in the host
    module named after the op (an `_entropy` variant shares its op's module)."""
    from rlk.op_table import OP_NAMES

    for op, (forward, backward, _, _) in plugin.KERNELS.items():
        assert op in OP_NAMES, op
        for target in filter(None, (forward, backward)):
            assert target.partition(":")[0] == op.removesuffix("_entropy"), (op, target)


def test_every_kernel_source_is_named_after_its_op() -> None:
    """Each .cu file under csrc/ (CMake builds them all) is named after the op it serves,
    or starts with that name."""
    from rlk.op_table import OP_NAMES

    sources = {path.name for path in (Path(__file__).resolve().parents[1] / "csrc").glob("*.cu")}
    assert sources
    for name in sources:
        assert any(name == f"{op}.cu" or name.startswith(f"{op}_") for op in OP_NAMES), name


def test_registration() -> None:
    from rlk.registry import Registry

    ops = (
        "logp",
        "logp_entropy",
        "sample",
        "linear_logp",
        "linear_logp_entropy",
        "linear_policy_loss",
        "group_advantages",
        "policy_loss",
    )
    registry = Registry(ops)
    plugin.rlk_register(registry)
    backend = registry.backends["cuda"]
    assert backend.priority == 200
    assert backend.probe is probe.probe
    for op in ops:
        (kernel,) = registry.kernels[op]
        assert kernel.devices == ("cuda",)
        want = {"group_advantages": plugin.FLOAT32, "policy_loss": plugin.ANY_FLOAT}
        assert kernel.dtypes == want.get(op, plugin.DTYPES)
    assert "batch_invariant" in registry.kernels["logp"][0].properties
    assert registry.kernels["logp"][0].backward_target == "rlk_cuda.logp:backward"


def test_registration_skips_ops_core_does_not_define() -> None:
    from rlk.registry import Registry

    registry = Registry(("logp",))
    plugin.rlk_register(registry)
    assert [k.op for ks in registry.kernels.values() for k in ks] == ["logp"]


def test_linear_group_on_cpu_tensors_fails_before_any_collective() -> None:
    """A CPU call names the device problem; the group (not even a real one) is never used."""
    hidden, weight = torch.randn(2, 4), torch.randn(8, 4)
    tokens = torch.zeros(2, dtype=torch.int64)
    group: Any = object()
    with pytest.raises((RuntimeError, ValueError), match="CUDA"):
        linear.forward(hidden, weight, tokens, None, 1.0, -100, True, group, None)
    zeros, wanted = torch.zeros(2), (True, True, False)
    with pytest.raises((RuntimeError, ValueError), match="CUDA"):
        linear.backward(
            zeros, None, hidden, weight, tokens, None, 1.0, -100, group, zeros, None, wanted,
            None,
        )


def test_chunk_budget_must_be_positive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", "0")
    with pytest.raises(ValueError, match="RLK_CUDA_CHUNK_MB must be > 0, got '0'"):
        linear.chunk_bytes(linear.LOGP_CHUNK_MB)


def test_policy_loss_settings_struct_takes_every_option_by_name() -> None:
    """The options reach the kernel as a struct with named fields, one per option."""
    from rlk.ops.policy_loss.options import PolicyLossOptions

    from rlk_cuda import policy_loss

    options = PolicyLossOptions(objective="sapo", clip_low=0.1, clip_high=0.3,
                                ratio_level="sequence-token", log_ratio_max=10.0,
                                sapo_temperature_pos=2.0, kl_coef=0.05, kl_estimator="k3+",
                                kl_clamp=10.0, kl_bias_correction=True, tis_cap=2.0,
                                agg="seq-mean-token-sum-norm", divisor=64.0,
                                count_empty_rows=True, scale=0.5)
    s = policy_loss.settings(options)
    assert (s.objective, s.ratio_level, s.agg, s.kl_estimator) == (2, 2, 4, 2)
    assert s.kl_straight_through and s.kl_bias_correction and s.count_empty_rows
    assert (s.clip_low, s.clip_high, s.sapo_temperature_pos) == pytest.approx((0.1, 0.3, 2.0))
    assert (s.kl_coef, s.kl_clamp, s.tis_cap) == pytest.approx((0.05, 10.0, 2.0))
    assert (s.divisor, s.scale, s.log_ratio_max) == (64.0, 0.5, 10.0)
    assert s.log_ratio_min == -float("inf") and s.dual_clip == 0.0 and s.ratio_cap == 0.0
    assert policy_loss.settings(options) is s  # built once per options object
    defaults = policy_loss.settings(PolicyLossOptions())
    assert (defaults.objective, defaults.kl_estimator, defaults.tis_cap) == (0, 2, 0.0)
    with pytest.raises(AttributeError):
        s.clip_ratio = 0.2  # a misspelt field raises instead of being ignored


KERNELS = {"logp_forward": "LogpFwdArgs", "logp_forward_tma": "LogpFwdArgs",
           "logp_backward": "LogpBwdArgs", "logp_cols_partial": "LogpColsArgs",
           "logp_cols_merge": "LogpColsArgs", "soft_cap": "SoftCapArgs",
           "relative_probs": "RelProbArgs", "scale_by_device_factor": "ScaleArgs",
           "scale_rows": "ScaleRowsArgs", "sample": "SampleArgs",
           "group_advantages": "GroupAdvArgs", "policy_loss_forward": "PolicyLossArgs",
           "policy_loss_backward": "PolicyLossArgs"}


@pytest.mark.parametrize(("name", "struct"), KERNELS.items())
def test_every_kernel_binding_takes_its_struct_by_name_only(name: str, struct: str) -> None:
    """Each kernel takes (device, stream, args) by name, args its own argument struct: a
    position, a misspelt name or another kernel's struct is refused before any launch."""
    ext = _ext.load()
    launch = getattr(ext, name)
    signature = launch.__doc__.split("\n")[0]
    assert signature.startswith(f"{name}(*, device: int, stream: int, args: "), signature
    assert signature.split("args: ")[1].split(")")[0].endswith(struct), signature
    with pytest.raises(TypeError):
        launch(0, 0, None)  # by position
    with pytest.raises(TypeError):
        launch(device=0, strem=0, args=None)
    other = ext.ScaleArgs if struct != "ScaleArgs" else ext.SoftCapArgs
    with pytest.raises(TypeError):
        launch(device=0, stream=0, args=other(**_zero_fields(other)))


def _zero_fields(cls: Any) -> dict[str, Any]:
    """Every field name of an argument struct (its properties), each with value 0."""
    names = [n for n, v in vars(cls).items() if type(v).__name__ == "property"]
    assert names, cls
    return dict.fromkeys(names, 0)


def test_argument_structs_are_filled_by_field_name() -> None:
    """A struct is built from every one of its fields by name (pointers as addresses):
    a missing, unknown or mistyped name is a TypeError, so none is silently left zero."""
    ext = _ext.load()
    fields = _zero_fields(ext.ScaleRowsArgs)
    assert sorted(fields) == sorted(["src", "src_dtype", "src_row_stride", "out", "out_dtype",
                                     "out_row_stride", "rows", "cols", "factor"])
    args = ext.ScaleRowsArgs(**{**fields, "out": 2**48 + 16, "rows": 3, "out_dtype": 1})
    assert (args.out, args.rows, args.out_dtype, args.src) == (2**48 + 16, 3, 1, 0)
    args.src = 64  # writable by name too
    assert args.src == 64
    with pytest.raises(TypeError, match="ScaleRowsArgs: missing field factor"):
        ext.ScaleRowsArgs(**{k: v for k, v in fields.items() if k != "factor"})
    with pytest.raises(TypeError, match="ScaleRowsArgs: unknown field colz"):
        ext.ScaleRowsArgs(**fields, colz=1)
    with pytest.raises(TypeError, match=r"ScaleRowsArgs.rows: cannot take"):
        ext.ScaleRowsArgs(**{**fields, "rows": "3"})
    with pytest.raises(TypeError):
        ext.ScaleRowsArgs(*fields.values())  # never by position
    with pytest.raises(AttributeError):
        args.colz = 1  # a misspelt field raises instead of being ignored


def test_the_logp_forward_binding_has_no_scratch_for_the_sampler() -> None:
    """`stats` belongs to the sampler's statistics pass inside the extension (issue #29):
    the logp forward's binding leaves it out, so no Python caller fills it."""
    ext = _ext.load()
    assert "stats" not in _zero_fields(ext.LogpFwdArgs)
    assert "stats" in _zero_fields(ext.SampleArgs)


def test_every_wrapper_names_every_field_of_its_struct(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrappers on CPU tensors, with the device checks passed and the launches recorded:
    each builds its kernel's struct by name (a missing or misspelt field raises TypeError)."""
    from rlk.ops.group_advantages.options import GroupAdvantagesOptions
    from rlk.ops.policy_loss.options import PolicyLossOptions

    from rlk_cuda import group_advantages, linear_policy_loss, policy_loss

    ext = _ext.load()
    launched: list[str] = []
    for name in KERNELS:
        monkeypatch.setattr(ext, name, lambda *, name=name, **_: launched.append(name))
    for module in (logp, sample, group_advantages, linear, linear_policy_loss, policy_loss):
        monkeypatch.setattr(module, "device_of", lambda name, tensor: 0)
        monkeypatch.setattr(module, "stream", lambda device: 0)
        monkeypatch.setattr(module, "same_device", lambda *_: None, raising=False)
    for module in (logp, sample):
        monkeypatch.setattr(module, "forward_segments", lambda device, vocab: (False, 2))
    logits, tokens = torch.randn(4, 8), torch.zeros(4, dtype=torch.int64)
    logp.forward(logits, tokens, 1.0, -100, None, None, True)
    logp.backward(torch.ones(4), None, logits, tokens, 1.0, -100, None, torch.zeros(4), None,
                  False)
    sample.sample(logits, 1.0, 0, 1.0, 0.0, torch.zeros(4, dtype=torch.int64))
    group_advantages.forward(torch.zeros(4), None, 2, 2, GroupAdvantagesOptions())
    linear.soft_cap(logits, 30.0)
    linear_policy_loss.scale_rows(logits, torch.ones(4), torch.empty_like(logits))
    linear_policy_loss.scale_grads([torch.zeros(8)], torch.ones(()))
    block = linear_policy_loss._Block.empty(0, 4, tokens, 1.0, logits.device)
    linear_policy_loss._relative_probs(logits, torch.empty_like(logits), block, 0, 4, -100)
    mask = torch.ones(2, 3, dtype=torch.bool)
    policy_loss.forward(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), mask, None, None,
                        None, PolicyLossOptions())
    policy_loss.backward(torch.ones(()), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2),
                         mask, None, None, None, PolicyLossOptions())
    assert launched == ["logp_forward", "logp_backward", "sample", "group_advantages",
                        "soft_cap", "scale_rows", "scale_by_device_factor", "relative_probs",
                        "policy_loss_forward", "policy_loss_backward"]


def test_dtype_codes_come_from_the_extension() -> None:
    """One element type enum, named as torch's dtypes; bool is stored as uint8."""
    from rlk_cuda._launch import dtype_codes

    ext = _ext.load()
    codes = dtype_codes()
    assert codes[torch.bfloat16] == int(ext.DType.bfloat16)
    assert codes[torch.bool] == codes[torch.uint8] == int(ext.DType.uint8)
    assert len(set(codes.values())) == len(ext.DType.__members__) == 9


@no_cuda
def test_policy_loss_and_advantages_on_cpu_tensors_need_a_device() -> None:
    from rlk.ops.group_advantages.options import GroupAdvantagesOptions
    from rlk.ops.policy_loss.options import PolicyLossOptions

    from rlk_cuda import group_advantages as advantages
    from rlk_cuda import policy_loss

    logp = torch.zeros(2, 3)
    with pytest.raises(RuntimeError, match="need a CUDA device"):
        policy_loss.forward(logp, logp, torch.zeros(2), logp, None, None, None,
                            PolicyLossOptions())
    with pytest.raises(RuntimeError, match="need a CUDA device"):
        advantages.forward(torch.zeros(4), None, 2, 2, GroupAdvantagesOptions())


@pytest.mark.parametrize(("budget_mb", "vocab", "block", "logits_rows"), [
    (None, 128256, 1024, 512),  # the default: whole 512-row logits GEMMs per block
    ("4", 3001, 128, 128),  # a budget below 512 rows: whole GEMM tiles, one logits GEMM each
    ("1", 1300, 100, 100),  # below one tile: what fits
])
def test_one_read_blocks_fit_the_chunk_budget(monkeypatch: pytest.MonkeyPatch,
                                              budget_mb: str | None, vocab: int, block: int,
                                              logits_rows: int) -> None:
    from rlk_cuda.linear_policy_loss import CudaChunkOps

    if budget_mb is None:
        monkeypatch.delenv("RLK_CUDA_CHUNK_MB", raising=False)
    else:
        monkeypatch.setenv("RLK_CUDA_CHUNK_MB", budget_mb)
    # float32 operands (bf16 on CPU is multiplied in float32): 4-byte gradient rows
    hidden, weight = torch.zeros(4, 8), torch.zeros(vocab, 8)
    ops = CudaChunkOps(hidden, weight, None, None, None, one_read=True)
    assert (ops.chunk_rows(), ops._logits_rows()) == (block, logits_rows)
    width = linear.padded(vocab)
    assert (block + logits_rows) * width * 4 <= linear.chunk_bytes(linear.POLICY_LOSS_CHUNK_MB)


def test_scale_rows_refuses_mismatched_shapes_before_any_launch() -> None:
    from rlk_cuda.linear_policy_loss import scale_rows

    src, factor = torch.zeros(4, 8), torch.zeros(4)
    with pytest.raises(ValueError, match="one shape"):
        scale_rows(src, factor, torch.zeros(4, 9))
    with pytest.raises(ValueError, match="factor"):
        scale_rows(src, torch.zeros(3), torch.zeros(4, 8))
    with pytest.raises(ValueError, match="unit column stride"):
        scale_rows(src, factor, torch.zeros(8, 4).t())
