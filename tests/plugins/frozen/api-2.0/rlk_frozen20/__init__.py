"""A third-party rlk backend as plugin API 2.0 defines one. Frozen: never edit these files."""
