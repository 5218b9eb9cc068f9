"""A third-party rlk backend as plugin API 1.0 defined one. Frozen: never edit these files."""
