"""A small gloo DDP job for the Kubernetes stand-in's pods (self-contained: the EKS backend ships
only the script, in a ConfigMap). Each step prints ``step N loss X`` (the line the HyperPod log
rules watch) and reports it through the runtime; a persistent checkpoint every ``--every``
steps lets a restarted job resume. ``--secret NAME`` adds the SHA-256 of ``$NAME`` (never its
value) and whether it is set to step 0's event.

Options: --steps N (default 6), --sleep S seconds after each step (default 0.2), --every K
(default 2), --secret NAME (repeatable), --stop-file NAME: run past --steps until the file
``<job dir>/NAME`` exists (every rank agrees through an all-reduce), so a test can act mid-run.
"""

import argparse
import hashlib
import os
import socket
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import hyperpod_lab.runtime as hp

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--sleep", type=float, default=0.2)
p.add_argument("--every", type=int, default=2)
p.add_argument("--secret", action="append", default=[])
p.add_argument("--stop-file", default=None)
a = p.parse_args()

with hp.init() as ctx:
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"model": model, "optim": opt}
    ckpt = hp.Checkpointer(ctx, every_steps=a.every, keep_last=2, async_save=False)
    start = ckpt.restore(state)
    print(f"rank {ctx.rank}/{ctx.world_size} host {socket.gethostname()} start {start} "
          f"restart_count {ctx.restart_count}", flush=True)
    step = start
    while True:
        if step >= a.steps:
            stop = torch.tensor([1 if not a.stop_file or os.path.exists(os.path.join(ctx.job_dir, a.stop_file)) else 0])
            torch.distributed.all_reduce(stop, op=torch.distributed.ReduceOp.MAX)
            if stop.item():
                break
        g = torch.Generator().manual_seed(step * 100 + ctx.rank)
        x = torch.randn(8, 4, generator=g)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ckpt.maybe_save(step, state)
        extra = {}
        if step == start:
            extra = {**{f"sha256_{k}": hashlib.sha256(os.environ.get(k, "").encode()).hexdigest() for k in a.secret},
                     **{f"has_{k}": k in os.environ for k in a.secret}}
        ctx.step(step, loss.item(), **extra)
        if ctx.rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(a.sleep)
        step += 1
