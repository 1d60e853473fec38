"""The memory tier: snapshots of a rank's training state in named shared-memory files.

A snapshot is the rank's whole state (model parameters and buffers, optimizer state, data-loader
position, RNG states, ...; its local shards when the state is sharded) flattened into one
preallocated byte buffer: a file under ``/dev/shm`` (a tmpfs), mapped into the process and reused. Files in ``/dev/shm`` outlive the process that
wrote them (a SIGKILLed rank's restarted process maps them again and reads them back) but not the
node (they are RAM). :mod:`hyperpod_lab.runtime.checkpoint.peer` copies each snapshot to another node so
that a lost node loses no snapshot; :class:`hyperpod_lab.runtime.checkpoint.tiered.TieredCheckpointer` puts
the tiers together.

This module is the asynchronous engine (:class:`MemoryTier`): what a snapshot copies when, and
its commit in a background thread. The state is taken apart by :mod:`hyperpod_lab.runtime.state`
(what a state may hold, the flat layout); the slots and their files on the node (layout under
``$HYPERPOD_LAB_SHM_DIR``, default ``/dev/shm/hyperpod-lab``, commit records, checksums) are
:mod:`hyperpod_lab.runtime.checkpoint.slots`.

Commit protocol: a save first deletes the slot's commit record, then copies the tensors into the
slot, and only when every byte is in place computes the checksum (XXH3) of the data, writes the meta file
(JSON, temporary file + ``os.replace``) and finally the record (the same way), signed with
HMAC-SHA256 under the job's checkpoint key (:mod:`hyperpod_lab.runtime.checkpoint.slots` says what it covers
and why). A record that does not verify (planted, or written with another key) is never read. A process killed
mid-copy therefore leaves a slot without a record, which is never read; a slot whose data does
not match its record's checksum (a bit flip, a bug) is rejected when read. The ring holds
``keep_last`` slots; a save reuses the slot with the same step, else one without a record, else
the oldest, so with ``keep_last >= 2`` a save killed half-way leaves the previous snapshot intact
(with ``keep_last == 1`` it leaves none).

The first snapshot allocates its slot (the state's size is known only then: an optimizer has no
state before its first step); the rest of the ring is allocated in the background right after it
commits.

Measured here (2 busy cores, torch 2.13 CPU), examples/train_lm.py's model (1.85 M parameters)
with AdamW, 210 tensors, 22.4 MB a snapshot: ``snapshot`` blocks ~5-11 ms (about 4 ms of it the
copy, the rest taking the state apart), ~30 ms the first time (allocation); the commit (XXH3 checksum
at ~13 GB/s, meta, record) follows ~10 ms later in the background. With CUDA the slot files are
page-locked with ``cudaHostRegister`` so device-to-host copies are asynchronous
(``non_blocking=True``); they are ordered on the current CUDA stream (or on a side stream in
overlap mode) and the commit waits for them.

:class:`MemoryTier` is usable on its own, without a process group (e.g. by a benchmark)::

    tier = MemoryTier("/dev/shm/bench/rank-0", keep_last=2)
    snap = tier.snapshot(step, {"model": model, "optim": opt})  # returns when training may go on
    tier.wait()                                                 # committed (checksum + record)
    step = tier.restore({"model": model, "optim": opt})         # newest complete snapshot
    tier.close(remove=True)

What a state may hold is the same as for the persistent tier (see
:mod:`hyperpod_lab.runtime.state`). Tensors must be dense. A sharded state (FSDP2 ``fully_shard``,
HSDP: DTensor parameters and optimizer state) is snapshotted as this rank's local shards with
their placements, and restored into the live DTensors only when the live mesh and placements are
the snapshot's (else ``ValueError``); ShardedTensor (FSDP1) raises ``TypeError``.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from hyperpod_lab.runtime.checkpoint.auth import sha256_hex
from hyperpod_lab.runtime.checkpoint.slots import Slot, SlotRing, checksum, sign_record
from hyperpod_lab.runtime.state import FORMAT, apply, capture, load_meta, unflatten

__all__ = ["MemoryTier", "Snapshot"]


def _copy_leaf(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool) -> None:
    """Copy one tensor into its place in a slot (the one place every snapshot byte goes through;
    tests replace it to kill a process mid-copy)."""
    dst.copy_(src, non_blocking=non_blocking)


# ---- the tier ---------------------------------------------------------------------------------
@dataclass
class Snapshot:
    """One snapshot in flight or done.

    Attributes:
        step: the step it holds. nbytes: bytes of data. slot: where it goes.
        blocked_s: seconds :meth:`MemoryTier.snapshot` blocked its caller (waiting for the previous
            snapshot, allocating, copying what is copied synchronously).
        hook_wait_s: seconds the training loop waited in :meth:`MemoryTier.wait_copy` (overlap mode).
        total_s: seconds from the call to the commit (None until committed).
        record: the commit record once committed. error: the exception if it failed.
        meta: the layout (JSON bytes).
    """

    step: int
    nbytes: int
    slot: Slot
    meta: bytes
    t0: float
    blocked_s: float = 0.0
    hook_wait_s: float = 0.0
    total_s: float | None = None
    record: dict[str, Any] | None = None
    error: BaseException | None = None
    copied: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    cuda_events: list[Any] = field(default_factory=list)
    side_event: Any = None
    _hook_start: float | None = None
    copy_end: float | None = None


class _Worker:
    """One daemon thread running jobs in order (daemon: a wedged collective in it must not keep a
    failing process alive at exit).

    It holds no reference to a job once the job ran, and :meth:`stop` joins it: a daemon thread
    that drops the last reference to a process group while the interpreter shuts down aborts
    the process (the group's destructor releases the GIL, re-taking it during finalisation ends
    the thread with a forced unwind through C++: "terminate called without an active exception").
    """

    def __init__(self, name: str):
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> None:
        self._q.put(fn)

    def _run(self) -> None:
        while True:
            fn = self._q.get()
            if fn is None:
                return
            try:
                fn()
            finally:
                fn = None

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish the queued jobs, then end the thread; wait up to ``timeout`` seconds for it."""
        self._q.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)


