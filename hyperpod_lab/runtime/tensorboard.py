"""TensorBoard event files of a job's step metrics, written with torch's own
``torch.utils.tensorboard.SummaryWriter`` (JobSpec ``tensorboard``, ``submit --tensorboard``).

Where: ``<job_dir>/tensorboard`` (``tensorboard="rank0"``: the rank that writes the job's
``step`` events, rank 0) or ``<job_dir>/tensorboard/rank-<R>`` on every rank
(``tensorboard="all-ranks"``), so ``tensorboard --logdir <job_dir>/tensorboard`` opens the job
unchanged. What, at every :meth:`JobContext.step <hyperpod_lab.runtime.context.JobContext.step>`
(not only the throttled ``step`` events), x = the 0-based step:

================================ ==========================================================
``loss``                         the step's loss (non-finite losses are skipped)
``steps_per_s``                  1 / the step's wall time (``last_step_timing["step_s"]``)
``<name>``                       every numeric extra metric of ``ctx.step(...)`` (``lr``...)
``checkpoint/<tier>``            at each ``checkpoint.saved`` this rank emits: the saved step
``recovery/downtime_s``          at ``recovery.completed``: the seconds the job was down
================================ ==========================================================

A restarted process opens a new event file with ``purge_step`` = its first step, so
TensorBoard drops the steps recomputed after the restart from the older file (one curve).
The step only queues the values: a thread of this module builds the summaries (torch's
``summary.scalar``; a step's scalars go into one ``Summary``, one event record, through the
SummaryWriter's file writer, because tensorboard computes each record's CRC-32C in pure Python)
and SummaryWriter's own thread writes the file; the writer is
flushed when a checkpoint is saved and closed (flushed) when the job finishes or the process
tears down. A failing writer (disk full) prints one line to stderr and stops; training goes on.
See docs/tensorboard.md.
"""

from __future__ import annotations

import math
import os
import queue
import sys
import threading
from typing import Any

from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.spec import TENSORBOARD_ALL_RANKS, TENSORBOARD_MODES, TENSORBOARD_RANK0

MODES = TENSORBOARD_MODES
"""``spec.tensorboard``'s values (:data:`hyperpod_lab.spec.TENSORBOARD_MODES`)."""
MAX_QUEUE = 1000  # SummaryWriter's pending events before add_scalar blocks (its default is 10)
FLUSH_SECS = 30  # the background thread's own flush period (seconds)
INSTALL_HINT = "pip install tensorboard"


class TensorBoardMissing(RuntimeError):
    """The ``tensorboard`` package, which SummaryWriter writes through, is not installed."""


def log_dir(job_dir: str, mode: str, rank: int) -> str | None:
    """The directory this rank writes to, or None when it writes nothing.

    Args:
        job_dir: the job directory. mode: one of :data:`MODES`. rank: the global rank.
    """
    if mode == TENSORBOARD_ALL_RANKS:
        return JobPaths(job_dir, join=os.path.join).tensorboard_rank(rank)
    if mode == TENSORBOARD_RANK0 and rank == 0:
        return JobPaths(job_dir, join=os.path.join).tensorboard
    return None


def _number(v: Any) -> float | None:
    if hasattr(v, "numel") and hasattr(v, "item"):  # a one-element tensor
        v = v.item() if v.numel() == 1 else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


