"""AMD GPU target IDs: which compiled code object runs on which device.

A target ID is a processor with optional feature settings, e.g. ``gfx90a`` or
``gfx90a:sramecc+:xnack-``. Code for a processor runs only on that processor (there is no
forward compatibility as with CUDA PTX), except for LLVM's generic targets, which cover a
fixed family. A feature left unset in the build ("any") runs in either device mode; a feature
set to ``+`` or ``-`` runs only when the device is in that mode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TARGET = re.compile(r"^(gfx[0-9a-f]+|gfx[0-9]+(?:-[0-9]+)?-generic)((?::[a-z]+[+-])*)$")

# LLVM's generic targets and the processors their code runs on.
GENERIC_FAMILIES: dict[str, frozenset[str]] = {
    "gfx9-generic": frozenset({"gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"}),
    "gfx9-4-generic": frozenset({"gfx940", "gfx941", "gfx942", "gfx950"}),
    "gfx10-1-generic": frozenset({"gfx1010", "gfx1011", "gfx1012", "gfx1013"}),
    "gfx10-3-generic": frozenset(
        {"gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036"}
    ),
    "gfx11-generic": frozenset(
        {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"}
    ),
    "gfx12-generic": frozenset({"gfx1200", "gfx1201"}),
}


@dataclass(frozen=True)
class TargetID:
    """A parsed target ID: processor name and the features it sets (name -> True for '+')."""

    processor: str
    features: dict[str, bool] = field(default_factory=dict)

    def __str__(self) -> str:
        flags = "".join(f":{n}{'+' if on else '-'}" for n, on in sorted(self.features.items()))
        return self.processor + flags


def parse(target: str) -> TargetID:
    """Parse 'gfx942' or 'gfx90a:sramecc+:xnack-'; ValueError names anything else."""
    match = _TARGET.match(target.strip())
    if match is None:
        raise ValueError(
            f"unrecognised AMD GPU target {target!r}; expected e.g. 'gfx942' or 'gfx90a:xnack-'"
        )
    processor, rest = match.groups()
    if processor.endswith("-generic") and processor not in GENERIC_FAMILIES:
        raise ValueError(
            f"unknown generic AMD GPU target {processor!r}; known: "
            + ", ".join(sorted(GENERIC_FAMILIES))
        )
    features: dict[str, bool] = {}
    for item in filter(None, rest.split(":")):
        features[item[:-1]] = item.endswith("+")
    return TargetID(processor, features)


def name_from_version(version: int) -> str:
    """The processor name for a KFD ``gfx_target_version`` (90010 -> 'gfx90a').

    The number is major * 10000 + minor * 100 + stepping; the name writes minor and stepping
    as one hexadecimal digit each.
    """
    major, minor, stepping = version // 10000, (version // 100) % 100, version % 100
    if version <= 0 or minor > 15 or stepping > 15:
        raise ValueError(f"not a gfx_target_version: {version}")
    return f"gfx{major}{minor:x}{stepping:x}"


def runs_on(built: str, device: str) -> bool | None:
    """Whether code built for target `built` runs on the device named by target ID `device`.

    None when the answer depends on a feature mode the device string does not state (a
    device known only by its processor name, against a build that sets that feature).
    """
    target, dev = parse(built), parse(device)
    if target.processor in GENERIC_FAMILIES:
        if dev.processor not in GENERIC_FAMILIES[target.processor]:
            return False
    elif target.processor != dev.processor:
        return False
    unknown = False
    for name, on in target.features.items():
        if name not in dev.features:
            unknown = True
        elif dev.features[name] != on:
            return False
    return None if unknown else True


def undecided(built: list[str], device: str) -> bool:
    """True when no target surely runs on `device` but one might, given the device's modes."""
    answers = [runs_on(target, device) for target in built]
    return True not in answers and None in answers


def arch_mismatch(built: list[str], device: str) -> str | None:
    """None when one of the `built` targets surely runs on `device`, else the one-line reason."""
    if any(runs_on(target, device) for target in built):
        return None
    return f"built for {';'.join(built)}, device is {device}"
