"""rlk: fused operators for RL post-training of language models.

Importing rlk loads no plugin: backends are discovered at the first op call or the
first introspection call (`rlk.backends()`, `rlk.explain()`).
"""

from __future__ import annotations

from rlk import distributed
from rlk.config import check_inputs
from rlk.dispatch import use_backends
from rlk.errors import BackendUnavailableError, KernelError, PluginError
from rlk.hookspec import API_VERSION as PLUGIN_API_VERSION
from rlk.hookspec import hookimpl
from rlk.introspect import BackendInfo, backends, explain
from rlk.ops.entropy.op import entropy
from rlk.ops.group_advantages.op import group_advantages
from rlk.ops.group_advantages.options import GroupAdvantagesOptions
from rlk.ops.linear_logp.op import linear_logp, linear_logp_entropy
from rlk.ops.linear_policy_loss.op import linear_policy_loss
from rlk.ops.logp.op import logp, logp_entropy
from rlk.ops.policy_loss.op import policy_loss
from rlk.ops.policy_loss.options import PolicyLossOptions
from rlk.ops.sample.op import Sampled, sample
from rlk.ops.token_kl.op import token_kl
from rlk.version import __version__

__all__ = [
    "PLUGIN_API_VERSION",
    "BackendInfo",
    "BackendUnavailableError",
    "GroupAdvantagesOptions",
    "KernelError",
    "PluginError",
    "PolicyLossOptions",
    "Sampled",
    "__version__",
    "backends",
    "check_inputs",
    "distributed",
    "entropy",
    "explain",
    "group_advantages",
    "hookimpl",
    "linear_logp",
    "linear_logp_entropy",
    "linear_policy_loss",
    "logp",
    "logp_entropy",
    "policy_loss",
    "sample",
    "token_kl",
    "use_backends",
]
