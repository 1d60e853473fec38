"""A 2-rank job for the log-triage tests: every rank prints the same lines (they collapse across
ranks), a line of its own, then steps ``--sleep`` seconds apart under the runtime (real
torch.distributed with gloo: an all-reduce per step). A fault comes from ``inject-fault --kind
exception`` (the runtime's step hook raises in the named rank)."""

import argparse
import os
import time

import torch
import torch.distributed as dist

import hyperpod_lab.runtime as hp

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--sleep", type=float, default=0.1)
a = p.parse_args()

with hp.init() as ctx:
    rank = int(os.environ.get("RANK", "0"))
    print("loading data...", flush=True)
    print("model: 2 layers, 1024 parameters", flush=True)
    print(f"rank {rank} says hello", flush=True)
    for step in range(a.steps):
        time.sleep(a.sleep)
        t = torch.ones(1)
        if dist.is_initialized():
            dist.all_reduce(t)
        print(f"step {step} world {int(t.item())}", flush=True)
        ctx.step(step, loss=1.0 / (step + 1))
    print("done", flush=True)
