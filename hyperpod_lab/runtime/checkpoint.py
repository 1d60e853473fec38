"""The persistent checkpoint tier: torch.distributed.checkpoint (DCP) to the job directory.

Layout on shared storage::

    <job_dir>/checkpoints/step-00000019/      one DCP checkpoint (all ranks' files + .metadata)
    <job_dir>/checkpoints/step-00000019/COMMITTED   commit marker, JSON {step, world_size, bytes, time}
    <job_dir>/checkpoints/corrupt-step-00000039-<epoch>/   a committed one that failed to load,
                                          set aside by restore(); never deleted automatically

A checkpoint is *complete* only when its ``COMMITTED`` marker exists. Rank 0 writes the marker
(temporary file + ``os.replace``) only after DCP's save returned on rank 0, which happens after
every rank's data files were written and fsynced and the ``.metadata`` file was written (DCP's
coordinator gathers all ranks' write results before it finishes). A save killed half-way
therefore leaves a directory without a marker, which :meth:`Checkpointer.restore` never loads.

Saving is asynchronous by default (``dcp.async_save``, thread executor, on the context's gloo
``cpu_group`` so the background collectives never interleave with the training loop's DDP
collectives on the default group). The training thread is blocked only while the state is
*staged* (copied into CPU buffers that are allocated once and reused), not while it is written.
Staging is synchronous on purpose: asynchronous staging would let the next optimizer step
mutate parameters while they are being copied. A new save first waits for the previous one
(the staging buffers are reused).

Per-rank state: DCP deduplicates by key, so a plain tensor stored under the same key on every
rank is saved once (rank 0's copy). Give per-rank state (RNG, data-loader position) per-rank
keys, e.g. ``state[f"rng-rank{ctx.rank}"] = {...}``.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hyperpod_lab.events import EventKind
from hyperpod_lab.runtime.context import write_json_atomic

if TYPE_CHECKING:  # pragma: no cover
    from hyperpod_lab.runtime.context import JobContext

COMMIT_MARKER = "COMMITTED"
CHECKPOINTS_DIRNAME = "checkpoints"
TIER = "persistent"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


def step_dir_name(step: int) -> str:
    """``step-<step:08d>``, the directory of the checkpoint taken after 0-based ``step``."""
    return f"step-{step:08d}"


def list_checkpoints(root: str) -> list[tuple[int, str, bool]]:
    """Checkpoint directories under ``root``, newest first.

    Returns:
        ``[(step, path, complete), ...]`` sorted by step descending; ``complete`` is whether the
        commit marker exists. A missing ``root`` gives ``[]``.
    """
    out = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    for name in names:
        m = _STEP_DIR.match(name)
        path = os.path.join(root, name)
        if m and os.path.isdir(path):
            out.append((int(m.group(1)), path, os.path.exists(os.path.join(path, COMMIT_MARKER))))
    out.sort(reverse=True)
    return out


def dir_bytes(path: str) -> int:
    """Total size in bytes of the checkpoint's files under ``path`` (the commit marker excluded)."""
    total = 0
    for base, _dirs, files in os.walk(path):
        for f in files:
            if f == COMMIT_MARKER and base == path:
                continue
            try:
                total += os.path.getsize(os.path.join(base, f))
            except OSError:
                pass
    return total


# torch.distributed.checkpoint costs ~1.3 s to import (it pulls in DTensor); it is imported on
# first use so that importing this package (e.g. by the launcher) stays cheap. The adapters below
# satisfy DCP's runtime-checkable ``Stateful`` protocol structurally.


