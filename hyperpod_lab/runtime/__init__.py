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

Modules, one idea each:

===================== ========================================================================
``context``           ``init()`` and :class:`JobContext`: who this process is, its events, the
                      registry of checkpointers (``register_checkpointer``, ``note_restored``)
``state``             what a training state may hold (one classifier), its DCP and flat views
``checkpoint_format`` the persistent tier's on-disk format: step dirs, commit marker, CRC-32
``checkpoint``        :class:`Checkpointer`, the persistent tier (DCP to ``<job_dir>/checkpoints``)
``s3tier``            the S3 tier: uploads of committed checkpoints, the S3 link of the restore chain
``slots``             the memory tier's shared-memory slots (layout under /dev/shm, records, XXH3)
``memory_tier``       :class:`~hyperpod_lab.runtime.memory_tier.MemoryTier`, the asynchronous
                      snapshot engine
``peer``              replication of snapshots to other nodes (transports, placement)
``tiered``            :class:`TieredCheckpointer`: the tiers together, restore from the fastest
``ft``                :class:`Checkpointless` (torchft); ``elastic``: the global-batch plan
``lighthouse``        the job's torchft Lighthouse; ``ft_local``: a checkpointless job on one machine
``launch``            the launch agent: torchrun plus fault/recovery events
``tensorboard``       the step metrics as TensorBoard event files (torch's SummaryWriter, JobSpec
                      ``tensorboard``; docs/tensorboard.md)
===================== ========================================================================

Environment variable names and the job directory layout come from :mod:`hyperpod_lab.jobdir`.
This package never imports Jupyter, IPython or paramiko; it imports torch.
"""

from hyperpod_lab.runtime.checkpoint import COMMIT_MARKER, Checkpointer
from hyperpod_lab.runtime.context import JobContext, init
from hyperpod_lab.runtime.elastic import ElasticBatches, StepPlan
from hyperpod_lab.runtime.ft import Checkpointless
from hyperpod_lab.runtime.tiered import TieredCheckpointer

__all__ = ["init", "JobContext", "Checkpointer", "COMMIT_MARKER", "TieredCheckpointer", "Checkpointless",
           "ElasticBatches", "StepPlan"]
