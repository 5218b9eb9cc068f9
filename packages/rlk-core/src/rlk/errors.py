"""Exceptions raised by rlk."""

from __future__ import annotations

from collections.abc import Mapping


class BackendUnavailableError(RuntimeError):
    """No eligible backend can serve a call (or strict mode refused a fallback).

    `reasons` maps every rejected backend to why it was rejected, so the caller
    can see at once what is missing instead of guessing.
    """

    def __init__(self, op: str, device: str, reasons: Mapping[str, str], detail: str = ""):
        self.op = op
        self.device = device
        self.reasons = dict(reasons)
        lines = [f"no eligible backend for rlk op '{op}' on {device}{detail}"]
        lines += [f"  {name}: {why}" for name, why in self.reasons.items()]
        super().__init__("\n".join(lines))


class PluginError(RuntimeError):
    """A plugin failed to load or register while RLK_STRICT_PLUGINS=1."""


class KernelError(RuntimeError):
    """A backend's kernel returned something its op's contract does not allow."""


def describe(exc: BaseException) -> str:
    """'TypeName: message', the form every recorded failure takes."""
    return f"{type(exc).__name__}: {exc}"