class MemoryTier:
    """A rank's snapshots in a ring of ``keep_last`` shared-memory slots (see the module docstring).

    Usable without a process group. One snapshot is in flight at a time: :meth:`snapshot` first
    waits for the previous one to commit.

    Args:
        directory: the ring's directory, e.g. ``<shm_root>/<job_id>/<node>/rank-<R>``.
        keep_last: slots (complete snapshots kept); shared memory used is about
            ``keep_last`` x the state's size in bytes.
        rank, world_size, job_id: stamped into each commit record (a restore of another world
            size ignores the snapshot).
        pin_memory: page-lock the slots for CUDA; default: whether CUDA is available.
        key: the job's checkpoint key (``ctx.checkpoint_key``), which signs and verifies the
            commit records; default: a random key of this process (its snapshots can then be
            restored by this process only).

    Raises:
        ValueError: ``keep_last`` < 1.
        hyperpod_lab.private_dir.PrivateDirError: ``directory`` or a parent up to the
            shared-memory root is not a private directory of ours (the message names it).
        OSError: ``directory`` cannot be created.
    """

    def __init__(self, directory: str, keep_last: int = 2, *, rank: int = 0, world_size: int = 1,
                 job_id: str = "", pin_memory: bool | None = None, key: bytes | None = None):
        self.ring = SlotRing(directory, keep_last, key=key,
                             pin=torch.cuda.is_available() if pin_memory is None else bool(pin_memory))
        self.key = self.ring.key
        self.directory, self.keep_last = directory, keep_last
        self.rank, self.world_size, self.job_id = rank, world_size, job_id
        self._worker: _Worker | None = None
        self._pending: Snapshot | None = None
        self._side_stream = None
        self.last: Snapshot | None = None  # the newest snapshot started

    # ---- saving -------------------------------------------------------------------------------
    def snapshot(self, step: int, state: dict[str, Any], *, overlap: bool = False,
                 on_done: Callable[[Snapshot], None] | None = None) -> Snapshot:
        """Start a snapshot of ``state`` as the state after 0-based ``step``.

        Waits for the previous snapshot, allocates the slot on first use, then copies. Without
        overlap it returns when every byte is copied (CPU tensors) or enqueued on the current
        CUDA stream (CUDA tensors); with ``overlap=True`` it copies module buffers and other
        state at once and leaves parameters and optimizer ``state`` tensors to a background
        thread (CPU) or a side CUDA stream: the caller must call :meth:`wait_copy` before they
        change (``TieredCheckpointer`` does it in an optimizer step pre-hook). The checksum, the meta
        file and the commit record are written in the background, then ``on_done(snapshot)``
        runs there (also on failure, with ``snapshot.error`` set).

        Args:
            step: 0-based step just completed.
            state: ``{name: nn.Module | Optimizer | Stateful | dict}``.
            overlap: defer parameter/optimizer-state copies as described.
            on_done: called in the background thread when the snapshot committed or failed.

        Returns:
            The :class:`Snapshot` (``blocked_s`` set).

        Raises:
            TypeError: unsupported state (nothing was written).
            OSError: the slot could not be allocated (e.g. ENOSPC).
            RuntimeError: the previous snapshot failed (raised here; this one is not started).
        """
        t0 = time.monotonic()
        self.wait()
        cap = capture(state)
        slot = self.ring.begin(int(step), cap.nbytes)
        snap = Snapshot(step=int(step), nbytes=cap.nbytes, slot=slot, meta=cap.meta, t0=t0)
        views = slot.views(cap)
        later_cpu: list[int] = []
        cuda_now, cuda_later = [], []
        with torch.no_grad():
            for i, t in enumerate(cap.tensors):
                if overlap and cap.deferrable[i]:
                    (cuda_later if t.is_cuda else later_cpu).append(i)
                    continue
                if t.is_cuda:
                    cuda_now.append(i)
                _copy_leaf(views[i], t, non_blocking=t.is_cuda and slot.pinned)
            if cuda_now:
                ev = torch.cuda.Event()
                ev.record()
                snap.cuda_events.append(ev)
            if cuda_later:
                if self._side_stream is None:
                    self._side_stream = torch.cuda.Stream()
                side = self._side_stream
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for i in cuda_later:
                        t = cap.tensors[i]
                        _copy_leaf(views[i], t, non_blocking=slot.pinned)
                        t.record_stream(side)
                    ev = torch.cuda.Event()
                    ev.record(side)
                snap.side_event = ev
                snap.cuda_events.append(ev)
        snap.blocked_s = time.monotonic() - t0
        self._pending = self.last = snap
        if self._worker is None:
            self._worker = _Worker(f"hyperpod-memory-tier-{self.rank}")
        pairs = [(views[i], cap.tensors[i]) for i in later_cpu]
        if not later_cpu:
            snap.copy_end = time.monotonic()
            snap.copied.set()
        self._worker.submit(lambda: self._finish(snap, pairs, on_done))
        return snap

    def _finish(self, snap: Snapshot, pairs: list[tuple[torch.Tensor, torch.Tensor]],
                on_done: Callable[[Snapshot], None] | None) -> None:
        """Background: deferred CPU copies, wait for CUDA copies, checksum, meta, record, on_done."""
        try:
            try:
                with torch.no_grad():
                    for dst, src in pairs:
                        _copy_leaf(dst, src, non_blocking=False)
            finally:
                if not snap.copied.is_set():
                    snap.copy_end = time.monotonic()
                    snap.copied.set()
            for ev in snap.cuda_events:
                ev.synchronize()
            data = snap.slot.data(snap.nbytes)
            record = {"format": FORMAT, "step": snap.step, "world_size": self.world_size, "rank": self.rank,
                      "nbytes": snap.nbytes, "data_checksum": checksum(data), "meta_sha256": sha256_hex(snap.meta),
                      "job_id": self.job_id, "time": time.time()}
            record["hmac"] = sign_record(self.key, record)
            snap.slot.commit(snap.meta, record)
            snap.record = record
            snap.total_s = time.monotonic() - snap.t0
            for other in self.ring.slots:  # allocate the rest of the ring now, off the training path
                if other is not snap.slot and other.capacity < snap.nbytes:
                    try:
                        other.ensure(snap.nbytes)
                    except OSError:
                        break  # the next snapshot into it will report it
            hs = snap._hook_start
            if hs is not None and snap.copy_end is not None and hs < snap.copy_end:
                snap.hook_wait_s = snap.copy_end - hs
        except BaseException as e:
            snap.error = e
        finally:
            if on_done is not None:
                try:
                    on_done(snap)
                except BaseException as e:
                    if snap.error is None:
                        snap.error = e
            snap.done.set()

    def wait_copy(self) -> None:
        """Block until the pending snapshot's copies finished (its source tensors may change
        afterwards). With CUDA, makes the current stream wait for the side-stream copies instead
        of blocking the host. Cheap when nothing is pending."""
        snap = self._pending
        if snap is None:
            return
        if not snap.copied.is_set():
            snap._hook_start = time.monotonic()
            snap.copied.wait()
        if snap.side_event is not None:
            torch.cuda.current_stream().wait_event(snap.side_event)
            snap.side_event = None

    def wait(self) -> Snapshot | None:
        """Block until the pending snapshot committed (and its ``on_done`` ran).

        Returns:
            That snapshot, or None when none was pending.

        Raises:
            RuntimeError: it failed (the cause is chained).
        """
        snap, self._pending = self._pending, None
        if snap is None:
            return None
        snap.done.wait()
        if snap.error is not None:
            raise RuntimeError(f"memory snapshot of step {snap.step} failed: "
                               f"{type(snap.error).__name__}: {snap.error}") from snap.error
        return snap

    # ---- reading ------------------------------------------------------------------------------
    def complete_steps(self) -> list[int]:
        """Steps of the complete snapshots of this rank and world size, newest first."""
        return [r["step"] for _s, r, _m in self.ring.complete() if r["world_size"] == self.world_size]

    def read(self, step: int | None = None) -> tuple[int, dict[str, Any]]:
        """The newest complete snapshot (or the one of ``step``) as a tree of fresh CPU tensors.

        Returns:
            ``(step, {name: state_dict or dict})``.

        Raises:
            LookupError: no complete, authentic, checksum-valid snapshot (of that step).
        """
        self.wait()
        for slot, rec, meta in self.ring.complete():
            if rec["world_size"] != self.world_size or (step is not None and rec["step"] != step):
                continue
            if slot.verify(rec) is not None:
                continue
            return rec["step"], unflatten(load_meta(meta), slot.data(rec["nbytes"]))
        raise LookupError(f"no complete memory snapshot{'' if step is None else f' of step {step}'} "
                          f"in {self.directory}")

    def restore(self, state: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest complete snapshot (or that of ``step``) into ``state``, in place.

        Returns:
            The snapshot's step, or None when there is none (``state`` untouched).
        """
        try:
            got, tree = self.read(step)
        except LookupError:
            return None
        apply(state, tree)
        return got

    @property
    def memory_bytes(self) -> int:
        """Bytes of shared memory this ring occupies (``keep_last`` slots once all are used)."""
        return self.ring.memory_bytes

    def close(self, remove: bool = False, timeout: float = 30.0) -> None:
        """Stop the background thread and unmap the slots; ``remove=True`` also deletes them.

        The thread finishes the pending snapshot first; this waits for it up to ``timeout``
        seconds (it may be stuck on a dead peer), then goes on. Call :meth:`wait` first to see
        the pending snapshot's outcome."""
        if self._worker is not None:
            self._worker.stop(timeout)
            self._worker = None
        self._pending = None
        if remove:
            self.ring.remove()
        else:
            self.ring.close()
