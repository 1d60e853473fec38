"""``hp.TieredCheckpointer``: memory, peer, persistent and S3 checkpoint tiers behind one object.

Tiers, fastest first:

========== ==================================================== ============================
tier       where                                                survives
========== ==================================================== ============================
memory     this node's ``/dev/shm`` (:mod:`.memory_tier`),       a crashed/killed process
           every ``memory_every_steps`` (default 5)
peer       the shm of ``replicas`` rank(s) on other nodes         the loss of a whole node
           (:mod:`.peer`), right after each memory snapshot       (its processes and its shm)
persistent DCP on shared storage (:class:`.Checkpointer`),        the loss of every node
           every ``every_steps`` (default 20)
s3         the persistent checkpoints uploaded by the           the loss of shared storage
           persistent tier (``policy.s3_uri``)
========== ==================================================== ============================

Typical use::

    with hp.init() as ctx:
        model = DDP(Net().to(ctx.device))
        opt = torch.optim.AdamW(model.parameters())
        state = {"model": model, "optim": opt, f"data-rank{ctx.rank}": loader_state}
        ckpt = hp.TieredCheckpointer(ctx, state)          # policy from the job spec
        for step in range(ckpt.restore(), total_steps):
            loss = train_step(...)
            ckpt.maybe_save(step)                         # each tier at its interval
            ctx.step(step, loss.item())

Restore (collective): every rank reports which complete snapshots its node holds (its own and
the replicas it keeps, all-gathered); the newest step S at which *every* rank's state is held by
a surviving node is chosen; a rank whose node holds its snapshot reads it from shared memory
(tier ``memory``), a rank whose node lost it receives it from the replica's holder over
``torch.distributed`` (tier ``peer``), with no storage read. Only when no such step exists
(both a rank's own snapshot and its replicas are gone), or the persistent tier holds a newer
checkpoint, the persistent tier restores (and it falls back to S3 itself). Each rank emits
``checkpoint.restored`` {tier, step, bytes, seconds, path, rank, node} for the memory and peer
tiers; the persistent tier emits its own (rank 0).

Overlap mode (``overlap=True``): ``save`` copies only the small state at once (module buffers,
extra state) and returns; parameters and optimizer state are copied in the background while the
next forward/backward run, and an optimizer step pre-hook waits for that copy, so the snapshot
is exactly the state at the saved step. Parameters must change only through the optimizers in
``state`` (no in-place edits between ``save`` and the next ``optimizer.step()``).

Shared memory is cleaned up by :meth:`TieredCheckpointer.close` when the job ends normally
(``ctx.finish``), and kept when it ends with an exception (the restarted process needs it).
Per rank it holds ``keep_last`` slots of its own snapshots plus ``keep_last`` slots per rank whose
replica it holds (``memory_bytes``; e.g. 2 x 22.4 MB + 2 x 22.4 MB for examples/train_lm.py's
1.85 M-parameter model with AdamW).

Events (a rank alone on its node writes its own): ``checkpoint.saved`` {tier: "memory", step,
bytes (snapshot size), blocked_s (seconds the training loop waited: the ``save`` call plus, in
overlap mode, the optimizer pre-hook's wait), total_s (to the commit), path, rank, node,
memory_bytes}; ``checkpoint.saved`` {tier: "peer", step, bytes, blocked_s: 0, total_s, path, rank
(the holder), of_rank, node, memory_bytes} by the rank that received and committed the replica.
Where a node holds several ranks (8 a node in the production shape), its lowest rank writes one
of each for the node instead (:mod:`~hyperpod_lab.runtime.checkpoint.node_saves`): memory
{step, bytes (the ranks' sum), ranks, rank_bytes, blocked_s (the reporter's), total_s (to the
last rank's commit), node, memory_bytes (the node's), missing_ranks when some did not commit};
peer {step, bytes, of_ranks, rank_bytes, total_s, node, memory_bytes, missing_of_ranks};
``checkpoint.failed`` {tier, step, reason, attempt, will_retry} when a memory save or a
replication failed (training goes on; after a failed round replication stops until the restart);
``checkpoint.restored`` as described above (peer: plus from_rank, from_node).

Environment:

================================= =============================================================
``HYPERPOD_LAB_SHM_DIR``          root of the memory tier (default ``/dev/shm/hyperpod-lab``)
``HYPERPOD_LAB_PEER_TIMEOUT_S``   timeout of each replication/restore transfer phase and of the
                                  replication group's collectives, seconds (default 120)
================================= =============================================================

Checkpointless jobs (``ctx.replica_group`` set, one TieredCheckpointer per replica group with
``replicas=0``): the memory tier stays per rank (``<node_dir>/replica-group-<G>/``), but the
persistent tier is one copy per job, in the ordinary layout (``<job_dir>/checkpoints/step-*``,
the same files a one-group job writes) and S3 uploads that one copy (``<s3_uri>/<job_id>/``).
The replica groups hold the same state after a committed step, so one group writes it: the
writer of a save is :func:`persistent_writer` (``sorted(members)[save_index % len(members)]``
over the committed step's live groups), so the writes rotate over the groups and a dead group
never blocks one (it is not a member). ``maybe_save`` needs those ``members``
(:class:`~hyperpod_lab.runtime.checkpointless.ft.Checkpointless` passes them). A writer that dies
mid-save leaves a directory without a commit marker, which no restore loads (the newest complete
step is used). Every group restores from that one copy, and also finds the per-group
``<job_dir>/checkpoints/replica-group-<G>/step-*`` of jobs written by earlier versions (the
newest complete step across both layouts); their S3 prefixes (``<s3_uri>/replica-group-<G>/``)
are not searched.

On the 2-node dev cluster both "nodes" are one host and share its ``/dev/shm``; the memory tier's
paths include the node name (``<shm_root>/<job_id>/<node>/...``) so that each "node" has its own,
and losing a node is played by deleting ``<shm_root>/<job_id>/<node>``.

Sharded state (FSDP2 ``fully_shard`` parameters and their optimizer state, any DTensor) is
snapshotted as each rank's local shards with their placement (:mod:`hyperpod_lab.runtime.state`);
FSDP1's ShardedTensor raises TypeError. Limits: with CUDA, replication runs over a second NCCL communicator from a background thread, concurrently
with the training loop's collectives.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hyperpod_lab.events import EventKind
from hyperpod_lab.jobdir import ENV_PEER_TIMEOUT, TIER_MEMORY, TIER_PEER, TIER_RANK
from hyperpod_lab.runtime.checkpoint.memory import MemoryTier, Snapshot
from hyperpod_lab.runtime.checkpoint.peer import (
    GlooTransport,
    Outgoing,
    PeerError,
    StagedTransport,
    exchange_snapshots,
    partner_map,
    sources_of,
)
from hyperpod_lab.runtime.checkpoint.persistent import Checkpointer
from hyperpod_lab.runtime.checkpoint.slots import Slot, SlotRing, own_dirname, parse_dirname, replica_dirname, shm_root
from hyperpod_lab.runtime.context import env_seconds, safe_name
from hyperpod_lab.runtime.state import KIND_OPTIMIZER, apply, classify, compatible, load_meta, unflatten
from hyperpod_lab.spec import CheckpointPolicy

if TYPE_CHECKING:  # pragma: no cover
    from hyperpod_lab.runtime.context import JobContext

DEFAULT_PEER_TIMEOUT_S = 120.0
DEFAULT_MEMORY_EVERY = 5
LEGACY_GROUP_DIRS = "replica-group-*"
"""Per-group persistent directories under ``<job_dir>/checkpoints`` of checkpointless jobs written
by hyperpod-lab before the one-copy-per-job layout (restore still reads them)."""


def persistent_writer(step: int, every_steps: int, members: "set[int] | list[int]") -> int:
    """The replica group that writes the persistent checkpoint of 0-based ``step`` (a step with
    ``(step + 1) % every_steps == 0``): ``sorted(members)[save_index % len(members)]`` with
    ``save_index = (step + 1) // every_steps - 1``. The same on every rank of every group (the
    committed step's members are all-reduced), and a rotation over the groups.

    Raises:
        ValueError: ``members`` is empty.
    """
    groups = sorted({int(m) for m in members})
    if not groups:
        raise ValueError("persistent_writer needs the committed step's replica groups, got none")
    return groups[((int(step) + 1) // int(every_steps) - 1) % len(groups)]


def _peer_timeout() -> timedelta:
    return timedelta(seconds=env_seconds(ENV_PEER_TIMEOUT, DEFAULT_PEER_TIMEOUT_S))


def _key(h: dict[str, Any]) -> tuple:
    return (h["node"], h["dir"], h["slot"], h["step"])


class TieredCheckpointer:
    """Checkpoints in memory, on peers, on shared storage and in S3, restored from the fastest.

    Construct it on every rank after building the model and optimizer (the constructor is
    collective: it creates a gloo process group for replication and all-gathers node names).

    Args:
        ctx: the job's :class:`~hyperpod_lab.runtime.context.JobContext`.
        state: what to protect, ``{name: nn.Module | Optimizer | Stateful | dict}``: e.g.
            ``{"model": model, "optim": opt, f"loader-rank{ctx.rank}": {"pos": 0}}``. Kept by
            reference: each save copies its current values. Give per-rank state per-rank keys
            (the persistent tier saves a key present on every rank once).
        policy: intervals and retention; default ``ctx.spec.checkpoint``, else
            ``CheckpointPolicy(every_steps=20, keep_last=2, memory_every_steps=5)``. A policy
            whose ``memory_every_steps`` is None gets 5. ``keep_last`` bounds both the
            persistent checkpoints and the memory slots (own and replica rings); 2 or more
            keeps a complete snapshot while the next one is being written.
        replicas: ranks on other nodes that hold a copy of each of this rank's snapshots
            (0 disables the peer tier; capped at nodes - 1, so 0 on a single node).
        overlap: copy parameters and optimizer state in the background (see the module
            docstring); needs an optimizer in ``state``.

    Attributes:
        memory: this rank's :class:`~hyperpod_lab.runtime.checkpoint.memory.MemoryTier`.
        persistent: the composed :class:`~hyperpod_lab.runtime.checkpoint.persistent.Checkpointer` (with
            an ``S3Tier`` when ``policy.s3_uri`` is set).
        partners: ranks holding this rank's replicas; sources: ranks whose replicas it holds.
        node_dir: ``<shm_root>/<job_id>/<node>``.

    Raises:
        TypeError: ``state`` holds an unsupported value.
        ValueError: ``replicas`` < 0, ``overlap`` without an optimizer, or a bad policy
            (``hyperpod_lab.errors.SpecError``) or ``$HYPERPOD_LAB_PEER_TIMEOUT_S``.
        hyperpod_lab.private_dir.PrivateDirError: the shared-memory root or a directory
            under it is not private (owned by another user, writable by others, or a link; the
            message names it and the fix).
        hyperpod_lab.runtime.checkpoint.auth.KeyFileError: the job's checkpoint key file is unusable.
        OSError: the shared-memory directory cannot be created.
    """

    def __init__(self, ctx: "JobContext", state: dict[str, Any], policy: CheckpointPolicy | None = None, *,
                 replicas: int = 1, overlap: bool = False):
        kinds = classify(state)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas must be a whole number >= 0, got {replicas!r}")
        optimizers = [v for k, v in state.items() if kinds[k] == KIND_OPTIMIZER]
        if overlap and not optimizers:
            raise ValueError("overlap=True needs an optimizer in state: its step pre-hook is where the "
                             "background copy is awaited")
        if policy is None:
            policy = ctx.spec.checkpoint if ctx.spec is not None else CheckpointPolicy(
                every_steps=20, keep_last=2, memory_every_steps=DEFAULT_MEMORY_EVERY)
        policy.validate()
        self.ctx, self.state, self.policy, self.overlap = ctx, state, policy, bool(overlap)
        self.memory_every_steps = policy.memory_every_steps or DEFAULT_MEMORY_EVERY
        self.keep_last = policy.keep_last
        self.timeout = _peer_timeout()
        self.rank, self.world_size = ctx.rank, ctx.world_size

        # checkpointless mode: one persistent copy per job, written by one replica group per save
        # (persistent_writer), in the ordinary layout; the memory tier stays per rank and group
        group = getattr(ctx, "replica_group", None)
        self.replica_group: int | None = None if group is None else int(group)
        group_dir = None if group is None else f"replica-group-{group}"
        shared = group is not None
        s3 = None
        if policy.s3_uri:
            from hyperpod_lab.runtime.checkpoint.s3 import S3Tier  # boto3 only when S3 is configured

            s3 = S3Tier(ctx, policy.s3_uri, policy.s3_every_steps, keep_last=policy.keep_last, shared=shared)
        extra: dict[str, Any] = {"s3": s3} if s3 is not None else {}
        if shared:
            extra.update(shared=True, legacy_glob=LEGACY_GROUP_DIRS)
        self.persistent = Checkpointer(ctx, every_steps=policy.every_steps, keep_last=policy.keep_last, **extra)

        # process groups: gloo for headers, layouts and agreement; the data group moves bytes
        self._ctl_group = self._data_group = None
        if self.world_size > 1:
            self._ctl_group = dist.new_group(backend="gloo", timeout=self.timeout)
            if ctx.device.type == "cuda":
                self._data_group = dist.new_group(backend="nccl", timeout=self.timeout)
                # NCCL needs every rank in a group's first call; replication/restore calls are pairwise
                dist.all_reduce(torch.zeros(1, device=ctx.device), group=self._data_group)
                self._data = StagedTransport(self._data_group, ctx.device)
            else:
                self._data_group = self._ctl_group
                self._data = GlooTransport(self._ctl_group)
            self._ctl = GlooTransport(self._ctl_group)
            nodes: list[Any] = [None] * self.world_size
            dist.all_gather_object(nodes, ctx.node, group=self._ctl_group)
        else:
            self._ctl = self._data = None  # type: ignore[assignment]
            nodes = [ctx.node]
        self.nodes: list[str] = [str(n) for n in nodes]
        self._partner_map = partner_map(self.nodes, replicas)
        self.partners = self._partner_map[self.rank]
        self.sources = sources_of(self._partner_map, self.rank)
        self.replicas = len(self.partners)
        self._reporter = min(r for r in range(self.world_size) if self.nodes[r] == ctx.node)
        # this world's ranks on this node: with more than one, the reporter writes one memory and
        # one peer checkpoint.saved for the node (node_saves), the others none
        self._local = [r for r in range(self.world_size) if self.nodes[r] == ctx.node]
        self._per_node = len(self._local) > 1
        self._node_reports: Any = None  # the reporter's one worker thread for them (never the training's)
        self._node_report: Any = None   # its newest report's future

        self.job_root = os.path.join(shm_root(), safe_name(ctx.job_id, 100))
        self.node_dir = os.path.join(self.job_root, safe_name(ctx.node))
        if group_dir is not None:
            self.node_dir = os.path.join(self.node_dir, group_dir)
        self.key = ctx.checkpoint_key
        self.memory = MemoryTier(os.path.join(self.node_dir, own_dirname(self.rank)), self.keep_last,
                                 rank=self.rank, world_size=self.world_size, job_id=ctx.job_id,
                                 pin_memory=ctx.device.type == "cuda", key=self.key)
        self._replica_rings: dict[int, SlotRing] = {}
        self._peer_broken: str | None = None
        self._hooks = [opt.register_step_pre_hook(self._pre_step) for opt in optimizers] if self.overlap else []
        self._closed = False
        ctx.register_checkpointer(self)

    # ---- saving -------------------------------------------------------------------------------
    def maybe_save(self, step: int, members: "set[int] | list[int] | None" = None) -> bool:
        """Save each tier whose interval ends at ``step``: memory (and peer) when
        ``(step + 1) % memory_every_steps == 0``, persistent when ``(step + 1) % every_steps == 0``
        (it uploads to S3 at its own interval). Collective: every rank, same steps.

        Args:
            step: 0-based step just completed.
            members: checkpointless mode only (and required there): the replica groups of the
                committed ``step``. Only :func:`persistent_writer`'s group writes the persistent
                checkpoint; the others wait for their own previous save, if any, and go on.

        Returns:
            Whether any tier started a save (on this rank).

        Raises:
            RuntimeError: the previous persistent save of this group failed (see
                :meth:`Checkpointer.save`).
            ValueError: checkpointless mode without ``members``.
        """
        step = int(step)
        mem = (step + 1) % self.memory_every_steps == 0
        if mem:
            self._memory_save(step)
        if (step + 1) % self.persistent.every_steps != 0:
            return mem
        if not self._writes_persistent(step, members):
            self.persistent.wait()  # another group writes this one; ours may still be in flight
            return mem
        self.persistent.save(step, self.state)
        return True

    def save(self, step: int, members: "set[int] | list[int] | None" = None) -> None:
        """Save every tier now, as the state after 0-based ``step``. Collective.

        Returns when the training loop may continue: the memory snapshot is copied (overlap
        mode: the small part only), its commit and the peer replication run in the background;
        the persistent tier has staged its copy and writes in the background. In checkpointless
        mode only the group ``sorted(members)[0]`` writes the persistent checkpoint.

        Raises:
            RuntimeError: the previous persistent save failed.
            ValueError: checkpointless mode without ``members``.
        """
        self._memory_save(int(step))
        if self.replica_group is not None and self._require(members) and self.replica_group != min(members):
            self.persistent.wait()
            return
        self.persistent.save(int(step), self.state)

    def _require(self, members: "set[int] | list[int] | None") -> bool:
        if not members:
            raise ValueError(
                "in a checkpointless job the persistent checkpoint is one copy per job, written by one replica "
                "group per save: pass members= (the replica groups of the committed step, as "
                "Checkpointless.end_step does) to maybe_save/save")
        return True

    def _writes_persistent(self, step: int, members: "set[int] | list[int] | None") -> bool:
        """Whether this rank's group writes the persistent checkpoint of ``step``."""
        if self.replica_group is None:
            return True
        self._require(members)
        return persistent_writer(step, self.persistent.every_steps, members) == self.replica_group

    def _memory_save(self, step: int) -> None:
        try:
            self.memory.wait()
        except RuntimeError:
            pass  # already reported by a checkpoint.failed event
        try:
            self.memory.snapshot(step, self.state, overlap=self.overlap, on_done=self._on_memory_done)
        except OSError as e:  # e.g. ENOSPC: the memory tier is an optimisation, training goes on
            self.ctx.emit(EventKind.CHECKPOINT_FAILED, tier=TIER_MEMORY, step=step,
                          reason=f"{type(e).__name__}: {e}", attempt=1, will_retry=True)
            self._replicate(step, None)  # keep the replication rounds matched

    def _pre_step(self, optimizer, args, kwargs) -> None:
        """Optimizer step pre-hook (overlap mode): the snapshot copy must finish first."""
        self.memory.wait_copy()

    def _on_memory_done(self, snap: Snapshot) -> None:
        """Background thread: report the memory snapshot, then replicate it."""
        if snap.error is not None:
            self.ctx.emit(EventKind.CHECKPOINT_FAILED, tier=TIER_MEMORY, step=snap.step,
                          reason=f"{type(snap.error).__name__}: {snap.error}", attempt=1, will_retry=True)
            self._replicate(snap.step, None)
            return
        if not self._per_node:
            self.ctx.emit(EventKind.CHECKPOINT_SAVED, tier=TIER_MEMORY, step=snap.step, bytes=snap.nbytes,
                          blocked_s=snap.blocked_s + snap.hook_wait_s, total_s=snap.total_s,
                          path=snap.slot.data_path, rank=self.rank, node=self.ctx.node, memory_bytes=self.memory_bytes)
        self._replicate(snap.step, snap)
        if self._per_node and self.rank == self._reporter:
            # on a thread of its own: waiting for a local rank that died or restarts in process
            # must not hold back the next snapshot, and so the training (wait() waits for it)
            if self._node_reports is None:
                from concurrent.futures import ThreadPoolExecutor

                self._node_reports = ThreadPoolExecutor(1, thread_name_prefix="hyperpod-node-saves")
            self._node_report = self._node_reports.submit(self._report_node_logged, snap.step,
                                                          snap.blocked_s + snap.hook_wait_s, snap.t0)

    def _report_node_logged(self, step: int, blocked_s: float, t0: float) -> None:
        try:
            self._report_node(step, blocked_s, t0)
        except Exception as e:  # an event, never the training's failure
            print(f"hyperpod-lab: node checkpoint report of step {step} failed: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)

    def _report_node(self, step: int, blocked_s: float, t0: float) -> None:
        """The node's reporter, on its own thread: one ``checkpoint.saved`` of tier memory for the
        node's ranks (``ranks``, ``rank_bytes``; ``bytes`` their sum, ``memory_bytes`` the node's
        shared memory for the job) once the node's slots hold every local rank's snapshot of
        the step, and one of tier peer for the replicas the node received (``of_ranks``), each
        with ``missing_ranks`` / ``missing_of_ranks`` when some did not come within the peer
        timeout (a rank died meanwhile: its own ``checkpoint.failed`` or fault says why)."""
        from hyperpod_lab.runtime.checkpoint.node_saves import held_bytes, wait_for_slots

        wait_s = min(60.0, self.timeout.total_seconds())
        own = {r: own_dirname(r) for r in self._local}
        mem, missing = wait_for_slots(self.node_dir, own, step, self.keep_last, self.key, wait_s)
        held = {r: replica_dirname(r) for r in sorted({s for r in self._local for s in sources_of(self._partner_map, r)})}
        peer, peer_missing = ({}, []) if not held or self._peer_broken else \
            wait_for_slots(self.node_dir, held, step, self.keep_last, self.key, wait_s)
        node_bytes = held_bytes(self.node_dir, [*own.values(), *held.values()])
        # the events name global ranks: this world's rank r is global rank base + r (a replica
        # group's ranks in a checkpointless job, base 0 otherwise)
        base = self.ctx.global_rank - self.rank
        ranks = sorted(mem)
        self.ctx.emit(EventKind.CHECKPOINT_SAVED, tier=TIER_MEMORY, step=step, bytes=sum(mem.values()),
                      blocked_s=blocked_s, total_s=time.monotonic() - t0, ranks=[base + r for r in ranks],
                      rank_bytes=[mem[r] for r in ranks], node=self.ctx.node, memory_bytes=node_bytes,
                      **({"missing_ranks": [base + r for r in missing]} if missing else {}))
        if peer:
            of = sorted(peer)
            self.ctx.emit(EventKind.CHECKPOINT_SAVED, tier=TIER_PEER, step=step, bytes=sum(peer.values()),
                          blocked_s=0.0, total_s=time.monotonic() - t0, of_ranks=[base + r for r in of],
                          rank_bytes=[peer[r] for r in of], node=self.ctx.node, memory_bytes=node_bytes,
                          **({"missing_of_ranks": [base + r for r in peer_missing]} if peer_missing else {}))

    def _replica_ring(self, src: int) -> SlotRing:
        ring = self._replica_rings.get(src)
        if ring is None:
            ring = SlotRing(os.path.join(self.node_dir, replica_dirname(src)), self.keep_last,
                            pin=self.ctx.device.type == "cuda", key=self.key)
            self._replica_rings[src] = ring
        return ring

    def _replicate(self, step: int, snap: Snapshot | None) -> None:
        """Background thread: one replication round (send to partners, receive from sources)."""
        if self._peer_broken is not None or (not self.partners and not self.sources):
            return
        t0 = snap.t0 if snap is not None else time.monotonic()
        out = Outgoing(snap.slot.data(snap.nbytes), snap.meta, snap.record) if snap is not None else None
        try:
            received = exchange_snapshots(self._ctl, self._data, [(p, out) for p in self.partners],
                                          [(s, self._replica_ring(s)) for s in self.sources],
                                          timeout=self.timeout, job_id=self.ctx.job_id, expect_step=step)
        except Exception as e:
            self._peer_broken = f"{type(e).__name__}: {e}"
            self.ctx.emit(EventKind.CHECKPOINT_FAILED, tier=TIER_PEER, step=step, reason=self._peer_broken[:500],
                          attempt=1, will_retry=False)
            return
        for rcv in received if not self._per_node else ():  # else the node's one event (_report_node)
            self.ctx.emit(EventKind.CHECKPOINT_SAVED, tier=TIER_PEER, step=rcv.record["step"],
                          bytes=rcv.record["nbytes"], blocked_s=0.0, total_s=time.monotonic() - t0,
                          path=rcv.slot.data_path, rank=self.rank, of_rank=rcv.src, node=self.ctx.node,
                          memory_bytes=self.memory_bytes)

    def wait(self) -> None:
        """Block until pending saves are committed: the memory snapshot with its replication,
        and the persistent checkpoint. A failed memory/peer save was reported by a
        ``checkpoint.failed`` event and is not raised.

        Raises:
            RuntimeError: the pending persistent save failed.
        """
        try:
            self.memory.wait()
        except RuntimeError:
            pass
        self._wait_node_report()
        self.persistent.wait()

    def _wait_node_report(self) -> None:
        """The reporter: wait for its newest node report (before the ranks' end-of-job barrier,
        after which they remove their slots). A report that failed was printed, never raised:
        training does not fail for an event."""
        fut, self._node_report = self._node_report, None
        if fut is None:
            return
        fut.result()  # (_report_node_logged raises nothing)

    @property
    def memory_bytes(self) -> int:
        """Bytes of shared memory used for this rank: its own slots plus the replicas it holds
        (at most ``keep_last`` x snapshot size x (1 + len(sources)))."""
        total = self.memory.memory_bytes
        for src in self.sources:
            ring = self._replica_rings.get(src)
            if ring is not None:
                total += ring.memory_bytes
            else:
                d = os.path.join(self.node_dir, replica_dirname(src))
                for i in range(self.keep_last):
                    try:
                        total += os.path.getsize(os.path.join(d, f"slot-{i}.bin"))
                    except OSError:
                        pass
        return total

    # ---- restore ------------------------------------------------------------------------------
    def restore(self) -> int:
        """Load the newest state complete on every rank into ``state``, from the fastest tier.

        Collective. Tries own memory and peer memory first (see the module docstring), then the
        persistent tier (which tries S3 when it has no checkpoint). A torn or checksum-failing slot is
        never used (the next older complete step is). Afterwards every node drops its snapshots
        newer than the restored step and those it no longer needs, so later saves start a
        single timeline.

        Returns:
            The step to train next: restored step + 1, or 0 when nothing was restored.

        Raises:
            RuntimeError: loading a snapshot into ``state`` failed on some rank (e.g. the model
                changed shape), or a collective failed (a peer died).
        """
        t0 = time.monotonic()
        self.wait()
        holdings = self._scan_node() if self.rank == self._reporter else []
        newest_persistent = None
        if self.rank == 0:
            complete = [s for s, _p, c in self.persistent.listing() if c]
            newest_persistent = complete[0] if complete else None
        infos = self._all_gather({"rank": self.rank, "holdings": holdings, "persistent": newest_persistent})
        newest_persistent = infos[0]["persistent"]
        all_holdings = [dict(h, holder=i["rank"]) for i in infos for h in i["holdings"]]
        excluded: set[tuple] = set()
        for _attempt in range(2 * self.keep_last * (1 + self.replicas) + 2):
            plan = self._plan(all_holdings, excluded)
            if plan is None or (newest_persistent is not None and newest_persistent > plan[0]):
                break
            step, assign = plan
            got = self._execute(step, assign, excluded)
            if got is None:
                continue
            slot, record, meta, tier, source = got
            error = None
            try:
                apply(self.state, unflatten(load_meta(meta), slot.data(record["nbytes"])))
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
            errors = self._all_gather(error)
            if any(errors):
                bad = next(i for i, e in enumerate(errors) if e)
                raise RuntimeError(f"restoring the memory snapshot of step {step} failed on rank {bad}: "
                                   f"{errors[bad]}")
            seconds = time.monotonic() - t0
            extra = {"from_rank": source["holder"], "from_node": source["node"]} if tier == TIER_PEER else {}
            self.ctx.emit(EventKind.CHECKPOINT_RESTORED, tier=tier, step=step, bytes=record["nbytes"],
                          seconds=seconds, path=slot.data_path, rank=self.rank, node=self.ctx.node, **extra)
            worst = max((t for t, _h in assign.values()), key=lambda t: TIER_RANK[t])
            self.ctx.note_restored(worst, step)
            self._after_restore(step)
            return step + 1
        start = self.persistent.restore(self.state)
        self._after_restore(start - 1)
        return start

    def _all_gather(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._ctl_group)
        return out

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self._ctl_group)

    def _scan_node(self) -> list[dict[str, Any]]:
        """Complete snapshots of this world size in this node's shm (own and replica dirs)."""
        out = []
        try:
            names = sorted(os.listdir(self.node_dir))
        except FileNotFoundError:
            return out
        for name in names:
            parsed = parse_dirname(name)
            if parsed is None or parsed[1] >= self.world_size:
                continue
            kind, r = parsed
            ring = SlotRing(os.path.join(self.node_dir, name), self.keep_last, create=False, key=self.key)
            for slot, rec, _meta in ring.complete():
                if rec["world_size"] != self.world_size or rec["rank"] != r:
                    continue
                if rec.get("job_id") not in (None, "", self.ctx.job_id):
                    continue
                out.append({"node": self.ctx.node, "dir": name, "slot": slot.index, "state_rank": r,
                            "step": int(rec["step"]), "nbytes": int(rec["nbytes"]), "own": kind == "own"})
            ring.close()
        return out

    def _plan(self, holdings: list[dict[str, Any]], excluded: set[tuple]
              ) -> tuple[int, dict[int, tuple[str, dict[str, Any]]]] | None:
        """The newest step every rank's state is held at, and where each rank gets it from:
        ``(step, {rank: (tier, holding)})``; None when there is no such step. Deterministic (every
        rank computes the same plan from the same all-gathered holdings)."""
        by_step: dict[int, dict[int, list[dict[str, Any]]]] = {}
        for h in holdings:
            if _key(h) not in excluded:
                by_step.setdefault(h["step"], {}).setdefault(h["state_rank"], []).append(h)
        for step in sorted(by_step, reverse=True):
            per = by_step[step]
            if any(r not in per for r in range(self.world_size)):
                continue
            assign = {}
            for r in range(self.world_size):
                cands = sorted(per[r], key=lambda h: (not h["own"], h["holder"], h["dir"], h["slot"]))
                local = [h for h in cands if h["node"] == self.nodes[r]]
                assign[r] = (TIER_MEMORY, local[0]) if local else (TIER_PEER, cands[0])
            return step, assign
        return None

    def _open(self, h: dict[str, Any]) -> tuple[Slot, dict[str, Any], bytes] | str:
        """The slot of holding ``h`` on this node, its record and meta, checksum-checked; or the reason not."""
        slot = Slot(os.path.join(self.node_dir, h["dir"]), h["slot"], key=self.key)
        rec = slot.read_record()
        if rec is None or rec["step"] != h["step"] or rec["rank"] != h["state_rank"]:
            return "the slot changed or lost its commit record"
        meta = slot.read_meta(rec)
        if meta is None:
            return "the layout file does not match its checksum"
        bad = slot.verify(rec)
        return bad if bad else (slot, rec, meta)

    def _execute(self, step: int, assign: dict[int, tuple[str, dict[str, Any]]], excluded: set[tuple]):
        """Verify the plan's sources, move what must move, agree. Returns
        ``(slot, record, meta, tier, source)`` for this rank, or None (``excluded`` grew: re-plan)."""
        tier, source = assign[self.rank]
        failures: list[tuple] = []
        mine = None
        if tier == TIER_MEMORY:
            got = self._open(source)
            if isinstance(got, str):
                failures.append(_key(source))
            else:
                reason = compatible(load_meta(got[2]), self.state)
                if reason:
                    failures.append(_key(source))
                mine = got
        sends = []
        for r, (t, h) in sorted(assign.items()):
            if t == TIER_PEER and h["holder"] == self.rank:
                got = self._open(h)
                if isinstance(got, str):
                    failures.append(_key(h))
                else:
                    sends.append((r, Outgoing(got[0].data(got[1]["nbytes"]), got[2], got[1])))
        if self._agree_failures(failures, excluded):
            return None
        if any(t == TIER_PEER for t, _h in assign.values()):
            recvs = [(source["holder"], self.memory.ring)] if tier == TIER_PEER else []
            try:
                received = exchange_snapshots(self._ctl, self._data, sends, recvs, timeout=self.timeout,
                                              job_id=self.ctx.job_id, expect_step=step,
                                              state_ranks={source["holder"]: self.rank}, replica=False)
                if tier == TIER_PEER:
                    rcv = received[0]
                    mine = (rcv.slot, rcv.record, rcv.meta)
                    if compatible(load_meta(rcv.meta), self.state):
                        failures.append(_key(source))
            except PeerError:
                failures.append(_key(source) if tier == TIER_PEER else ("send", self.rank))
            if self._agree_failures(failures, excluded):
                return None
        slot, record, meta = mine
        return slot, record, meta, tier, source

    def _agree_failures(self, failures: list[tuple], excluded: set[tuple]) -> bool:
        """All-gather the holdings that failed; add them to ``excluded``. True if any failed."""
        every = self._all_gather(failures)
        bad = {tuple(f) for fs in every for f in fs}
        excluded |= bad
        return bool(bad)

    def _after_restore(self, last_step: int) -> None:
        """Collective: the node's reporter invalidates snapshots newer than ``last_step`` (or of
        another world size) and removes the directories this node no longer needs."""
        self._barrier()
        if self.rank == self._reporter:
            try:
                names = os.listdir(self.node_dir)
            except FileNotFoundError:
                names = []
            node = self.ctx.node
            for name in names:
                parsed = parse_dirname(name)
                if parsed is None:
                    continue
                kind, r = parsed
                path = os.path.join(self.node_dir, name)
                if r >= self.world_size:
                    stale = True
                elif kind == "own":
                    stale = self.nodes[r] != node
                else:
                    stale = node not in {self.nodes[p] for p in self._partner_map[r]}
                if stale:
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    ring = SlotRing(path, self.keep_last, create=False, key=self.key)
                    ring.invalidate_from(last_step + 1, world_size=self.world_size)
                    ring.close()
        self._barrier()

    # ---- lifecycle ----------------------------------------------------------------------------
    def close(self, keep: bool | None = None) -> None:
        """Stop the background thread, remove the hooks, release shared memory. Idempotent.

        Args:
            keep: keep this rank's snapshots and held replicas in shared memory. Default: keep
                them only while an exception is propagating (a failing process's restart needs
                them); a normal end (``ctx.finish``) deletes them.
        """
        if self._closed:
            return
        self._closed = True
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if keep is None:
            keep = sys.exc_info()[0] is not None
        if not keep:
            try:
                self.memory.wait()
            except Exception:
                pass
            self._wait_node_report()
        if self._node_reports is not None:
            self._node_reports.shutdown(wait=False, cancel_futures=True)
        # a failing process must not linger on a background transfer to a dead peer
        self.memory.close(remove=not keep, timeout=2.0 if keep else 30.0)
        for src in self.sources:
            ring = self._replica_rings.pop(src, None) or SlotRing(
                os.path.join(self.node_dir, replica_dirname(src)), self.keep_last, create=False, key=self.key)
            ring.close() if keep else ring.remove()
        self._replica_rings.clear()
        if not keep:
            for d in (self.node_dir, self.job_root):
                try:
                    os.rmdir(d)
                except OSError:
                    pass
        self.persistent.close()
