"""Which plugin API versions this rlk-core serves, and what a refused plugin must change.

The policy (docs/backends/compatibility.md): a minor version only adds, so a plugin written
for `major.m` loads on every core speaking `major.n` with n >= m; anything that changes what
an existing kernel receives or must return takes a new major version, and plugins written
for an older major are refused at load with a record saying what changed and how to port.

Version 1.1 broke 1.0 (a float64 lse, `[M, K]` tokens and option objects reached 1.0
kernels) under a minor number. 2.0 is that contract under its honest number: a plugin
declaring 1.1 was written for it and is served as 2.0; one declaring 1.0 is refused.
"""

from __future__ import annotations

import re

from rlk.hookspec import API_VERSION

GUIDE = "docs/backends/compatibility.md"

# Declared versions that name the contract of a later one (same kernels, old number).
ALIASES = {"1.1": "2.0"}

# Per refused major: what changed for its kernels, one line for a load record.
PORTING = {
    1: ("since 1.0, logp/logp_entropy/linear_logp kernels return lse in float64 (not float32) "
        "and keep the dominant token's precision through it, logp kernels may get [M, K] tokens "
        "(decline them with rlk.backend.one_token_per_row) and float64 logits, row indices may "
        "repeat or fall outside [0, M), temperatures reach 2**-126, and policy_loss / "
        "group_advantages kernels take an `options` object"),
}


def parse(version: object) -> tuple[int, int] | None:
    """(major, minor) of a "major.minor" string, else None."""
    match = re.fullmatch(r"(\d+)\.(\d+)", version) if isinstance(version, str) else None
    return None if match is None else (int(match[1]), int(match[2]))


def served_as(declared: str) -> str:
    """The version whose contract a plugin declaring `declared` gets (itself, or an alias's)."""
    return ALIASES.get(declared, declared)


def mismatch(declared: object) -> str | None:
    """Why a plugin declaring RLK_PLUGIN_API = `declared` cannot load here, or None.

    The major version must match; the minor must not be newer than core's, since the
    plugin may use what that minor version added.
    """
    if declared is None:
        return ("declares no RLK_PLUGIN_API (set RLK_PLUGIN_API = rlk.backend.API_VERSION); "
                f"rlk-core speaks {API_VERSION}")
    wanted = parse(served_as(declared) if isinstance(declared, str) else declared)
    have = parse(API_VERSION)
    assert have is not None
    if wanted is None:
        return f"declares RLK_PLUGIN_API = {declared!r}, not a 'major.minor' string"
    if wanted[0] < have[0] and wanted[0] in PORTING:
        return (f"written for plugin API {declared}, which rlk-core {API_VERSION} no longer "
                f"serves: {PORTING[wanted[0]]}. Port it ({GUIDE}) and declare "
                f"RLK_PLUGIN_API = \"{API_VERSION}\"")
    if wanted[0] != have[0]:
        return f"written for plugin API {declared}, rlk-core speaks {API_VERSION}"
    if wanted[1] > have[1]:
        return (f"written for plugin API {declared}, newer than rlk-core's {API_VERSION}: "
                "upgrade rlk-core")
    return None
