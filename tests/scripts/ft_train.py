"""A small deterministic data-parallel job for the checkpointless / elastic tests (tests only).

Regression on a fixed synthetic dataset with an MLP and Adam, through
``hyperpod_lab.runtime.checkpointless.ft.Checkpointless``: every committed step reports its loss (set
``HYPERPOD_LAB_STEP_EVENT_INTERVAL_S`` small for one ``step`` event per step); the final parameters
of each replica group go to ``<job_dir>/final-group-<G>.pt`` (written by the group's rank 0).
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import hyperpod_lab.runtime as hp
from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches
from hyperpod_lab.runtime.checkpointless.ft import Checkpointless
from hyperpod_lab.spec import CheckpointPolicy


def finish_step(ctx, ft, plan, loss_sum: float, step_sleep: float, record: bool = False) -> None:
    """Sleep ``step_sleep`` seconds (tests slow the job so faults land mid-run), then end the step;
    a committed step is reported as a ``step`` event and, with ``record``, its sample ids go to
    ``<job_dir>/samples/rank-<global rank>.jsonl`` ({step, samples})."""
    if step_sleep:
        time.sleep(step_sleep)
    if ft.end_step(loss_sum):
        ctx.step(ft.step - 1, ft.loss, replicas=plan.replicas, lr=plan.lr,
                 accumulation_steps=plan.accumulation_steps)
        if record:
            folder = os.path.join(ctx.job_dir, "samples")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"rank-{ctx.global_rank}.jsonl"), "a") as f:
                f.write(json.dumps({"step": plan.step, "samples": [int(i) for mb in plan.micro_batches for i in mb]})
                        + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--max-accumulation", type=int, default=None)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--lr-rule", default="linear")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--no-checkpoint", action="store_true")
    p.add_argument("--s3-uri", default=None, help="S3 tier of the fallback checkpoint (s3://bucket/prefix)")
    p.add_argument("--s3-every", type=int, default=None, help="S3 interval in steps (a multiple of 10)")
    p.add_argument("--bug-at-step", type=int, default=None, help="replica group --bug-group raises at this step, "
                   "every attempt (a persistent bug: in-process restarts make no progress)")
    p.add_argument("--bug-group", type=int, default=1)
    p.add_argument("--record-samples", action="store_true", help="write each committed step's sample ids")
    a = p.parse_args()

    g = torch.Generator().manual_seed(1234)
    X = torch.randn(a.samples, 16, generator=g)
    Y = torch.sin(X @ torch.randn(16, 1, generator=g)) + 0.05 * torch.randn(a.samples, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, a.width), torch.nn.Tanh(), torch.nn.Linear(a.width, 1))
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)

    with hp.init() as ctx:
        batches = ElasticBatches(a.samples, a.global_batch, a.micro_batch, seed=7, base_lr=a.lr,
                                 lr_rule=a.lr_rule, max_accumulation_steps=a.max_accumulation)
        policy = False if a.no_checkpoint else CheckpointPolicy(every_steps=10, keep_last=2, memory_every_steps=1,
                                                                s3_uri=a.s3_uri, s3_every_steps=a.s3_every)
        ft = Checkpointless(ctx, model, opt, batches, checkpoint=policy)
        while ft.step < a.steps:
            plan = ft.begin_step()
            loss_sum = 0.0
            with ft.recoverable():  # an exception here: the step is dropped everywhere and redone in this process
                if a.bug_at_step is not None and plan.step == a.bug_at_step and ctx.replica_group == a.bug_group:
                    raise RuntimeError(f"a bug that fails step {plan.step} every time (--bug-at-step)")
                loss_sum = plan.backward(lambda idx: F.mse_loss(model(X[idx]), Y[idx]))
            finish_step(ctx, ft, plan, loss_sum, a.step_sleep, a.record_samples)
        if ctx.rank == 0:  # one writer per replica group (its ranks hold the same parameters)
            final = os.path.join(ctx.job_dir, f"final-group-{ctx.replica_group}.pt")
            torch.save({k: v.clone() for k, v in model.state_dict().items()}, final + ".tmp")
            os.replace(final + ".tmp", final)
        ft.close()


if __name__ == "__main__":
    main()
