"""The in-job runtime: what a training script imports inside a hyperpod-lab job.

Typical use::

    import hyperpod_lab.runtime as hp

    with hp.init() as ctx:                      # process group, rank file, "started" event
        model = DDP(Net().to(ctx.device))
        opt = torch.optim.AdamW(model.parameters())
        ckpt = hp.Checkpointer(ctx)             # DCP to <job_dir>/checkpoints, every N steps
        state = {"model": model, "optim": opt}
        for step in range(ckpt.restore(state), total_steps):
            loss = train_step(...)
            ckpt.maybe_save(step, state)
            ctx.step(step, loss.item())         # rate-limited "step" events, recovery.completed
    # leaving the block: waits for async checkpoints, emits "finished", tears down the group

Checkpointless recovery and elastic data parallelism (``--recovery checkpointless``):
``hp.Checkpointless`` with ``hp.ElasticBatches``, see :mod:`hyperpod_lab.runtime.ft`.

Launch it with ``python -m hyperpod_lab.runtime.launch`` (torchrun plus fault/recovery events),
with plain ``torchrun``, or with plain ``python`` (a single-member job).

This package never imports Jupyter, IPython or paramiko; it imports torch.
"""

from hyperpod_lab.runtime.checkpoint import COMMIT_MARKER, Checkpointer
from hyperpod_lab.runtime.context import JobContext, init
from hyperpod_lab.runtime.elastic import ElasticBatches, StepPlan
from hyperpod_lab.runtime.ft import Checkpointless
from hyperpod_lab.runtime.tiered import TieredCheckpointer

__all__ = ["init", "JobContext", "Checkpointer", "COMMIT_MARKER", "TieredCheckpointer", "Checkpointless",
           "ElasticBatches", "StepPlan"]
