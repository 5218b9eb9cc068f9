"""Names a user types into a control (RLK_BACKENDS, RLK_PLUGINS, use_backends...) that match
nothing: a typo must be a warning at first use and a doctor finding, never silence."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """'; did you mean 'x'?' when a known name is close to `name` (case aside), else ''."""
    choices = sorted(set(known))
    folded = {choice.lower(): choice for choice in choices}
    match = folded.get(name.lower()) or next(
        iter(difflib.get_close_matches(name, choices, n=1, cutoff=0.6)), None
    )
    return f"; did you mean '{match}'?" if match else ""


def listing(known: Iterable[str]) -> str:
    """'a, b, c', or 'none' for nothing."""
    return ", ".join(sorted(set(known))) or "none"
