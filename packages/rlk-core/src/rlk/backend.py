"""The plugin API: everything a backend package imports from rlk, on one page.

Everything else in rlk-core is private to it. A backend is a distribution with an entry
point in the group ``rlk.backends``, named like the backend it registers, pointing at a
module (or object) that:

1. declares ``RLK_PLUGIN_API = "2.1"``, the plugin API version it was written for;
2. implements the hook ``rlk_register(registry)``, marked with ``@hookimpl``, which calls
   ``registry.add_backend(name, priority=, probe=, version=)`` and then, per op it serves,
   ``registry.add_kernel(op, name, "pkg.module:function", backward=, devices=, dtypes=,
   check=, properties=, uses=)``, each function following its op's signature below
   (`LogpForward`, `LogpBackward`, ...: each names the ops it serves).

**Compatibility** (docs/backends/compatibility.md): this module and the kernel contract
change with `API_VERSION`, "major.minor". A minor version only adds (ops, optional kernel
attributes, names here); a kernel written for 2.0 keeps receiving exactly what 2.0 defines
on every 2.x core. Anything that changes what a registered kernel receives or must return
is a new major version. A plugin declaring an older minor of the current major loads; a
newer minor, or another major, is refused at load with a record saying why (for 1.0: what
changed and how to port), never loaded "ready" to fail at its first call.

What happens to a plugin:

- *Loading* (once per process, lazily: first op call or introspection call). The entry
  point is imported and the hook called with a registry of the plugin's own; what it
  declares lands only if the whole hook returns. An import or hook that raises (any
  exception but KeyboardInterrupt, SystemExit included), a refused RLK_PLUGIN_API, or a
  hook touching another plugin's backend makes the plugin *failed*: recorded, logged once,
  shown by ``rlk.backends()`` and ``rlk-core doctor`` (with its declared API version); other
  plugins load regardless. An import or hook still running after a few seconds is named in
  a warning: every rlk call waits for it.
- *Selection* (per call, cached by op, device, main dtype, the op's flags, whether an input
  requires grad, the user's preferences). Candidates rank by the user's order, then
  ``priority`` (native is 0; cuda/rocm 200, flashinfer 150). A kernel is skipped, with its
  reason kept for ``rlk.explain``, when its device type or dtypes do not fit, it lacks a
  property the user requires, it has no backward and an input requires grad, its
  backend's ``probe(device)`` returns a reason, its module fails to import, or its
  ``check(**kernel_args)`` returns a reason. Probes run once per device; checks only when
  the cache misses, so a check may depend only on what the key holds.
- *Calls*. What a kernel returns is checked against the op's contract by metadata on every
  call (a wrong dtype, shape, device or a None raises KernelError naming the backend), and
  by value under RLK_CHECK_INPUTS=1 and in the kit (inputs unchanged, no output aliasing an
  input, NaN only where the op allows it). An exception a kernel raises keeps its type and
  gains a note naming the backend and how to run without it.
- *Conformance*. ``pytest --pyargs rlk.testing --rlk-backend NAME`` checks every kernel the
  backend registers against float64 references (it needs pytest: rlk-core's ``[testing]``
  extra), and ``rlk-core doctor --smoke`` runs each of them on tiny inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rlk import hookspec
from rlk import registry as _registry
from rlk._runtime import lm_head, shards, validate
from rlk._runtime import temperature as _temperature
from rlk._runtime.contract import BoundKernel
from rlk._runtime.probing import (
    installed_version,
    module_found,
    nvidia_device_reason,
    release,
    version_range,
)
from rlk._runtime.spec import specs
from rlk._runtime.temperature import overflow_safe
from rlk.errors import KernelError
from rlk.hookspec import HookSpecs
from rlk.kernel_signatures import (
    DistributedLogpBackward,
    DistributedLogpForward,
    EntropyBackward,
    EntropyForward,
    GroupAdvantagesForward,
    LinearLogpBackward,
    LinearLogpForward,
    LinearPolicyLossForward,
    LogpBackward,
    LogpForward,
    PolicyLossBackward,
    PolicyLossForward,
    SampleForward,
    TokenKlBackward,
    TokenKlForward,
)
from rlk.ops.group_advantages import options as advantages_options
from rlk.ops.group_advantages.options import GroupAdvantagesOptions
from rlk.ops.linear_policy_loss import loop as linear_policy_loop
from rlk.ops.logp.op import one_token_per_row
from rlk.ops.policy_loss import options as policy_loss_options
from rlk.ops.policy_loss.options import PolicyLossOptions
from rlk.ops.sample.op import drawn_logp
from rlk.registry import Registry

# --- declaring a backend ---------------------------------------------------------------------

API_VERSION: str = hookspec.API_VERSION
"""The plugin API this rlk-core speaks ("major.minor"); set RLK_PLUGIN_API to the version your
plugin was written for."""

rlk_register = HookSpecs.rlk_register
"""The hook itself, for reading: what it receives and may do. Implement it in your entry-point
module, marked with `hookimpl`."""

hookimpl = hookspec.hookimpl
"""Marks your `rlk_register` implementation: ``@hookimpl``."""

Probe = _registry.Probe
"""``probe(device) -> str | None``: None when the backend serves that torch.device, else a
one-line reason. Cheap; never initialises CUDA where NVML or torch metadata answer."""

# module_found, installed_version, release, version_range and nvidia_device_reason answer what
# most probes ask (their own docstrings).

Check = _registry.Check
"""``check(**kernel_args) -> str | None``: None when the kernel takes this call, else the
reason (alignment, a dtype mix, a shape limit). It sees the call's kernel arguments."""

