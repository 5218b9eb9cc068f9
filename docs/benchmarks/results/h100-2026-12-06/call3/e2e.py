"""TRL's GRPOTrainer at one shape: train step and scoring, as is and patched (chunk budget
default and 256 MiB), plus the backbone alone (no head, no loss) so that step - body is the
LM head + loss share; median ms and peak GiB above the start."""
import json, os, statistics, sys, tempfile, time
from pathlib import Path
import torch
from rlk.bench.workloads import trl_grpo
from rlk.integrations import trl as rlk_trl

dev = torch.device("cuda")
model, length, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
work = Path(tempfile.mkdtemp())
trl_grpo.save_model(model, work / model)
grpo = trl_grpo.trainer(work / model, work / "out", length, batch, dev)
data = trl_grpo.scored_batch(grpo, 0)
ids = torch.cat([data["prompt_ids"], data["completion_ids"]], dim=1)
mask = torch.cat([data["prompt_mask"], data["completion_mask"]], dim=1)

def body_step():
    """The backbone's forward (checkpointed) and backward, the final norm included; no head."""
    grpo.model.train()
    with torch.autocast("cuda", dtype=torch.bfloat16):  # accelerate's, on the outer forward
        hidden = grpo.model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    hidden.float().sum().backward()
    grpo.model.zero_grad(set_to_none=True)

@torch.no_grad()
def body_score():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for m in (grpo.model, grpo.ref_model):
            m.model(input_ids=ids, attention_mask=mask)

def measure(fn, reps=5):
    fn(); torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(); start = torch.cuda.memory_allocated()
    times = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), (torch.cuda.max_memory_allocated() - start) / 2**30

def row(name, step, scoring, chunk="-"):
    r = dict(model=model, T=length, B=batch, impl=name, chunk_mb=chunk,
             step_ms=round(step[0], 1), step_gib=round(step[1], 3),
             score_ms=round(scoring[0], 1), score_gib=round(scoring[1], 3),
             step_tok_s=round(length * batch / step[0] * 1e3))
    print(json.dumps(r), flush=True)

for _ in range(2):
    rlk_trl.unpatch()
    row("body", measure(body_step), measure(body_score))
    for name, patched, chunk in (("trl", False, None), ("rlk", True, None), ("rlk", True, "512")):
        if chunk is None:
            os.environ.pop("RLK_CUDA_CHUNK_MB", None)
        else:
            os.environ["RLK_CUDA_CHUNK_MB"] = chunk
        (rlk_trl.patch if patched else rlk_trl.unpatch)()
        row(name, measure(lambda: trl_grpo.train_step(grpo, data)),
            measure(lambda: trl_grpo.score(grpo, data)), chunk or "default")
rlk_trl.unpatch()
