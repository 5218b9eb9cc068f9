"""Studies: measurements that print a table of their own rather than rows of the suite.

Host time against device time of the small ops, the cost of the kernel value checks, CUDA
graph capture, linear_logp's memory on the CPU. Each has a thin entry point under
`benchmarks/` (docs/benchmarks/index.md lists them); the GPU ones import rlk_cuda or
FlashInfer inside their functions, so that every module here imports without them.
"""
