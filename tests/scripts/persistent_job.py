"""A checkpointless job whose state does not depend on the number of replica groups (tests only).

``tests/runtime/test_persistent_per_job.py`` compares the persistent checkpoint a 2-group job
writes with a 1-group job's, byte for byte, so the state after a step must be the same bits
whatever the groups: the loss is linear in the parameters (``sum(model(x) * t)`` over a batch,
times ``1 / effective_batch``) with small-integer ``x`` and ``t``, so every gradient is a
small dyadic rational, summed exactly in any order (one group's micro-batches or two groups'
all-reduce), and Adam then does the same float operations on the same bits in every group.

Policy: persistent every ``--every`` steps, ``keep_last`` ``--keep``, memory tier every step,
S3 (``--s3-uri``) every ``--every`` steps. The final parameters of each group go to
``<job_dir>/final-group-<G>.pt``.
"""

import argparse
import os
import time

import torch

import hyperpod_lab.runtime as hp
from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches
from hyperpod_lab.runtime.checkpointless.ft import Checkpointless
from hyperpod_lab.spec import CheckpointPolicy


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--keep", type=int, default=20)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--s3-uri", default=None)
    a = p.parse_args()

    g = torch.Generator().manual_seed(1234)
    samples = 256
    X = torch.randint(-2, 3, (samples, 8), generator=g).to(torch.float32)
    T = torch.randint(-1, 2, (samples, 4), generator=g).to(torch.float32)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    with hp.init() as ctx:
        batches = ElasticBatches(samples, 32, 4, seed=7, base_lr=0.01, lr_rule="none")
        policy = CheckpointPolicy(every_steps=a.every, keep_last=a.keep, memory_every_steps=1,
                                  s3_uri=a.s3_uri, s3_every_steps=a.every if a.s3_uri else None)
        ft = Checkpointless(ctx, model, opt, batches, checkpoint=policy)
        while ft.step < a.steps:
            plan = ft.begin_step()
            for mb in plan.micro_batches:
                idx = torch.tensor(mb, dtype=torch.long)
                loss = (model(X[idx]) * T[idx]).sum() * (1.0 / plan.effective_batch)
                loss.backward()
            if a.step_sleep:
                time.sleep(a.step_sleep)
            if ft.end_step(0.0):
                ctx.step(ft.step - 1, 0.0, replicas=plan.replicas)
        torch.save({k: v.clone() for k, v in model.state_dict().items()},
                   os.path.join(ctx.job_dir, f"final-group-{ctx.replica_group}.pt"))
        ft.close()


if __name__ == "__main__":
    main()
