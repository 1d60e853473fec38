"""A small DDP job (gloo on CPU) for the hang and straggler tests and benchmarks/hang_detection.py.

Each step: a forward/backward of a tiny MLP through DistributedDataParallel (a real gradient
all-reduce across the ranks, whose wait ``ctx.watch_ddp`` measures), ``--sleep`` seconds of
"compute" inside a ``compute`` section, an optimizer step and ``ctx.step``. With ``--every K`` it
checkpoints to the persistent tier every K steps and resumes from the newest checkpoint after a
restart. Standalone (the backends stage the script file alone). Options: ``--help``.
"""

import argparse
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import hyperpod_lab.runtime as hp


def main():
    p = argparse.ArgumentParser(description="A small DDP job for the hang and straggler tests.")
    p.add_argument("--steps", type=int, default=100, help="steps to train (default %(default)s)")
    p.add_argument("--sleep", type=float, default=0.05,
                   help='seconds of "compute" in each step\'s compute section (default %(default)s)')
    p.add_argument("--every", type=int, default=0, help="checkpoint every K steps (default 0: never)")
    p.add_argument("--no-watch-ddp", action="store_true",
                   help="no wait measurement: every rank's compute_s is its whole step")
    a = p.parse_args()

    with hp.init() as ctx:
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
        if not a.no_watch_ddp:
            ctx.watch_ddp(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        state = {"model": model, "optim": opt}
        start = 0
        ckpt = None
        if a.every:
            ckpt = hp.Checkpointer(ctx, every_steps=a.every, keep_last=2)
            start = ckpt.restore(state)
        g = torch.Generator().manual_seed(ctx.rank)
        for step in range(start, a.steps):
            x = torch.randn(32, 8, generator=g)
            with ctx.section("compute"):
                loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
                time.sleep(a.sleep)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if ckpt is not None:
                ckpt.maybe_save(step, state)
            ctx.step(step, loss.item())


if __name__ == "__main__":
    main()
