"""The catalogue of workloads, by name, in the order reports list them."""

from __future__ import annotations

from rlk.bench.workload import Workload
from rlk.bench.workloads import linear, logp, losses, sampling

WORKLOADS: dict[str, Workload] = {
    w.name: w for module in (logp, linear, losses, sampling) for w in module.WORKLOADS
}


def select(names: list[str] | None) -> list[Workload]:
    """The named workloads (all when None); ValueError naming the known ones otherwise."""
    if not names:
        return list(WORKLOADS.values())
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; "
                         f"expected any of {', '.join(WORKLOADS)}")
    return [WORKLOADS[n] for n in names]
