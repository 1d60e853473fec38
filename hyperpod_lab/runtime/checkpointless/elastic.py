"""Elastic data parallelism: which samples each data-parallel replica takes at each step.

The global batch of a step is a fixed slice of a seeded sample order, independent of how many
replicas happen to be alive. Each participating replica takes an interleaved share of that
slice, splits it over its local ranks and walks it in micro-batches (gradient accumulation),
so the global batch size is kept whatever the number of replicas:

    micro_batch_size x accumulation_steps x replicas x local ranks >= global batch size

Sample order: epoch ``e`` is ``torch.randperm(dataset_size)`` seeded with ``seed + e``; a
cursor (samples consumed so far, part of the training state) walks the concatenation of the
epochs. Step ``s`` consumes ``[cursor, cursor + effective_batch)``, so no sample is skipped or
seen twice within an epoch, whatever the replicas did before (the cursor is restored with the
rest of the state after a failure).

When ``max_accumulation_steps`` caps the work of one replica (so that a step of a shrunken job
does not take many times longer), the effective batch shrinks and the learning rate follows
``lr_rule`` (see :func:`scaled_lr`).

This module is pure (no process groups); it imports torch only for the seeded permutation (and
:meth:`StepPlan.backward`'s index tensors).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import torch

LR_RULES = ("none", "linear", "sqrt")


def scaled_lr(base_lr: float, effective_batch: int, global_batch_size: int, rule: str) -> float:
    """The learning rate for an effective batch that differs from the configured global batch.

    Args:
        base_lr: learning rate tuned for ``global_batch_size``.
        effective_batch: samples actually reduced into this step's gradient (> 0).
        global_batch_size: the configured global batch size (> 0).
        rule: ``none`` (keep ``base_lr``), ``linear`` (scale by the batch ratio, Goyal et al.
            2017) or ``sqrt`` (scale by its square root, Krizhevsky 2014; common with Adam).

    Raises:
        ValueError: unknown rule or non-positive sizes.
    """
    if rule not in LR_RULES:
        raise ValueError(f"lr_rule must be one of {', '.join(LR_RULES)}, got {rule!r}")
    if effective_batch <= 0 or global_batch_size <= 0:
        raise ValueError("batch sizes must be positive")
    ratio = effective_batch / global_batch_size
    return base_lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]


@dataclass(frozen=True)
class StepPlan:
    """What one rank computes at one step.

    Attributes:
        step: 0-based optimizer step.
        replicas: data-parallel replicas (replica groups) taking part in this step.
        replica_rank: this replica's rank among them, 0 <= replica_rank < replicas.
        samples: dataset indices this rank processes (its share of the global batch).
        micro_batches: ``samples`` cut into micro-batches of at most ``micro_batch_size``.
        accumulation_steps: micro-batches per replica rank at this step (the largest share).
        effective_batch: samples in this step's gradient, all replicas together.
        global_batch_size: the configured global batch size.
        lr: learning rate for this step (``scaled_lr`` of the effective batch).
        cursor: samples consumed before this step (position in the epoch sequence).
    """

    step: int
    replicas: int
    replica_rank: int
    samples: tuple[int, ...]
    micro_batches: tuple[tuple[int, ...], ...]
    accumulation_steps: int
    effective_batch: int
    global_batch_size: int
    lr: float
    cursor: int

    def weight(self, n_samples: int) -> float:
        """Scale of a micro-batch's *mean* loss so that summing every rank's gradients gives the
        mean gradient over the effective batch: ``n_samples / effective_batch``."""
        return n_samples / self.effective_batch

    def backward(self, loss_fn: Callable[[torch.Tensor], torch.Tensor]) -> float:
        """Forward and backward of this rank's micro-batches (gradient accumulation): for each
        micro-batch ``mb`` of :attr:`micro_batches`, ``loss = loss_fn(idx) * self.weight(len(mb))``
        and ``loss.backward()``, ``idx`` its dataset indices (int64 tensor, shape ``(len(mb),)``).

        Args:
            loss_fn: a micro-batch's *mean* loss (a scalar tensor with its graph) from its indices,
                e.g. ``lambda idx: F.mse_loss(model(X[idx]), Y[idx])``.

        Returns:
            The sum of the weighted losses (float): this rank's ``loss_sum`` for
            ``Checkpointless.end_step``; summed over the job, the mean loss of the effective batch.
            0.0 when this rank has no micro-batch this step.
        """
        loss_sum = 0.0
        for mb in self.micro_batches:
            loss = loss_fn(torch.tensor(mb, dtype=torch.long)) * self.weight(len(mb))
            loss.backward()
            loss_sum += loss.item()
        return loss_sum

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("samples")
        d.pop("micro_batches")
        return d


class ElasticBatches:
    """Deterministic global batches, re-sharded over however many replicas are alive.

    Args:
        dataset_size: number of samples (> 0).
        global_batch_size: samples per optimizer step across all replicas (> 0).
        micro_batch_size: samples one rank processes per forward/backward (> 0).
        seed: seed of the sample order.
        base_lr: learning rate for the full global batch (only used for ``StepPlan.lr``).
        lr_rule: ``none``, ``linear`` or ``sqrt`` (see :func:`scaled_lr`).
        max_accumulation_steps: cap on micro-batches per rank per step; None keeps the global
            batch at any replica count.

    Raises:
        ValueError: a size is not a positive integer, or an unknown lr_rule.
    """

    def __init__(self, dataset_size: int, global_batch_size: int, micro_batch_size: int, *, seed: int = 0,
                 base_lr: float = 1.0, lr_rule: str = "linear", max_accumulation_steps: int | None = None):
        for name, v in (("dataset_size", dataset_size), ("global_batch_size", global_batch_size),
                        ("micro_batch_size", micro_batch_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if max_accumulation_steps is not None and (not isinstance(max_accumulation_steps, int)
                                                   or max_accumulation_steps <= 0):
            raise ValueError(f"max_accumulation_steps must be a positive integer or None, got {max_accumulation_steps!r}")
        if lr_rule not in LR_RULES:
            raise ValueError(f"lr_rule must be one of {', '.join(LR_RULES)}, got {lr_rule!r}")
        self.dataset_size, self.global_batch_size = dataset_size, global_batch_size
        self.micro_batch_size, self.seed = micro_batch_size, seed
        self.base_lr, self.lr_rule, self.max_accumulation_steps = base_lr, lr_rule, max_accumulation_steps
        self._perm: tuple[int, torch.Tensor] | None = None

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """The sample order of ``epoch`` (a permutation of ``range(dataset_size)``, int64)."""
        if self._perm is None or self._perm[0] != epoch:
            g = torch.Generator().manual_seed(self.seed + epoch)
            self._perm = (epoch, torch.randperm(self.dataset_size, generator=g))
        return self._perm[1]

    def effective_batch(self, replicas: int, local_world_size: int = 1) -> int:
        """Samples per step with ``replicas`` replicas of ``local_world_size`` ranks each."""
        if self.max_accumulation_steps is None:
            return self.global_batch_size
        cap = replicas * local_world_size * self.micro_batch_size * self.max_accumulation_steps
        return min(self.global_batch_size, cap)

    def positions(self, cursor: int, count: int) -> list[int]:
        """Dataset indices at sequence positions ``[cursor, cursor + count)``."""
        out: list[int] = []
        pos = cursor
        while len(out) < count:
            epoch, off = divmod(pos, self.dataset_size)
            take = min(count - len(out), self.dataset_size - off)
            out.extend(self.epoch_order(epoch)[off:off + take].tolist())
            pos += take
        return out

    def plan(self, step: int, cursor: int, replicas: int, replica_rank: int,
             local_rank: int = 0, local_world_size: int = 1, *, equal_micro_batches: bool = False) -> StepPlan:
        """This rank's share of step ``step``.

        Args:
            step: the optimizer step about to run.
            cursor: samples consumed before it (from the training state).
            replicas: participating replicas; replica_rank: this one's rank among them.
            local_rank, local_world_size: this rank inside its replica group.
            equal_micro_batches: give every rank exactly ``accumulation_steps`` micro-batches
                (this rank's samples cut into that many near-equal parts, each at most
                ``micro_batch_size``) instead of full micro-batches and a shorter last one. A
                sharded model (FSDP2) needs it: each forward/backward is a collective of the
                replica group, so its ranks must run the same number of them. The samples and
                their weights are the same either way.

        Raises:
            ValueError: ranks out of range; with ``equal_micro_batches``, a rank has fewer
                samples than ``accumulation_steps`` (it would need an empty micro-batch).
        """
        if replicas <= 0 or not 0 <= replica_rank < replicas:
            raise ValueError(f"replica_rank {replica_rank} is not in [0, {replicas})")
        if local_world_size <= 0 or not 0 <= local_rank < local_world_size:
            raise ValueError(f"local_rank {local_rank} is not in [0, {local_world_size})")
        eff = self.effective_batch(replicas, local_world_size)
        batch = self.positions(cursor, eff)
        shards = replicas * local_world_size
        mine = batch[replica_rank * local_world_size + local_rank::shards]
        m = self.micro_batch_size
        accumulation = math.ceil(math.ceil(eff / shards) / m)
        if not equal_micro_batches:
            micro = tuple(tuple(mine[i:i + m]) for i in range(0, len(mine), m))
        elif len(mine) < accumulation:
            raise ValueError(
                f"rank {local_rank} of replica {replica_rank} has {len(mine)} samples of step {step} for "
                f"{accumulation} micro-batches ({eff} samples over {replicas} replicas x {local_world_size} "
                f"ranks): a sharded model needs the same number of non-empty micro-batches on every rank; "
                f"use a global_batch_size that is a multiple of replicas x ranks, or a larger micro_batch_size")
        else:
            q, r = divmod(len(mine), accumulation)
            cuts = [i * q + min(i, r) for i in range(accumulation + 1)]
            micro = tuple(tuple(mine[cuts[i]:cuts[i + 1]]) for i in range(accumulation))
        lr = scaled_lr(self.base_lr, eff, self.global_batch_size, self.lr_rule)
        return StepPlan(step=step, replicas=replicas, replica_rank=replica_rank, samples=tuple(mine),
                        micro_batches=micro, accumulation_steps=accumulation, effective_batch=eff,
                        global_batch_size=self.global_batch_size, lr=lr, cursor=cursor)
