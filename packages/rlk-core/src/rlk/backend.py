"""The plugin API: everything a backend package imports from rlk, on one page.

Everything else in rlk-core is private to it. This module changes with the plugin API
version, `API_VERSION` ("major.minor"): a minor version adds, a major version breaks. A
plugin declares the version it was written for; the loader refuses another major
version, or a newer minor one, with a record saying so instead of a crash.

A backend is a distribution with an entry point in the group ``rlk.backends``, named
like the backend it registers, pointing at a module (or object) that:

1. declares ``RLK_PLUGIN_API = "1.1"`` (the version whose names it uses; at least "1.1"
   to import this module);
2. implements the hook ``rlk_register(registry)``, marked with ``@hookimpl``, which calls
   ``registry.add_backend(name, priority=, probe=, version=)`` and then, per op it serves,
   ``registry.add_kernel(op, name, "pkg.module:function", backward=, devices=, dtypes=,
   check=, properties=, uses=)``.

What happens to it:

- *Loading* (once per process, lazily: first op call or introspection call). The entry
  point is imported and the hook called with a registry of the plugin's own; what it
  declares lands only if the whole hook returns. An import or hook that raises (any
  exception but KeyboardInterrupt, SystemExit included), a missing or incompatible
  RLK_PLUGIN_API, or a hook touching another plugin's backend makes the plugin *failed*:
  recorded, logged once, shown by ``rlk.backends()`` and ``rlk-core doctor``; other
  plugins load regardless. An import or hook still running after a few seconds is
  named in a warning: every rlk call waits for it.
- *Selection* (per call, cached by op, device, main dtype, the op's flags, whether an
  input requires grad, the user's preferences). Candidates rank by the user's order,
  then ``priority`` (native is 0; cuda/rocm 200, flashinfer 150). A kernel is skipped,
  with its reason kept for ``rlk.explain``, when its device type or dtypes do not fit,
  it lacks a property the user requires, it has no backward and an input requires
  grad, its backend's ``probe(device)`` returns a reason, its module fails to import, or
  its ``check(**kernel_args)`` returns a reason. Probes run once per device; checks
  only when the cache misses, so a check may depend only on what the key holds.
- *Calls*. Kernels get plain tensors (autograd stripped, arguments validated, leading
  dimensions flattened; the per-op signatures are in docs/backends/writing-a-backend.md).
  What a kernel returns is checked by metadata against the op's contract (a wrong dtype,
  shape, device or a None raises KernelError naming the backend); an exception it raises
  keeps its type and gains a note naming the backend and how to run without it.
- *Conformance*. ``pytest --pyargs rlk.testing --rlk-backend NAME`` checks every kernel
  the backend registers against float64 references (it needs pytest: rlk-core's
  ``[testing]`` extra).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlk._runtime import lm_head, shards
from rlk._runtime.contract import BoundKernel
from rlk._runtime.spec import specs
from rlk._runtime.temperature import Temperature, overflow_safe
from rlk._runtime.validate import FLOATS as FLOAT_DTYPES
from rlk.errors import KernelError
from rlk.hookspec import API_VERSION, HookSpecs, hookimpl
from rlk.ops.group_advantages.options import BASELINES, NORMALIZATIONS, GroupAdvantagesOptions
from rlk.ops.linear_policy_loss import loop as linear_policy_loop
from rlk.ops.logp.op import one_token_per_row
from rlk.ops.policy_loss.options import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    METRICS,
    OBJECTIVES,
    RATIO_LEVELS,
    PolicyLossOptions,
)
from rlk.ops.sample.op import drawn_logp
from rlk.registry import Check, Probe, Registry

# --- declaring a backend -----------------------------------------------------------------
# API_VERSION   the plugin API this rlk-core speaks ("major.minor"); set RLK_PLUGIN_API to
#               the version your plugin was written for.
# hookimpl      marks your rlk_register implementation.
# rlk_register  the hook itself, for reading: what it receives and may do.
# Registry      what rlk_register receives: add_backend(...), add_kernel(...), known_ops.
# Probe, Check  the shapes of probe(device) -> reason | None and check(**args) -> reason | None.
rlk_register = HookSpecs.rlk_register

# --- writing kernels -------------------------------------------------------------------------
# FLOAT_DTYPES  the floating dtypes rlk's ops take (float32, bfloat16, float16).
# Temperature   a float, or a float32 tensor with one value per row.
# overflow_safe (logits, T) -> (logits, T) with the same softmax, safe for a sampler that
#               divides float32 logits by T itself (tiny temperatures overflow).
# drawn_logp    the `logp` output of a `sample` kernel whose backend has no `logp` kernel.
# shards        vocabulary-parallel shard math: Layout, layout, forward_tokens,
#               backward_tokens, merge, padded, KERNEL_IGNORE, KERNEL_BAD.
# lm_head       the LM head's logits as every linear op defines them (float32 logits from
#               the inputs' dtype, soft-capping, the kernels' temperature).
# linear_policy_loop   the three-GEMM loop of linear_policy_loss (ChunkOps, LossGrads, run,
#               choose_path, describe): a backend subclasses ChunkOps with its own kernels.
# selected_kernel      the kernel rlk selects for another op (see below).
# one_token_per_row    a `check` for logp kernels that gather one token per row (it declines
#               [M, K] tokens, which fall back to a backend that gathers K).
# KernelError   what rlk raises when a kernel returns what its op's contract does not allow.

# --- op options (what policy_loss and group_advantages kernels receive as `options`) ---------
# PolicyLossOptions       every policy_loss setting, validated (frozen; hashable: cache on it).
# OBJECTIVES, RATIO_LEVELS, KL_ESTIMATORS, AGGREGATIONS
#                         the values of its objective, ratio_level, kl_estimator, agg.
# METRICS                 the metrics a policy_loss forward returns, in order.
# GroupAdvantagesOptions  every group_advantages setting, validated.
# NORMALIZATIONS, BASELINES   the values of its normalize and baseline.



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
    "GroupAdvantagesOptions",
    "KernelError",
    "PolicyLossOptions",
    "Probe",
    "Registry",
    "Temperature",
    "drawn_logp",
    "hookimpl",
    "linear_policy_loop",
    "lm_head",
    "one_token_per_row",
    "overflow_safe",
    "rlk_register",
    "selected_kernel",
    "shards",
]
