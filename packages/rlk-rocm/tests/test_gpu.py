"""On an AMD GPU only: the probe's sysfs view agrees with HIP's, and rocm computes logp right.

The conformance kit (`pytest --pyargs rlk.testing --rlk-backend rocm`) is the full check; these
tests pin what only rlk-rocm can get wrong: device naming and the dispatch to its kernels.
"""

from __future__ import annotations

import pytest
import torch

from rlk_rocm import _ext, gfx, probe, topology

pytestmark = [pytest.mark.gpu, pytest.mark.build]


def test_sysfs_names_match_hip() -> None:
    names = topology.device_names()
    if names is None:
        pytest.skip("sysfs cannot name the devices here (the probe asks torch instead)")
    assert len(names) == torch.cuda.device_count()
    for index, name in enumerate(names):
        reported = gfx.parse(str(torch.cuda.get_device_properties(index).gcnArchName))
        assert reported.processor == name, f"device {index}: sysfs {name}, HIP {reported}"


def test_probe_serves_a_compiled_target() -> None:
    index = torch.cuda.current_device()
    name = str(torch.cuda.get_device_properties(index).gcnArchName)
    expected = gfx.arch_mismatch(_ext.architectures(), name)
    assert probe.probe(torch.device("cuda", index)) == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_logp_entropy_through_rocm_matches_float64(dtype: torch.dtype) -> None:
    import rlk
    from rlk.ops.logp.reference import logp_entropy
    from rlk.testing.poison import poisoned_allocations

    if probe.probe(torch.device("cuda")) is not None:
        pytest.skip(f"rocm cannot serve this device: {probe.probe(torch.device('cuda'))}")
    gen = torch.Generator(device="cuda").manual_seed(7)
    logits = (torch.randn(64, 50_000, generator=gen, device="cuda") * 3).to(dtype)
    tokens = torch.randint(0, 50_000, (64,), generator=gen, device="cuda")
    tokens[5] = -100
    with rlk.use_backends("rocm", strict=True), poisoned_allocations():
        assert rlk.explain("logp_entropy", logits, tokens).backend == "rocm"
        lp, ent = rlk.logp_entropy(logits, tokens)  # NaN-poisoned outputs: all must be written
    want_lp, want_ent = logp_entropy(logits.double(), tokens)
    assert (lp.double() - want_lp).abs().max().item() <= 2e-5 + 1e-5 * want_lp.abs().max().item()
    assert (ent.double() - want_ent).abs().max().item() <= 5e-5 * max(
        1.0, want_ent.abs().max().item()
    )
