"""A third-party rlk backend as plugin API 2.1 defines one. Frozen: never edit these files."""
