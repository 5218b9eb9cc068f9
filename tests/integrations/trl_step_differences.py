"""The per-step differences behind docs/integrations/trl.md's table, as markdown.

For each TRL loss_type, the largest difference between TRL's own GRPOTrainer and the
patched one, per step, over the configurations of test_trl.MATCHED of that loss type,
for the loss, the KL, the gradient norm and every parameter gradient, fused and unfused
loss paths both counted. A difference is |rlk - TRL| / (1 + |TRL|), so test_trl's
tolerance (1e-5 absolute plus 1e-5 relative) holds where it is at most 1e-5. With --free,
the patched run is left to run free (no parameters loaded from TRL's run), which shows
the float32 drift between two runs.

    RLK_INTEGRATIONS=1 OMP_NUM_THREADS=1 python tests/integrations/trl_step_differences.py
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from integrations import test_trl
from rlk.integrations import trl as rlk_trl

COLUMNS = ("loss", "kl", "grad_norm", "grads")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--free", action="store_true", help="no parameters loaded from TRL")
    free = parser.parse_args().free
    worst: dict[str, list[dict[str, float]]] = defaultdict(
        lambda: [dict.fromkeys(COLUMNS, 0.0) for _ in range(test_trl.STEPS)])
    with tempfile.TemporaryDirectory() as workdir:
        work = Path(workdir)
        model_dir = test_trl.example().save_tiny_qwen2(work / "model")
        for case in test_trl.MATCHED:
            options = case.values[0]
            for fused in (True, False):
                rlk_trl.FUSE_HEAD_AND_LOSS = fused
                with contextlib.redirect_stdout(sys.stderr):  # the trainers' step logs
                    expected = test_trl.run_grpo(model_dir, work / "trl", **options)
                    with rlk_trl.patched():
                        got = test_trl.run_grpo(
                            model_dir, work / "rlk",
                            start_from=None if free else expected["recorder"], **options)
                rows = test_trl.step_differences(expected, got)
                for step, row in enumerate(rows):
                    for column in COLUMNS:
                        cell = worst[options["loss_type"]][step]
                        cell[column] = max(cell[column], row.get(column, 0.0))
    print("| loss_type | step | loss | KL | grad norm | parameter gradients |")
    print("| --- | --- | --- | --- | --- | --- |")
    for loss_type in test_trl.LOSS_TYPES:
        for step, cell in enumerate(worst[loss_type]):
            values = " | ".join(f"{cell[column]:.1e}" for column in COLUMNS)
            print(f"| {loss_type} | {step} | {values} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
