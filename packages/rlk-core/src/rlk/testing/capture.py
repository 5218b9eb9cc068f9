"""CUDA-graph capture for a backend's tests, by torch's recipe: warm up on a side stream (so
lazy initialisation, autotuning and allocator growth happen outside the capture), then
capture on the current device."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

Captured = TypeVar("Captured")


def warm_up_on_a_side_stream(run: Callable[[], object], calls: int) -> None:
    """`run` called `calls` times on a side stream that the current stream then waits for."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(calls):
            run()
    torch.cuda.current_stream().wait_stream(side)


def captured(run: Callable[[], Captured], warmups: int = 2) -> tuple[torch.cuda.CUDAGraph,
                                                                      Captured]:
    """`run` warmed up `warmups` times on a side stream, then captured: the graph and what the
    captured call returned, whose tensors each replay rewrites."""
    warm_up_on_a_side_stream(run, warmups)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run()
    return graph, outputs
