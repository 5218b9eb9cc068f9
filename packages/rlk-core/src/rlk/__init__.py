"""rlk: fused operators for RL post-training of language models.

Importing rlk loads no plugin: backends are discovered at the first op call or the
first introspection call (`rlk.backends()`, `rlk.explain()`).
"""

from __future__ import annotations

__version__ = "0.1.0"

from rlk import distributed
from rlk.config import check_inputs
from rlk.dispatch import use_backends
from rlk.errors import BackendUnavailableError, PluginError
from rlk.introspect import BackendInfo, backends, explain
from rlk.ops.advantages import group_advantages
from rlk.ops.linear_logp import linear_logp, linear_logp_entropy
from rlk.ops.logp import logp, logp_entropy
from rlk.ops.policy_loss import policy_loss
from rlk.ops.policy_loss_options import PolicyLossOptions
from rlk.ops.sample import Sampled, sample
from rlk.plugins import PLUGIN_API_VERSION, hookimpl

__all__ = [
    "PLUGIN_API_VERSION",
    "BackendInfo",
    "BackendUnavailableError",
    "PluginError",
    "PolicyLossOptions",
    "Sampled",
    "__version__",
    "backends",
    "check_inputs",
    "distributed",
    "explain",
    "group_advantages",
    "hookimpl",
    "linear_logp",
    "linear_logp_entropy",
    "logp",
    "logp_entropy",
    "policy_loss",
    "sample",
    "use_backends",
]
