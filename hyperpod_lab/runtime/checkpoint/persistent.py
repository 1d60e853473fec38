"""The persistent checkpoint tier: torch.distributed.checkpoint (DCP) to the job directory.

:class:`Checkpointer` saves to ``<job_dir>/checkpoints/step-XXXXXXXX/`` (the format, the commit
marker and the integrity checks are :mod:`hyperpod_lab.runtime.checkpoint.format`; its public
names are importable from here too).

Commit: rank 0 writes the marker only after DCP's save returned, which happens on every rank
after every rank's data files were written and fsynced and the ``.metadata`` file was written
(DCP's coordinator gathers all ranks' write results before it finishes). A save killed half-way
therefore leaves a directory without a marker, which :meth:`Checkpointer.restore` never loads.
The checksums are computed after DCP's save returned: each rank hashes the data files it wrote
itself, in parallel and while they are still in its page cache, and sends the result to rank 0
(one ``gather_object``); rank 0 hashes the rest (``.metadata``, any file no rank claimed),
writes the marker and broadcasts the outcome.

Restore: :meth:`Checkpointer.restore` authenticates the commit marker (HMAC-SHA256 under the
job's checkpoint key, :func:`~hyperpod_lab.runtime.checkpoint.format.authenticate_marker`) and
verifies sizes, CRC-32s and SHA-256s before loading (DCP unpickles ``.metadata``, so nothing may
reach it unauthenticated): the files are
split between the ranks by size, each rank verifies its share, and the verdicts are all-gathered,
so every file is read once and every rank agrees on the outcome. A missing, truncated or altered
file makes the whole step skipped (``checkpoint.corrupt`` naming the file) and the next older
complete step is tried; nothing is loaded from a checkpoint that failed verification, and a load
goes into scratch copies applied only when every rank succeeded, so a partial checkpoint is never
loaded.

Saving is asynchronous by default (``dcp.async_save``, thread executor, on the context's gloo
``cpu_group`` so the background collectives never interleave with the training loop's DDP
collectives on the default group). The training thread is blocked only while the state is
*staged* (copied into CPU buffers that are allocated once and reused), not while it is written
or hashed. Staging is synchronous on purpose: asynchronous staging would let the next optimizer
step mutate parameters while they are being copied. A new save first waits for the previous one
(the staging buffers are reused).

With an :class:`~hyperpod_lab.runtime.checkpoint.s3.S3Tier` (``Checkpointer(ctx, s3=tier)``), rank 0
hands every committed checkpoint to ``tier.maybe_upload`` (which uploads every
``tier.every_steps`` steps, in the background), retention keeps directories still queued for
upload, and :meth:`Checkpointer.restore` falls back to the newest complete S3 step
(:meth:`S3Tier.restore_into <hyperpod_lab.runtime.checkpoint.s3.S3Tier.restore_into>`) when no local
checkpoint loads.

Shared root (``shared=True``, checkpointless jobs): the replica groups of a job take turns
writing into one root (:class:`~hyperpod_lab.runtime.checkpoint.tiered.TieredCheckpointer` picks
the writing group of each save), so another group's save may still be in flight when this group
commits: retention then deletes an incomplete directory only when it is older than the previous
save interval (``step < newest complete - every_steps``); every group waits for its own pending
save at each save point (:meth:`wait`), so such a directory's writer has finished or is gone.
With ``legacy_glob``, :meth:`restore` also considers the ``step-*`` directories of the
subdirectories matching it (the per-group ``replica-group-<G>/`` of jobs written by hyperpod-lab
before the shared root), newest complete step first across both layouts; saves and retention
never touch them.

What a state may hold: :mod:`hyperpod_lab.runtime.state`. Per-rank state: DCP deduplicates by
key, so a plain tensor stored under the same key on every rank is saved once (rank 0's copy).
Give per-rank state (RNG, data-loader position) per-rank keys, e.g.
``state[f"rng-rank{ctx.rank}"] = {...}``.
"""

from __future__ import annotations

import glob
import os
import shutil
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hyperpod_lab.events import EventKind
from hyperpod_lab.jobdir import TIER_PERSISTENT, TIER_S3
from hyperpod_lab.runtime.checkpoint.format import (
    COMMIT_MARKER,
    METADATA_FILE,
    authenticate_marker,
    check_file,
    dir_bytes,
    hash_rank_files,
    hash_remaining,
    list_checkpoints,
    partition_files,
    read_marker,
    set_aside,
    short_error,
    state_mismatch,
    step_dir_name,
    write_marker,
)
from hyperpod_lab.runtime.state import copy_into, to_dcp

