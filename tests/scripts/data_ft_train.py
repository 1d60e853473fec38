"""A checkpointless job on the runtime's data path, for tests/runtime/test_data.py.

One replica group per launch agent (``tests/runtime/test_checkpointless.py``'s ``Job``). The
token file (``--corpus``) goes through ``hp.NodeCache``; the samples of each step are
``ElasticBatches``' plan (the global order, cut by the live replicas) read with
``TokenWindows.batch``: the data position is ``Checkpointless``' cursor, healed from a peer with
the model. After every committed step each group appends ``{"step": S, "group": G, "restart": I,
"replicas": N, "ids": [...]}`` (the sample ids this rank trained on) to
``<job_dir>/samples/group-<G>.jsonl``.
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import hyperpod_lab.runtime as hp
from hyperpod_lab.spec import CheckpointPolicy


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--corpus", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--step-sleep", type=float, default=0.0)
    a = p.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 16), torch.nn.Linear(16, 256))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with hp.init() as ctx:
        data = hp.TokenWindows(hp.NodeCache(ctx).fetch(a.corpus).path, a.seq_len)
        batches = hp.ElasticBatches(len(data), a.global_batch, a.micro_batch, seed=5, base_lr=1e-2)
        ft = hp.Checkpointless(ctx, model, opt, batches,
                               checkpoint=CheckpointPolicy(every_steps=10, keep_last=2, memory_every_steps=1))
        os.makedirs(os.path.join(ctx.job_dir, "samples"), exist_ok=True)
        log = open(os.path.join(ctx.job_dir, "samples", f"group-{ctx.replica_group}.jsonl"), "a")
        while ft.step < a.steps:
            plan = ft.begin_step()
            loss_sum = 0.0
            for mb in plan.micro_batches:
                b = data.batch(mb)
                loss = F.cross_entropy(model(b["x"]).reshape(-1, 256), b["y"].reshape(-1)) * plan.weight(len(mb))
                loss.backward()
                loss_sum += loss.item()
            if a.step_sleep:
                time.sleep(a.step_sleep)
            if ft.end_step(loss_sum):
                log.write(json.dumps({"step": plan.step, "group": ctx.replica_group, "restart": ctx.restart_count,
                                      "replicas": plan.replicas, "ids": list(plan.samples)}) + "\n")
                log.flush()
                ctx.step(plan.step, ft.loss, replicas=plan.replicas)
        log.close()
        ft.close()


if __name__ == "__main__":
    main()
