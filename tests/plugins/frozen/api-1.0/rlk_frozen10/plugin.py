import torch

import rlk

RLK_PLUGIN_API = "1.0"   # the loader refuses another major version


def probe(device):
    """None when this backend can serve `device` (a torch.device), else a one-line reason."""
    return None if device.type == "cpu" else "serves the CPU only"


@rlk.hookimpl
def rlk_register(registry):
    registry.add_backend("frozen10", priority=10, probe=probe, version="1.0.0")
    for op in ("logp", "logp_entropy"):
        registry.add_kernel(op, "frozen10", "rlk_frozen10.kernels:logp_forward",
                            backward="rlk_frozen10.kernels:logp_backward",
                            devices=("cpu",),
                            dtypes=(torch.float32, torch.bfloat16, torch.float16))
