"""A tiny DDP job whose step events carry a loss and some metrics, for the metric sinks' tests
(TensorBoard: tests/runtime/test_tensorboard.py; MLflow: tests/runtime/test_mlflow_tracking.py).

Each step: a Linear(4, 1) on a seeded batch of 16 per rank, a checkpoint every 4 steps, and
``ctx.step(step, loss, lr=0.05, batch=16, tokens_per_s=1600.0, note="not a number")`` (the last
one is not a number: no sink may plot it). ``METRICS_TEST_STEPS`` steps (default 12), each
followed by ``METRICS_TEST_STEP_SLEEP`` seconds (default 0.02).
"""
import os
import time

import torch

import hyperpod_lab.runtime as hp

STEPS = int(os.environ.get("METRICS_TEST_STEPS", "12"))

with hp.init() as ctx:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = {"model": model, "optim": opt}
    ckpt = hp.Checkpointer(ctx, every_steps=4)
    for step in range(ckpt.restore(state), STEPS):
        g = torch.Generator().manual_seed(1000 * step + ctx.rank)
        x = torch.randn(16, 4, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        ckpt.maybe_save(step, state)
        ctx.step(step, loss.item(), lr=0.05, batch=16, tokens_per_s=1600.0, note="not a number")
        time.sleep(float(os.environ.get("METRICS_TEST_STEP_SLEEP", "0.02")))
