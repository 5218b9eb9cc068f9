"""The operators, one folder each: `rlk/ops/<op>/` holds the op's public function and torch
operator (`op.py`), its native kernel (`native.py`), its float64 reference (`reference.py`)
and, where it has them, its options (`options.py`) and conformance cases (`samples.py`).
`rlk.op_table` lists them. Nothing here is imported until an op is used.
"""