class _ModelState:
    """An ``nn.Module`` as DCP state, via ``get/set_model_state_dict`` (FQN keys; DDP/FSDP aware)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state_dict)


class _OptimState:
    """An optimizer as DCP state, keyed by parameter FQNs of ``model`` (so it reshards)."""

    def __init__(self, model: torch.nn.Module, optim: torch.optim.Optimizer):
        self.model, self.optim = model, optim

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optim)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optim, state_dict)


class _PlainOptimState:
    """An optimizer whose parameters belong to no module in the state: its own state_dict."""

    def __init__(self, optim: torch.optim.Optimizer):
        self.optim = optim

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)


def _adapt(state: dict[str, Any]) -> dict[str, Any]:
    """Map user state to DCP state: modules and optimizers become Stateful adapters, pairing each
    optimizer with the module that owns all its parameters; Stateful and plain dicts pass through.

    Raises:
        TypeError: a value is none of nn.Module, Optimizer, Stateful or dict.
    """
    if not isinstance(state, dict) or not state:
        raise TypeError("state must be a non-empty dict such as {'model': model, 'optim': optimizer}")
    modules = {k: v for k, v in state.items() if isinstance(v, torch.nn.Module)}
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, torch.nn.Module):
            out[key] = _ModelState(value)
        elif isinstance(value, torch.optim.Optimizer):
            params = {id(p) for g in value.param_groups for p in g["params"]}
            owner = next((m for m in modules.values() if params <= {id(p) for p in m.parameters()}), None)
            out[key] = _OptimState(owner, value) if owner is not None else _PlainOptimState(value)
        elif callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None)):
            out[key] = value
        elif isinstance(value, dict):
            out[key] = value
        else:
            raise TypeError(f"state[{key!r}] is a {type(value).__name__}; give an nn.Module, an Optimizer, "
                            f"an object with state_dict()/load_state_dict(), or a dict of tensors/numbers")
    return out


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


def _copy_into(dst: dict[str, Any], src: dict[str, Any]) -> None:
    """Update a user's plain dict in place from a loaded one: tensors are ``copy_``-ed (so
    references the caller holds stay valid), everything else replaced."""
    for k, v in src.items():
        cur = dst.get(k)
        if isinstance(cur, torch.Tensor) and isinstance(v, torch.Tensor) and cur.shape == v.shape:
            with torch.no_grad():
                cur.copy_(v)
        elif isinstance(cur, dict) and isinstance(v, dict):
            _copy_into(cur, v)
        else:
            dst[k] = v


def _short(exc: BaseException, limit: int = 500) -> str:
    """One line: ``Type: message``; for DCP's CheckpointException, the first failing rank's cause."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank = min(failures)
        cause = failures[rank][0] if isinstance(failures[rank], tuple) else failures[rank]
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        text = f"{type(cause).__name__} on rank {rank}: {first}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Checkpointer:
    """Persistent-tier checkpoints of a job with DCP, asynchronous, committed, with retention.

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

    Raises:
        ValueError: ``every_steps`` or ``keep_last`` is not a whole number >= 1.
    """

    def __init__(self, ctx: "JobContext", every_steps: int | None = None, keep_last: int | None = None,
                 *, async_save: bool = True, root: str | None = None):
        policy = ctx.spec.checkpoint if ctx.spec is not None else None
        self.every_steps = every_steps if every_steps is not None else (policy.every_steps if policy else 20)
        self.keep_last = keep_last if keep_last is not None else (policy.keep_last if policy else 2)
        for name, v in (("every_steps", self.every_steps), ("keep_last", self.keep_last)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Checkpointer {name} must be a whole number >= 1, got {v!r}")
        self.ctx = ctx
        self.root = root or os.path.join(ctx.job_dir, CHECKPOINTS_DIRNAME)
        self.async_save = async_save
        self._pg = ctx.cpu_group
        self._stager = None
        self._pending: tuple[int, threading.Event] | None = None  # (step, set when committed/failed)
        self._pending_error: BaseException | None = None
        self.last_saved_step: int | None = None  # newest step committed by this process
        os.makedirs(self.root, exist_ok=True)
        ctx._checkpointers.append(self)

    # ---- restore ------------------------------------------------------------------------
    def restore(self, state: dict[str, Any]) -> int:
        """Load the newest complete checkpoint into ``state``, in place.

        Walks the checkpoint directories newest first (rank 0's listing, broadcast). A directory
        without the commit marker is skipped; a committed one whose load fails on any rank is
        skipped too (and renamed ``corrupt-step-...`` so a later save of that step starts
        clean); each skip emits ``checkpoint.corrupt`` {path, reason} on rank 0, and the skipped
        directories newer than the one loaded are removed. The load goes into scratch copies and
        is applied only when every rank succeeded, so a failed attempt leaves ``state``
        untouched. Collective: call it on every rank.

        Args:
            state: ``{name: nn.Module | Optimizer | Stateful | dict of tensors/numbers}``, the same
                names as when saving. An optimizer is saved by parameter FQN of the module in
                ``state`` that owns its parameters.

        Returns:
            The step to train next: last saved step + 1, or 0 when no checkpoint loaded.

        Raises:
            TypeError: ``state`` holds an unsupported value.
            RuntimeError: a collective failed (a peer died) while agreeing on the result.
        """
        adapters = _adapt(state)
        self.wait()
        listing = [list_checkpoints(self.root) if self.ctx.rank == 0 else None]
        if self.ctx.world_size > 1:
            dist.broadcast_object_list(listing, src=0, group=self._pg)
        candidates: list[tuple[int, str, bool]] = listing[0]
        skipped: list[tuple[str, bool]] = []  # (path, committed)
        for step, path, complete in candidates:
            if not complete:
                self._corrupt(path, "no commit marker (the save did not finish)")
                skipped.append((path, False))
                continue
            t0 = time.monotonic()
            error = self._try_load(adapters, path)
            if error is not None:
                self._corrupt(path, error)
                skipped.append((path, True))
                continue
            seconds = time.monotonic() - t0
            if self.ctx.rank == 0:
                self._remove_skipped(skipped)
                self.ctx.emit(EventKind.CHECKPOINT_RESTORED, tier=TIER, step=step, bytes=dir_bytes(path),
                              seconds=seconds, path=path)
            self.ctx._restored = {"tier": TIER, "step": step}
            self.last_saved_step = step
            return step + 1
        if self.ctx.rank == 0:
            self._remove_skipped(skipped)
        self.ctx._restored = None
        return 0

    def _try_load(self, adapters: dict[str, Any], path: str) -> str | None:
        """Load ``path`` into scratch copies, agree across ranks, apply on success.
        Returns None on success, else the reason (the same on every rank)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        error: str | None = None
        scratch: dict[str, Any] = {}
        try:
            for key, value in adapters.items():
                scratch[key] = _empty_like_tree(value if isinstance(value, dict) else value.state_dict())
            dcp.load(scratch, checkpoint_id=path, process_group=self._pg)
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            error = _short(e)
        ok = torch.tensor([0 if error else 1], dtype=torch.int64)
        if self.ctx.world_size > 1:
            dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self._pg)
        if not ok.item():
            return error or "the load failed on another rank"
        for key, value in adapters.items():
            if isinstance(value, dict):
                _copy_into(value, scratch[key])
            else:
                value.load_state_dict(scratch[key])
        return None

    def _corrupt(self, path: str, reason: str) -> None:
        if self.ctx.rank == 0:
            self.ctx.emit(EventKind.CHECKPOINT_CORRUPT, path=path, reason=reason)

    def _remove_skipped(self, skipped: list[tuple[str, bool]]) -> None:
        """Rank 0: move the skipped directories out of the way of the saves that will redo them."""
        for path, committed in skipped:
            if committed:  # keep the evidence, out of the step-* namespace
                dest = os.path.join(os.path.dirname(path), f"corrupt-{os.path.basename(path)}-{int(time.time())}")
                try:
                    os.replace(path, dest)
                except OSError:
                    shutil.rmtree(path, ignore_errors=True)
            else:
                shutil.rmtree(path, ignore_errors=True)

    # ---- save ---------------------------------------------------------------------------
    def maybe_save(self, step: int, state: dict[str, Any]) -> bool:
        """Save if ``(step + 1) % every_steps == 0``; ``step`` is the 0-based step just completed.

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
        has written, rank 0 writes the commit marker, emits ``checkpoint.saved`` {tier, step,
        bytes, blocked_s, total_s, path} (blocked_s: seconds this call blocked training;
        total_s: seconds from this call to the commit), and applies retention: it keeps the
        ``keep_last`` newest complete checkpoints (never the newest one less), deletes older
        complete ones and incomplete ones older than the newest complete one. Collective.

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
        adapters = _adapt(state)
        path = os.path.join(self.root, step_dir_name(int(step)))
        if self.ctx.rank == 0:  # a re-save of a step (after a restore) must not look committed early
            try:
                os.remove(os.path.join(path, COMMIT_MARKER))
            except FileNotFoundError:
                pass
        if not self.async_save:
            dcp.save(adapters, checkpoint_id=path, process_group=self._pg)
            blocked = time.monotonic() - t0
            self._commit(int(step), path, t0, blocked)
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
        """Upload thread: commit on success, remember the failure otherwise; then signal."""
        try:
            future.result()
            self._commit(step, path, t0, blocked)
        except BaseException as e:  # noqa: BLE001 - CheckpointException is a BaseException
            self._pending_error = e
        finally:
            done.set()

    def _commit(self, step: int, path: str, t0: float, blocked: float) -> None:
        self.last_saved_step = step
        if self.ctx.rank != 0:
            return
        nbytes = dir_bytes(path)
        write_json_atomic(os.path.join(path, COMMIT_MARKER),
                          {"step": step, "world_size": self.ctx.world_size, "bytes": nbytes, "time": time.time()})
        self.ctx.emit(EventKind.CHECKPOINT_SAVED, tier=TIER, step=step, bytes=nbytes, blocked_s=blocked,
                      total_s=time.monotonic() - t0, path=path)
        self._retain()

    def _retain(self) -> None:
        """Rank 0: keep ``keep_last`` complete checkpoints; drop incomplete ones older than the newest."""
        entries = list_checkpoints(self.root)
        complete = [(s, p) for s, p, c in entries if c]
        if not complete:
            return
        newest = complete[0][0]
        for s, p in complete[max(1, self.keep_last):]:
            shutil.rmtree(p, ignore_errors=True)
        for s, p, c in entries:
            if not c and s < newest:
                shutil.rmtree(p, ignore_errors=True)

    def wait(self) -> None:
        """Block until the pending asynchronous save (if any) is committed.

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
            raise RuntimeError(f"asynchronous checkpoint of step {step} failed: {_short(err)}") from err

    def close(self) -> None:
        """Release the staging buffers (called by ``ctx.finish``). Does not wait."""
        if self._stager is not None:
            try:
                self._stager.close()
            except Exception:
                pass
            self._stager = None