class TensorBoardLog:
    """One rank's SummaryWriter, fed from a queue by a thread of its own.

    :meth:`step` and :meth:`marker` only put a tuple on a queue (about a microsecond): building
    the summaries' protocol buffers costs ~30 us a scalar in the caller's thread, so a daemon
    thread (``hyperpod-tensorboard``) makes the SummaryWriter calls; SummaryWriter's own thread
    then writes the file. The writer is opened there at the first item.

    Args:
        path: the log directory (see :func:`log_dir`).
        purge_first: a restart: the first step's number is SummaryWriter's ``purge_step``.

    Raises:
        TensorBoardMissing: ``tensorboard`` is not installed (names ``pip install tensorboard``).
    """

    def __init__(self, path: str, purge_first: bool = False):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch says "TensorBoard logging requires TensorBoard version 1.15 or above"
            raise TensorBoardMissing(f"the job asks for TensorBoard event files (JobSpec tensorboard) but the "
                                     f"tensorboard package is not installed in this Python environment; "
                                     f"{INSTALL_HINT} (or submit without --tensorboard): {e}") from None
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.summary import scalar

        self._cls, self._scalar, self._summary = SummaryWriter, scalar, Summary
        self.path, self._purge_first = path, purge_first
        self._writer = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders close() against put()
        self._closed = False
        self.error: str | None = None  # the writer thread's exception, if it stopped on one
        self._thread = threading.Thread(target=self._run, name="hyperpod-tensorboard", daemon=True)
        self._thread.start()

    def step(self, step: int, loss: Any, step_s: float | None, metrics: dict[str, Any]) -> None:
        """Queue the scalars of one step: ``loss``, ``steps_per_s`` (1 / ``step_s``) and the
        numeric ``metrics`` (others are skipped; tensors must have one element)."""
        scalars = [("loss", loss)] + ([("steps_per_s", 1.0 / step_s)] if step_s else []) + list(metrics.items())
        scalars = [(k, v.detach() if hasattr(v, "detach") else v) for k, v in scalars]  # .item() is the thread's
        self._put(("scalars", int(step), scalars))

    def marker(self, tag: str, value: Any, step: int | None, flush: bool = False) -> None:
        """Queue a scalar marker (``checkpoint/<tier>``, ``recovery/downtime_s``) at ``step``
        (None: nothing); ``flush``: then write everything queued so far to the file."""
        if step is not None:
            self._put(("scalars", int(step), [(tag, value)]))
        if flush:
            self._put(("flush",))

    def sync(self, timeout_s: float = 60.0) -> bool:
        """Wait until everything queued before this call went through SummaryWriter (not
        necessarily to the file: see ``flush``). Returns False on timeout or when closed."""
        done = threading.Event()
        self._put(("sync", done))
        return done.wait(timeout_s) if not self._closed else False

    def _put(self, item: tuple) -> None:
        with self._lock:
            if not self._closed:
                self._queue.put(item)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item[0] == "close":
                break
            if self.error is not None:
                if item[0] == "sync":
                    item[1].set()
                continue
            try:
                if item[0] == "sync":
                    item[1].set()
                    continue
                if item[0] == "flush":
                    if self._writer is not None:
                        self._writer.flush()
                    continue
                _, step, scalars = item
                if self._writer is None:
                    self._writer = self._cls(self.path, purge_step=step if self._purge_first else None,
                                             max_queue=MAX_QUEUE, flush_secs=FLUSH_SECS)
                values = [(str(tag), value) for tag, value in ((t, _number(v)) for t, v in scalars) if value is not None]
                if len(values) == 1:
                    self._writer.add_scalar(values[0][0], values[0][1], step)
                elif values:  # one event record for the step's scalars (what add_scalar writes, merged):
                    # each record costs a CRC-32C in pure Python in tensorboard's writer thread
                    merged = self._summary(value=[v for tag, x in values for v in self._scalar(tag, x).value])
                    self._writer._get_file_writer().add_summary(merged, step)
            except Exception as e:  # e.g. the job directory is gone: no more metrics, training goes on
                self.error = f"{type(e).__name__}: {e}"
                print(f"hyperpod-lab: TensorBoard writer stopped: {self.error}", file=sys.stderr, flush=True)
        if self._writer is not None:
            self._writer.close()  # flushes the event file
            self._writer = None

    def close(self, timeout_s: float = 60.0) -> None:
        """Write what is queued, flush and close the event file (idempotent; waits up to
        ``timeout_s`` seconds for the writer thread)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(("close",))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
