"""The catalogue of workloads, by name, in the order they run and reports list them.

The ops with published targets come first, so a run cut short by --time-limit has
measured what matters most.
"""

from __future__ import annotations

from rlk.bench.workload import Workload
from rlk.bench.workloads import (
    group_advantages,
    linear_logp,
    linear_policy_loss,
    logp,
    policy_loss,
    sample,
    trl_grpo,
)

ORDER = ("logp", "logp-bwd", "logp-unaligned", "linear-logp", "linear-policy-loss", "sample",
         "logp-entropy", "policy-loss", "group-advantages", "logp-native", "trl-grpo",
         "group-advantages-sweep")
# one module per op, named after it, and whole trainer steps (tests/test_op_table.py checks
# both against the op table)
MODULES = (logp, linear_logp, linear_policy_loss, sample, policy_loss, group_advantages)
STEPS = (trl_grpo,)
_ALL = {w.name: w for module in (*MODULES, *STEPS) for w in module.WORKLOADS}
WORKLOADS: dict[str, Workload] = {name: _ALL[name] for name in ORDER}


def select(names: list[str] | None) -> list[Workload]:
    """The named workloads (all when None); ValueError naming the known ones otherwise."""
    if not names:
        return list(WORKLOADS.values())
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; "
                         f"expected any of {', '.join(WORKLOADS)}")
    return [WORKLOADS[n] for n in names]
