"""Environment switches, read when used so that tests and users can change them at run time."""

from __future__ import annotations

import os

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def env_flag(name: str) -> bool:
    """Parse a boolean environment variable; anything unexpected is an error, not a guess."""
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name} must be one of 1/0/true/false/yes/no/on/off, got {value!r}")


def env_names(name: str) -> tuple[str, ...]:
    """Parse a comma-separated list of names, ignoring blanks."""
    return tuple(part.strip() for part in os.environ.get(name, "").split(",") if part.strip())


_check_inputs_override: bool | None = None


def check_inputs(enabled: bool | None = None) -> bool:
    """Turn range validation of every op's inputs on or off; with no argument, report it.

    Validation (tokens in range, row indices in range) needs a device sync, so it is
    off unless asked for, through this call or RLK_CHECK_INPUTS=1.`None` restores
    the environment's setting.
    """
    global _check_inputs_override
    if enabled is not None:
        _check_inputs_override = bool(enabled)
    return checking_inputs()


def reset_check_inputs() -> None:
    """Forget an override made through `check_inputs`, so the environment decides again."""
    global _check_inputs_override
    _check_inputs_override = None


def checking_inputs() -> bool:
    """Whether value checks run. Every op and kernel call asks, so an unset variable costs
    one dict lookup (`in os.environ` raises and catches a KeyError: about 1 us)."""
    if _check_inputs_override is not None:
        return _check_inputs_override
    if _ENVIRON is not None and _CHECK_INPUTS_KEY not in _ENVIRON:
        return False
    return env_flag("RLK_CHECK_INPUTS")


# the mapping os.environ keeps in step with itself, keyed as it encodes names (CPython)
_ENVIRON: dict[object, object] | None = getattr(os.environ, "_data", None)
_CHECK_INPUTS_KEY = os.environ.encodekey("RLK_CHECK_INPUTS") if _ENVIRON is not None else None
