"""Stands for a compiled extension that fails to load."""

raise ImportError("_missing_extension.so: undefined symbol: rlk_kernel_table")
