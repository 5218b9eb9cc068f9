"""rlk-vllm: GRPO rollouts through vLLM, a log-prob parity tool, and a `vllm` sample backend.

Importing this package never imports vLLM; the engine is imported when first used.
"""

from rlk_vllm._vllm import VLLMNotInstalledError, vllm_available
from rlk_vllm.batch import RolloutBatch
from rlk_vllm.config import VLLMSamplerConfig
from rlk_vllm.executor import RolloutExecutor
from rlk_vllm.parity import ParityReport, logprob_parity

__version__ = "0.1.0"

__all__ = [
    "ParityReport",
    "RolloutBatch",
    "RolloutExecutor",
    "VLLMNotInstalledError",
    "VLLMSamplerConfig",
    "logprob_parity",
    "vllm_available",
]