# Registry is what rlk_register receives: add_backend(...), add_kernel(...), known_ops.

# --- writing kernels -------------------------------------------------------------------------

FLOAT_DTYPES: tuple[torch.dtype, ...] = validate.FLOATS
"""The floating dtypes rlk's ops take besides float64: float32, bfloat16, float16. Add
torch.float64 to a kernel's `dtypes` when it computes float64 results for float64 inputs."""

Temperature = _temperature.Temperature
"""A kernel's temperature: a float, or a tensor with one value per row (float32; float64 for
float64 logits). Values are at least 2**-126; a row whose value was out of range gets NaN."""

# The functions and modules below carry their own docstrings: overflow_safe, drawn_logp,
# one_token_per_row, selected_kernel, KernelError, shards, lm_head, linear_policy_loop.

# --- op options (what policy_loss and group_advantages kernels receive as `options`) ---------

OBJECTIVES: tuple[str, ...] = policy_loss_options.OBJECTIVES
"""The values of `PolicyLossOptions.objective`."""

RATIO_LEVELS: tuple[str, ...] = policy_loss_options.RATIO_LEVELS
"""The values of `PolicyLossOptions.ratio_level`."""

KL_ESTIMATORS: tuple[str, ...] = policy_loss_options.KL_ESTIMATORS
"""The values of `PolicyLossOptions.kl_estimator`."""

AGGREGATIONS: tuple[str, ...] = policy_loss_options.AGGREGATIONS
"""The values of `PolicyLossOptions.agg`."""

METRICS: tuple[str, ...] = policy_loss_options.METRICS
"""The metrics a policy_loss forward returns, in this order."""

NORMALIZATIONS: tuple[str, ...] = advantages_options.NORMALIZATIONS
"""The values of `GroupAdvantagesOptions.normalize`."""

BASELINES: tuple[str, ...] = advantages_options.BASELINES
"""The values of `GroupAdvantagesOptions.baseline`."""


def selected_kernel(op: str, args: Mapping[str, Any]) -> BoundKernel:
    """The kernel rlk selects for `op` and these kernel-level arguments, under the caller's
    backend policy, for a kernel that runs another op's kernels (a three-GEMM loop calling
    the selected policy_loss kernel); declare that op in `add_kernel(..., uses=...)`."""
    return specs()[op].kernel(args)


__all__ = [
    "AGGREGATIONS",
    "API_VERSION",
    "BASELINES",
    "FLOAT_DTYPES",
    "KL_ESTIMATORS",
    "METRICS",
    "NORMALIZATIONS",
    "OBJECTIVES",
    "RATIO_LEVELS",
    "Check",
    "DistributedLogpBackward",
    "DistributedLogpForward",
    "EntropyBackward",
    "EntropyForward",
    "GroupAdvantagesForward",
    "GroupAdvantagesOptions",
    "KernelError",
    "LinearLogpBackward",
    "LinearLogpForward",
    "LinearPolicyLossForward",
    "LogpBackward",
    "LogpForward",
    "PolicyLossBackward",
    "PolicyLossForward",
    "PolicyLossOptions",
    "Probe",
    "Registry",
    "SampleForward",
    "Temperature",
    "TokenKlBackward",
    "TokenKlForward",
    "drawn_logp",
    "hookimpl",
    "installed_version",
    "linear_policy_loop",
    "lm_head",
    "module_found",
    "nvidia_device_reason",
    "one_token_per_row",
    "overflow_safe",
    "release",
    "rlk_register",
    "selected_kernel",
    "shards",
    "version_range",
]
