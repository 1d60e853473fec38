"""A tiny deterministic DDP training script for the runtime tests (gloo on CPU).

Each step's batch is a pure function of (step, rank) (see toy_training.py, shared with the other
test scripts), so a run that is killed and resumed from a checkpoint ends with exactly the
parameters of an uninterrupted run of the same world size.

Options:
    --steps N       train steps 0..N-1 (default 40)
    --every K       checkpoint every K steps (default 5); --keep L keep L complete (default 2)
    --sleep S       seconds to sleep after each step (default 0.05)
    --sync          use dcp.save instead of dcp.async_save
    --dump          torch.save each rank's model/optimizer/per-rank state after every checkpoint
                    (<job_dir>/dumps/step-<S>-rank-<R>.pt), right after restore
                    (restored-rank-<R>.pt) and at the end (final-rank-<R>.pt)
"""

import os
import time

import torch
from toy_training import arg_parser, export, mlp, regression_step, setup

import hyperpod_lab.runtime as hp


def main():
    p = arg_parser(steps=40, every=5, sleep=0.05)
    p.add_argument("--sync", action="store_true")
    p.add_argument("--dump", action="store_true")
    a = p.parse_args()

    with hp.init() as ctx:
        model, opt, local, state = setup(ctx, mlp)  # per-rank state under a per-rank key
        ckpt = hp.Checkpointer(ctx, every_steps=a.every, keep_last=a.keep, async_save=not a.sync)
        start = ckpt.restore(state)
        dumps = os.path.join(ctx.job_dir, "dumps")
        if a.dump:
            os.makedirs(dumps, exist_ok=True)
            torch.save(export(ctx, model, opt, local), os.path.join(dumps, f"restored-rank-{ctx.rank}.pt"))
        print(f"rank {ctx.rank}/{ctx.world_size} restart_count={ctx.restart_count} start={start} "
              f"job_id={ctx.job_id} job_dir={ctx.job_dir}", flush=True)
        for step in range(start, a.steps):
            loss = regression_step(ctx, step, model, opt, local)
            if ckpt.maybe_save(step, state) and a.dump:
                torch.save(export(ctx, model, opt, local), os.path.join(dumps, f"step-{step}-rank-{ctx.rank}.pt"))
            ctx.step(step, loss.item())
            time.sleep(a.sleep)
        if a.dump:
            torch.save(export(ctx, model, opt, local), os.path.join(dumps, f"final-rank-{ctx.rank}.pt"))


if __name__ == "__main__":
    main()
