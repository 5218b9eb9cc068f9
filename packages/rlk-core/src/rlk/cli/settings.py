"""The RLK_* settings, parsed as the code that reads them parses them: a value every op would
refuse is a doctor finding, not a healthy report followed by a failing first call."""

from __future__ import annotations

from rlk._runtime.chunks import chunk_bytes
from rlk.config import env_flag

FLAGS = ("RLK_STRICT", "RLK_STRICT_PLUGINS", "RLK_CHECK_INPUTS")


def errors() -> list[str]:
    """One message per setting whose value its reader refuses."""
    found = []
    for name in FLAGS:
        try:
            env_flag(name)
        except ValueError as exc:
            found.append(str(exc))
    try:
        chunk_bytes()
    except ValueError as exc:
        found.append(str(exc))
    return found
