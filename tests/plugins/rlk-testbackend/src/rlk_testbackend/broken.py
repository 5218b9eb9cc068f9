"""A plugin that fails to import, as one whose compiled extension is missing would."""

raise ImportError("librlk_broken.so: cannot open shared object file")
