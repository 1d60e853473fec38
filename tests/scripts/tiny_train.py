"""A tiny deterministic DDP training script for the runtime tests (gloo on CPU).

Each step's batch is a pure function of (step, rank), so a run that is killed and resumed from
a checkpoint ends with exactly the parameters of an uninterrupted run of the same world size.

Options:
    --steps N       train steps 0..N-1 (default 40)
    --every K       checkpoint every K steps (default 5); --keep L keep L complete (default 2)
    --sleep S       seconds to sleep after each step (default 0.05)
    --sync          use dcp.save instead of dcp.async_save
    --dump          torch.save each rank's model/optimizer/per-rank state after every checkpoint
                    (<job_dir>/dumps/step-<S>-rank-<R>.pt), right after restore
                    (restored-rank-<R>.pt) and at the end (final-rank-<R>.pt)
"""

import argparse
import os
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import hyperpod_lab.runtime as hp


def snapshot(ctx, model, opt, local):
    return {"model": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
            "optim": opt.state_dict(), "local": {k: v.clone() for k, v in local.items()},
            "rank": ctx.rank}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--keep", type=int, default=2)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--sync", action="store_true")
    p.add_argument("--dump", action="store_true")
    a = p.parse_args()

    with hp.init() as ctx:
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        local = {"samples_seen": torch.zeros((), dtype=torch.int64)}  # per-rank state: per-rank key
        state = {"model": model, "optim": opt, f"rank{ctx.rank}": local}
        ckpt = hp.Checkpointer(ctx, every_steps=a.every, keep_last=a.keep, async_save=not a.sync)
        start = ckpt.restore(state)
        dumps = os.path.join(ctx.job_dir, "dumps")
        if a.dump:
            os.makedirs(dumps, exist_ok=True)
            torch.save(snapshot(ctx, model, opt, local), os.path.join(dumps, f"restored-rank-{ctx.rank}.pt"))
        print(f"rank {ctx.rank}/{ctx.world_size} restart_count={ctx.restart_count} start={start} "
              f"job_id={ctx.job_id} job_dir={ctx.job_dir}", flush=True)
        for step in range(start, a.steps):
            g = torch.Generator().manual_seed(1000 * step + ctx.rank)
            x = torch.randn(32, 8, generator=g)
            y = x.sum(dim=1, keepdim=True).sin()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            local["samples_seen"] += x.shape[0]
            if ckpt.maybe_save(step, state) and a.dump:
                torch.save(snapshot(ctx, model, opt, local), os.path.join(dumps, f"step-{step}-rank-{ctx.rank}.pt"))
            ctx.step(step, loss.item())
            time.sleep(a.sleep)
        if a.dump:
            torch.save(snapshot(ctx, model, opt, local), os.path.join(dumps, f"final-rank-{ctx.rank}.pt"))


if __name__ == "__main__":
    main()
