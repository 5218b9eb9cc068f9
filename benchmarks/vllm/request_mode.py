"""G separate requests or one with n=G, for GRPO groups on vLLM (rlk_vllm.bench).

    VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \\
        python benchmarks/vllm/request_mode.py --prompts 16 --group 8
"""

import sys

from rlk_vllm.bench import request_mode

if __name__ == "__main__":
    sys.exit(request_mode())
