"""A small DDP job on the runtime's data path, for tests/runtime/test_data.py (gloo on CPU).

The token file (``--corpus``, on "shared storage") goes through ``hp.NodeCache``; the batches come
from ``hp.token_loader`` (torchdata ``StatefulDataLoader``, ``--num-workers`` processes), which is
part of the ``hp.TieredCheckpointer`` state (memory tier every ``--memory-every`` steps).

Each rank appends what it did to ``<job_dir>/samples/rank-<R>.jsonl``, one JSON object a line:
``{"restart": I, "cache": CacheReport}`` once per start, then ``{"restart": I, "step": S,
"ids": [...]}`` for every step it ran (after the optimizer step), and ``{"restart": I,
"restored": start}`` after the restore.

Options: ``--help``.

Fault injection (first start only, i.e. restart count 0): ``DATA_KILL_RANK=R`` and
``DATA_KILL_AT_STEP=S``: rank R waits for its pending snapshot, then SIGKILLs itself after step S.
"""

import argparse
import json
import os
import signal
import time

import torch
import torch.nn.functional as F

import hyperpod_lab.runtime as hp
from hyperpod_lab.spec import CheckpointPolicy


def main() -> None:
    p = argparse.ArgumentParser(description="A small DDP job on the runtime's data path.")
    p.add_argument("--corpus", required=True, help="the token file (uint8 tokens), read through hp.NodeCache")
    p.add_argument("--steps", type=int, default=16, help="steps to train")
    p.add_argument("--batch-size", type=int, default=4, help="sequences a rank per step")
    p.add_argument("--seq-len", type=int, default=32, help="tokens a sequence")
    p.add_argument("--num-workers", type=int, default=0, help="the loader's worker processes")
    p.add_argument("--seed", type=int, default=3, help="the global sample order's seed")
    p.add_argument("--memory-every", type=int, default=5, help="memory-tier checkpoint every K steps")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds after each step")
    p.add_argument("--no-loader-state", action="store_true",
                   help="leave the loader out of the checkpoint (the regression the tests guard against)")
    a = p.parse_args()

    with hp.init() as ctx:
        log_dir = os.path.join(ctx.job_dir, "samples")
        os.makedirs(log_dir, exist_ok=True)
        log = open(os.path.join(log_dir, f"rank-{ctx.rank}.jsonl"), "a")

        def record(**data) -> None:
            log.write(json.dumps({"restart": ctx.restart_count, **data}) + "\n")
            log.flush()

        cache = hp.NodeCache(ctx)
        report = cache.fetch(a.corpus)
        record(cache=report.to_dict())
        loader = hp.token_loader(ctx, report.path, a.seq_len, a.batch_size, seed=a.seed, num_workers=a.num_workers)

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(256, 16), torch.nn.Linear(16, 256))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        state = {"model": model, "optim": opt}
        if not a.no_loader_state:
            state["data"] = loader
        policy = CheckpointPolicy(every_steps=1000, keep_last=2, memory_every_steps=a.memory_every)
        ckpt = hp.TieredCheckpointer(ctx, state, policy)
        start = ckpt.restore()
        record(restored=start)
        ddp = torch.nn.parallel.DistributedDataParallel(model) if ctx.world_size > 1 else model

        kill_rank = os.environ.get("DATA_KILL_RANK")
        kill_step = int(os.environ.get("DATA_KILL_AT_STEP", "-1"))
        armed = ctx.restart_count == 0 and kill_rank is not None and int(kill_rank) == ctx.rank

        batches = iter(loader)
        for step in range(start, a.steps):
            batch = next(batches)
            logits = ddp(batch["x"])
            loss = F.cross_entropy(logits.reshape(-1, 256), batch["y"].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            record(step=step, ids=batch["id"].tolist())
            ctx.step(step, loss=loss.item())
            ckpt.maybe_save(step)
            if armed and step == kill_step:
                ckpt.wait()
                print(f"rank {ctx.rank}: SIGKILL after step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if a.sleep:
                time.sleep(a.sleep)
        log.close()
        ctx.finish()


if __name__ == "__main__":
    main()