if TYPE_CHECKING:  # pragma: no cover
    from hyperpod_lab.runtime.checkpoint.s3 import S3Tier
    from hyperpod_lab.runtime.context import JobContext

__all__ = ["Checkpointer"]


def _empty_like_tree(obj: Any) -> Any:
    """A structure like ``obj`` with every plain tensor replaced by an uninitialised CPU tensor of
    the same shape and dtype (DTensors keep their placement); other leaves are kept."""
    if isinstance(obj, torch.Tensor):
        if type(obj) is torch.Tensor or isinstance(obj, torch.nn.Parameter):
            return torch.empty_like(obj, device="cpu")
        return torch.empty_like(obj)
    if isinstance(obj, dict):
        return {k: _empty_like_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_empty_like_tree(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_empty_like_tree(v) for v in obj)
    return obj


def thread_read_bytes() -> int | None:
    """Bytes the calling thread has read through read(2)-family system calls so far (``rchar``
    of ``/proc/thread-self/io``, Linux: the bytes its read calls returned, whether the page
    cache served them or not, a byte read twice counting twice), or None where the kernel does
    not say. A restore's difference of two readings is what it read from storage
    (``checkpoint.restored.read_bytes``)."""
    try:
        with open("/proc/thread-self/io", "rb") as f:
            for line in f:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None



class Checkpointer:
    """Persistent-tier checkpoints of a job with DCP, asynchronous, committed, verified, retained.

    Construct it on every rank (it is collective only in :meth:`restore`, :meth:`save`,
    :meth:`maybe_save`, which every rank must call with the same step).

    Args:
        ctx: the job's :class:`~hyperpod_lab.runtime.context.JobContext`.
        every_steps: save when ``(step + 1) % every_steps == 0``; default
            ``ctx.spec.checkpoint.every_steps``, else 20.
        keep_last: complete checkpoints to keep; default ``ctx.spec.checkpoint.keep_last``, else 2.
        async_save: write in a background thread (``dcp.async_save``); False uses ``dcp.save``
            and blocks until written.
        root: checkpoint directory; default ``<job_dir>/checkpoints``.
        s3: an :class:`~hyperpod_lab.runtime.checkpoint.s3.S3Tier` (constructed on every rank): rank 0
            offers each committed checkpoint to ``s3.maybe_upload``, and :meth:`restore` falls
            back to S3 when no local checkpoint loads. None (the default): no S3 tier.
        shared: ``root`` is written in turn by several replica groups (see the module
            docstring): retention keeps incomplete directories of the last save interval.
        legacy_glob: a glob pattern relative to ``root`` (e.g. ``"replica-group-*"``) of
            directories whose ``step-*`` checkpoints :meth:`restore` also considers.

    Raises:
        ValueError: ``every_steps`` or ``keep_last`` is not a whole number >= 1.
    """

    def __init__(self, ctx: "JobContext", every_steps: int | None = None, keep_last: int | None = None,
                 *, async_save: bool = True, root: str | None = None, s3: "S3Tier | None" = None,
                 shared: bool = False, legacy_glob: str | None = None):
        policy = ctx.spec.checkpoint if ctx.spec is not None else None
        self.every_steps = every_steps if every_steps is not None else (policy.every_steps if policy else 20)
        self.keep_last = keep_last if keep_last is not None else (policy.keep_last if policy else 2)
        for name, v in (("every_steps", self.every_steps), ("keep_last", self.keep_last)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Checkpointer {name} must be a whole number >= 1, got {v!r}")
        self.ctx = ctx
        self.root = root or ctx.paths.checkpoints
        self.async_save = async_save
        self.s3 = s3
        self.shared, self.legacy_glob = bool(shared), legacy_glob
        self._pg = ctx.cpu_group
        self._stager = None
        self._pending: tuple[int, threading.Event] | None = None  # (step, set when committed/failed)
        self._pending_error: BaseException | None = None
        self.last_saved_step: int | None = None  # newest step committed by this process
        os.makedirs(self.root, exist_ok=True)
        # ctx.finish waits for its checkpointers in order: the S3 tier after this one, whose last
        # commit may still enqueue an upload
        ctx.register_checkpointer(self, before=s3)

    # ---- collectives on the checkpoint group ------------------------------------------------
    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (collective on the checkpoint group; picklable objects).

        Raises:
            RuntimeError: a peer died (the group's timeout, ``$HYPERPOD_LAB_CHECKPOINT_TIMEOUT_S``).
        """
        if self.ctx.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._pg)
        return box[0]

    def _all_gather(self, obj: Any) -> list[Any]:
        if self.ctx.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(out, obj, group=self._pg)
        return out

    # ---- restore ------------------------------------------------------------------------
    def listing(self) -> list[tuple[int, str, bool]]:
        """The checkpoints :meth:`restore` considers, newest first: ``[(step, path, complete)]``
        of ``root`` and, with ``legacy_glob``, of the directories matching it (at the same step,
        ``root``'s first, then the legacy directories in name order). Local, not collective."""
        entries = [(step, 0, path, complete) for step, path, complete in list_checkpoints(self.root)]
        if self.legacy_glob:
            legacy = sorted(d for d in glob.glob(os.path.join(glob.escape(self.root), self.legacy_glob))
                            if os.path.isdir(d) and not os.path.islink(d))
            for i, d in enumerate(legacy, 1):
                entries += [(step, i, path, complete) for step, path, complete in list_checkpoints(d)]
        entries.sort(key=lambda e: (-e[0], e[1]))
        return [(step, path, complete) for step, _order, path, complete in entries]

    def restore(self, state: dict[str, Any]) -> int:
        """Load the newest complete, intact checkpoint into ``state``, in place.

        Walks the checkpoint directories newest first (rank 0's :meth:`listing` and markers,
        broadcast; with ``legacy_glob`` the older layout's directories too).
        A directory without the commit marker is skipped; a committed one is authenticated first
        (the marker's HMAC under ``ctx.checkpoint_key``, then size, CRC-32 and SHA-256 of every
        file it lists, the files split between the ranks) and only then loaded; an unsigned,
        tampered or foreign-key checkpoint is skipped with ``checkpoint.corrupt`` whose reason
        says "authentication failed"; one that fails verification is skipped
        too (and renamed ``corrupt-step-...`` so a later save of that step starts clean). Each
        skip emits ``checkpoint.corrupt`` {tier: "persistent", step, path: the file at fault
        (the missing marker or the bad shard), reason} on rank 0, and the skipped directories
        newer than the one loaded are removed. A checkpoint that verified but whose load fails
        on any rank (it does not fit ``state``) raises :class:`CheckpointStateMismatch`: its
        files are intact, so it is not skipped for an older one. The load
        goes into scratch copies applied only when every rank succeeded, so a failed attempt
        leaves ``state`` untouched.

        When no local checkpoint loads and the Checkpointer has an S3 tier, rank 0 downloads the
        newest complete S3 step into ``<root>/step-XXXXXXXX/`` (files verified against the
        marker, the marker written last) and every rank loads it; a step that fails to download
        or verify emits ``checkpoint.corrupt`` {tier: "s3", path: the S3 key} and the next older
        S3 step is tried. Success emits ``checkpoint.restored`` {tier, step, bytes, seconds
        (verification, download and load), path (the local directory, or the S3 URI of the
        step for tier "s3"), local_path (tier "s3" only)}. Collective: call it on every rank.

        Args:
            state: ``{name: nn.Module | Optimizer | Stateful | dict of tensors/numbers}``, the same
                names as when saving. An optimizer is saved by parameter FQN of the module in
                ``state`` that owns its parameters.

        Returns:
            The step to train next: last saved step + 1, or 0 when no checkpoint loaded.

        Raises:
            TypeError: ``state`` holds an unsupported value.
            RuntimeError: a collective failed (a peer died) while agreeing on the result.
            CheckpointStateMismatch: the newest intact checkpoint (local, or downloaded from S3)
                does not fit ``state``; nothing was changed.
        """
        adapters = to_dcp(state)
        self.wait()
        step = self._restore_local(adapters)
        tier = TIER_PERSISTENT
        if step is None and self.s3 is not None:
            step, tier = self.s3.restore_into(self, adapters), TIER_S3
        if step is None:
            self.ctx.note_restored(None)
            return 0
        self.ctx.note_restored(tier, step)
        self.last_saved_step = step
        return step + 1

    def _restore_local(self, adapters: dict[str, Any]) -> int | None:
        """Collective: load the newest complete, intact local checkpoint (see :meth:`restore`).
        Returns its step, or None when none loaded."""
        listing = None
        if self.ctx.rank == 0:
            listing = []
            for step, path, complete in self.listing():
                marker, marker_error = None, None
                if complete:
                    try:
                        marker = read_marker(path)
                        marker_error = authenticate_marker(marker, self.ctx.checkpoint_key, step)
                    except (OSError, ValueError) as e:
                        marker_error = str(e) if isinstance(e, ValueError) else f"commit marker unreadable: {e}"
                    if marker_error is not None:
                        marker = None  # never sent on: nothing of it is used
                listing.append((step, path, complete, marker, marker_error))
        candidates = self.broadcast(listing)
        read0 = thread_read_bytes()  # bytes read from storage: verification and load, every rank
        skipped: list[tuple[str, bool]] = []  # (path, committed)
        for step, path, complete, marker, marker_error in candidates:
            t0 = time.monotonic()
            if not complete:
                self._corrupt(step, os.path.join(path, COMMIT_MARKER), "no commit marker (the save did not finish)")
                skipped.append((path, False))
                continue
            if marker_error is not None:
                self._corrupt(step, os.path.join(path, COMMIT_MARKER), marker_error)
                skipped.append((path, True))
                continue
            bad = self._verify(path, marker["files"])  # authenticated: lists every file with its sha256
            if bad is not None:
                self._corrupt(step, os.path.join(path, bad[0]), bad[1])
                skipped.append((path, True))
                continue
            error = self.load_dir(adapters, path)
            if error is not None:  # intact files that do not fit the state: the user's to decide
                raise state_mismatch(step, path, error)
            seconds = time.monotonic() - t0
            read1 = thread_read_bytes()
            read = torch.tensor([read1 - read0 if read0 is not None and read1 is not None else -1], dtype=torch.int64)
            if self.ctx.world_size > 1:  # every rank's reads; -1 (unknown) anywhere makes the sum unknown
                unknown = (read < 0).to(torch.int64)
                dist.all_reduce(read, group=self._pg)
                dist.all_reduce(unknown, group=self._pg)
                read = torch.tensor([-1]) if unknown.item() else read
            if self.ctx.rank == 0:
                self._remove_skipped(skipped)
                nbytes = marker.get("bytes") if isinstance(marker.get("bytes"), int) else dir_bytes(path)
                self.ctx.emit(EventKind.CHECKPOINT_RESTORED, tier=TIER_PERSISTENT, step=step, bytes=nbytes,
                              seconds=seconds, path=path, read_bytes=int(read.item()) if read.item() >= 0 else None)
            return step
        if self.ctx.rank == 0:
            self._remove_skipped(skipped)
        return None

    def _verify(self, path: str, files: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
        """Collective: each rank checks its share of ``files``; returns the first failure in
        rank order, ``(relative path, reason)``, the same on every rank, or None."""
        mine = partition_files(files, self.ctx.world_size)[self.ctx.rank]
        bad = None
        for rel in mine:
            reason = check_file(path, rel, files[rel])
            if reason is not None:
                bad = (rel, reason)
                break
        return next((b for b in self._all_gather(bad) if b is not None), None)

    def load_dir(self, dcp_state: dict[str, Any], path: str) -> str | None:
        """Load the checkpoint directory ``path`` into scratch copies, agree across ranks, and
        apply them to ``dcp_state`` only when every rank succeeded (a failed attempt leaves the
        state untouched). Verifies nothing: check the files first. Collective.

        Args:
            dcp_state: :func:`hyperpod_lab.runtime.state.to_dcp` of the training state.
            path: a DCP checkpoint directory.

        Returns:
            None on success, else the reason (the same on every rank).

        Raises:
            RuntimeError: a peer died while the ranks agreed.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        error: str | None = None
        scratch: dict[str, Any] = {}
        try:
            for key, value in dcp_state.items():
                scratch[key] = _empty_like_tree(value if isinstance(value, dict) else value.state_dict())
            dcp.load(scratch, checkpoint_id=path, process_group=self._pg)
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            error = short_error(e)
        ok = torch.tensor([0 if error else 1], dtype=torch.int64)
        if self.ctx.world_size > 1:
            dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self._pg)
        if not ok.item():
            return error or "the load failed on another rank"
        for key, value in dcp_state.items():
            if isinstance(value, dict):
                copy_into(value, scratch[key])
            else:
                value.load_state_dict(scratch[key])
        return None

    def _corrupt(self, step: int, path: str, reason: str) -> None:
        if self.ctx.rank == 0:
            self.ctx.emit(EventKind.CHECKPOINT_CORRUPT, tier=TIER_PERSISTENT, step=step, path=path, reason=reason)

    @staticmethod
    def _remove_skipped(skipped: list[tuple[str, bool]]) -> None:
        """Rank 0: move the skipped directories out of the way of the saves that will redo them."""
        for path, committed in skipped:
            set_aside(path, committed)

    # ---- save ---------------------------------------------------------------------------
    def maybe_save(self, step: int, state: dict[str, Any]) -> bool:
        """Save if ``(step + 1) % every_steps == 0``; ``step`` is the 0-based step just completed.

        Once that checkpoint is committed, rank 0 offers it to the S3 tier (if any), which
        uploads it in the background when ``(step + 1) % s3.every_steps == 0``.

        Returns:
            Whether a save was started. Raises what :meth:`save` raises.
        """
        if (int(step) + 1) % self.every_steps != 0:
            return False
        self.save(step, state)
        return True

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Checkpoint ``state`` as the state after 0-based ``step``, to ``<root>/step-<step:08d>/``.

        Blocks while the previous save finishes and the state is staged into CPU memory; the
        write continues in a background thread (unless ``async_save=False``). When every rank
        has written, every rank hashes its own data files, rank 0 hashes the rest and writes the
        commit marker with the file table, emits ``checkpoint.saved`` {tier: "persistent", step,
        bytes, blocked_s (seconds this call blocked training), total_s (seconds from this call
        to the commit), path}, offers the checkpoint to the S3 tier, and applies retention: it
        keeps the ``keep_last`` newest complete checkpoints (never fewer than the newest one, and
        never a directory the S3 tier still has to upload), deletes older complete ones and
        incomplete ones older than the newest complete one (``shared``: older than the newest
        complete one minus ``every_steps``). Collective.

        Args:
            step: 0-based step just completed.
            state: as for :meth:`restore`.

        Raises:
            TypeError: ``state`` holds an unsupported value.
            RuntimeError: the previous asynchronous save failed (raised here, on the next save).
            torch.distributed.checkpoint.api.CheckpointException: a synchronous save failed.
        """
        import torch.distributed.checkpoint as dcp

        t0 = time.monotonic()
        self.wait()
        adapters = to_dcp(state)
        path = os.path.join(self.root, step_dir_name(int(step)))
        if self.ctx.rank == 0 and os.path.lexists(path):
            # a re-save of a step (after a restore) must not look committed early, nor keep files
            # of the earlier attempt. No rank writes before rank 0 joined the planning collective.
            try:
                os.remove(os.path.join(path, COMMIT_MARKER))
            except FileNotFoundError:
                pass
            shutil.rmtree(path, ignore_errors=True)
        if not self.async_save:
            dcp.save(adapters, checkpoint_id=path, process_group=self._pg)
            blocked = time.monotonic() - t0
            error = self._commit(int(step), path, t0, blocked)
            if error is not None:
                raise RuntimeError(f"checkpoint of step {step} was written but not committed: {error}")
            return
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                        use_async_staging=False, use_non_blocking_copy=False))
        response = dcp.async_save(adapters, checkpoint_id=path, process_group=self._pg, async_stager=self._stager)
        blocked = time.monotonic() - t0
        future = response.upload_completion if hasattr(response, "upload_completion") else response
        done = threading.Event()
        self._pending = (int(step), done)
        future.add_done_callback(lambda f, s=int(step), p=path: self._on_done(f, s, p, t0, blocked, done))

    def _on_done(self, future: Future, step: int, path: str, t0: float, blocked: float,
                 done: threading.Event) -> None:
        """Writer thread: commit on success, remember the failure otherwise; then signal."""
        try:
            future.result()
            error = self._commit(step, path, t0, blocked)
            if error is not None:
                self._pending_error = RuntimeError(f"written but not committed: {error}")
        except BaseException as e:
            self._pending_error = e
            if self.ctx.rank == 0:
                self.ctx.emit(EventKind.CHECKPOINT_FAILED, tier=TIER_PERSISTENT, step=step, reason=short_error(e),
                              attempt=1, will_retry=False, path=path)
        finally:
            done.set()

    def _commit(self, step: int, path: str, t0: float, blocked: float) -> str | None:
        """Collective, after DCP's save returned on every rank: hash, write the marker (rank 0),
        agree on the outcome. Returns None when committed, else the reason (on every rank)."""
        world, rank = self.ctx.world_size, self.ctx.rank
        own: dict[str, dict[str, Any]] = {}
        error = None
        try:
            own = hash_rank_files(path, rank)
        except OSError as e:
            error = f"rank {rank} could not hash its files: {e}"
        if world > 1:
            gathered: list[Any] | None = [None] * world if rank == 0 else None
            dist.gather_object((own, error), gathered, dst=0, group=self._pg)
        else:
            gathered = [(own, error)]
        outcome = None
        if rank == 0:
            files: dict[str, dict[str, Any]] = {}
            errors = [e for _, e in gathered if e]
            for part, _ in gathered:
                files.update(part)
            try:
                if not errors:
                    hash_remaining(path, files)
                    if METADATA_FILE not in files:
                        errors.append(f"{METADATA_FILE} is missing after the save")
            except OSError as e:
                errors.append(f"rank 0 could not hash the checkpoint: {e}")
            if errors:
                outcome = "; ".join(errors)
            else:
                try:
                    nbytes = write_marker(path, step, world, files, self.ctx.checkpoint_key)
                except OSError as e:
                    outcome = f"could not write the commit marker: {e}"
        outcome = self.broadcast(outcome)
        if outcome is not None:
            if rank == 0:
                self.ctx.emit(EventKind.CHECKPOINT_FAILED, tier=TIER_PERSISTENT, step=step, reason=outcome, attempt=1,
                              will_retry=False, path=path)
            return outcome
        self.last_saved_step = step
        if rank == 0:
            self.ctx.emit(EventKind.CHECKPOINT_SAVED, tier=TIER_PERSISTENT, step=step, bytes=nbytes, blocked_s=blocked,
                          total_s=time.monotonic() - t0, path=path)
            if self.s3 is not None:
                try:
                    self.s3.maybe_upload(step, path)
                except Exception as e:
                    self.ctx.emit(EventKind.CHECKPOINT_FAILED, tier=TIER_S3, step=step, reason=short_error(e), attempt=0,
                                  will_retry=False, path=path)
            self._retain()
        return None

    def _retain(self) -> None:
        """Rank 0: keep ``keep_last`` complete checkpoints (always the newest one, and any the S3
        tier has yet to upload); drop incomplete ones older than the newest complete one (a shared
        root: older than the save interval before it, whose writer may still be writing)."""
        entries = list_checkpoints(self.root)
        complete = [(s, p) for s, p, c in entries if c]
        if not complete:
            return
        pinned = self.s3.pinned_dirs() if self.s3 is not None else set()
        newest = complete[0][0]
        floor = newest - self.every_steps if self.shared else newest
        for s, p in complete[max(1, self.keep_last):]:
            if os.path.abspath(p) not in pinned:
                shutil.rmtree(p, ignore_errors=True)
        for s, p, c in entries:
            if not c and s < floor:
                shutil.rmtree(p, ignore_errors=True)

    def wait(self) -> None:
        """Block until the pending asynchronous save (if any) is committed. Does not wait for
        S3 uploads (see :meth:`S3Tier.wait <hyperpod_lab.runtime.checkpoint.s3.S3Tier.wait>`).

        Raises:
            RuntimeError: that save failed (the cause is chained).
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        step, done = pending
        done.wait()
        if self._pending_error is not None:
            err, self._pending_error = self._pending_error, None
            raise RuntimeError(f"asynchronous checkpoint of step {step} failed: {short_error(err)}") from err

    def close(self) -> None:
        """Release the staging buffers (called by ``ctx.finish``). Does not wait."""
        if self._stager is not None:
            try:
                self._stager.close()
            except Exception:
                pass
            self._stager = None
