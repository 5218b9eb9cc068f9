"""The benchmark page lists every workload and every peer the bench has."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlk.bench.peers import PEERS
from rlk.bench.workloads import WORKLOADS

PAGE = (Path(__file__).resolve().parents[1] / "docs/benchmarks/index.md").read_text()


def _first_column(heading: str) -> set[str]:
    """The names in the first column of the first table after `heading`."""
    table = next(block for block in PAGE.split(heading, 1)[1].split("\n\n")
                 if block.startswith("|"))
    return {line.split("|")[1].strip().strip("`") for line in table.splitlines()[2:]}


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_workload_is_listed(name):
    assert name in _first_column("## Workloads")


@pytest.mark.parametrize("name", PEERS)
def test_every_peer_is_listed(name):
    assert name in _first_column("### Peers")
