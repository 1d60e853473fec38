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
``hp.Checkpointless`` with ``hp.ElasticBatches``, see :mod:`hyperpod_lab.runtime.checkpointless.ft`.

Launch it with ``python -m hyperpod_lab.node.launch`` (torchrun plus fault/recovery events),
with plain ``torchrun``, or with plain ``python`` (a single-member job).

Modules, one idea each (the node-side processes, torch-free, are in :mod:`hyperpod_lab.node`):

============================= ================================================================
``context``                   ``init()`` and :class:`JobContext`: who this process is, its events,
                              the registry of checkpointers (``register_checkpointer``,
                              ``note_restored``)
``state``                     what a training state may hold (one classifier), its DCP and flat views
``tensorboard``               the step metrics as TensorBoard event files (JobSpec ``tensorboard``)
``checkpoint.persistent``     :class:`Checkpointer`, the persistent tier (DCP to ``<job_dir>/checkpoints``)
``checkpoint.format``         the persistent tier's on-disk format: step dirs, commit marker, CRC-32
``checkpoint.auth``           the job's checkpoint key: HMAC of markers, slot records and peer frames
``checkpoint.s3``             the S3 tier: uploads of committed checkpoints, the S3 link of the chain
``checkpoint.slots``          the memory tier's shared-memory slots (layout under /dev/shm, XXH3)
``checkpoint.memory``         :class:`MemoryTier`, the asynchronous snapshot engine
``checkpoint.peer``           replication of snapshots to other nodes (transports, placement)
``checkpoint.tiered``         :class:`TieredCheckpointer`: the tiers together, restore from the fastest
``checkpointless.ft``         :class:`Checkpointless` (torchft Manager: quorum, healing from a peer)
``checkpointless.elastic``    :class:`ElasticBatches`: the global-batch plan as replicas come and go
``data``                      the data path: :class:`TokenWindows` (memory-mapped token file),
                              :class:`GlobalOrderSampler` (checkpointed global order),
                              :func:`token_loader` (torchdata ``StatefulDataLoader``),
                              :class:`NodeCache` (per-node copy in ``/dev/shm``)
============================= ================================================================

Environment variable names and the job directory layout come from :mod:`hyperpod_lab.jobdir`.
This package never imports Jupyter, IPython or paramiko. Importing it imports nothing else: the
names below load their module (and torch) on first use (PEP 562), so ``python -m
hyperpod_lab.runtime.<shim>`` and the node-side tools never pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "init": "hyperpod_lab.runtime.context",
    "JobContext": "hyperpod_lab.runtime.context",
    "Checkpointer": "hyperpod_lab.runtime.checkpoint.persistent",
    "COMMIT_MARKER": "hyperpod_lab.runtime.checkpoint.format",
    "TieredCheckpointer": "hyperpod_lab.runtime.checkpoint.tiered",
    "Checkpointless": "hyperpod_lab.runtime.checkpointless.ft",
    "ElasticBatches": "hyperpod_lab.runtime.checkpointless.elastic",
    "StepPlan": "hyperpod_lab.runtime.checkpointless.elastic",
    "TokenWindows": "hyperpod_lab.runtime.data",
    "GlobalOrderSampler": "hyperpod_lab.runtime.data",
    "token_loader": "hyperpod_lab.runtime.data",
    "NodeCache": "hyperpod_lab.runtime.data",
    "CacheReport": "hyperpod_lab.runtime.data",
}
__all__ = ["init", "JobContext", "Checkpointer", "COMMIT_MARKER", "TieredCheckpointer", "Checkpointless",
           "ElasticBatches", "StepPlan", "TokenWindows", "GlobalOrderSampler", "token_loader", "NodeCache",
           "CacheReport"]

if TYPE_CHECKING:
    from hyperpod_lab.runtime.checkpoint.format import COMMIT_MARKER
    from hyperpod_lab.runtime.checkpoint.persistent import Checkpointer
    from hyperpod_lab.runtime.checkpoint.tiered import TieredCheckpointer
    from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches, StepPlan
    from hyperpod_lab.runtime.checkpointless.ft import Checkpointless
    from hyperpod_lab.runtime.context import JobContext, init
    from hyperpod_lab.runtime.data import CacheReport, GlobalOrderSampler, NodeCache, TokenWindows, token_loader


def __getattr__(name: str) -> Any:
    """PEP 562: ``hp.init`` etc. import their module at first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hyperpod_lab.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
