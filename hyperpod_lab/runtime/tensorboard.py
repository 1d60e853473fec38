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
SummaryWriter queues events for its own background thread (queue of :data:`MAX_QUEUE`; a
full queue would block the step); the writer is flushed when a checkpoint is saved and closed
(flushed) when the job finishes or the process tears down. See docs/tensorboard.md.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

MODES = ("off", "rank0", "all-ranks")
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
    if mode == "all-ranks":
        return os.path.join(job_dir, "tensorboard", f"rank-{rank}")
    if mode == "rank0" and rank == 0:
        return os.path.join(job_dir, "tensorboard")
    return None


def _number(v: Any) -> float | None:
    if hasattr(v, "numel") and hasattr(v, "item"):  # a one-element tensor
        v = v.item() if v.numel() == 1 else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


class TensorBoardLog:
    """One rank's SummaryWriter, opened lazily at the first step.

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
        self._cls = SummaryWriter
        self.path, self._purge_first = path, purge_first
        self._writer = None
        self._lock = threading.Lock()
        self._closed = False

    def _open(self, step: int):
        if self._writer is None:
            self._writer = self._cls(self.path, purge_step=step if self._purge_first else None,
                                     max_queue=MAX_QUEUE, flush_secs=FLUSH_SECS)
        return self._writer

    def step(self, step: int, loss: Any, step_s: float | None, metrics: dict[str, Any]) -> None:
        """Scalars of one step: ``loss``, ``steps_per_s`` and the numeric ``metrics``."""
        with self._lock:
            if self._closed:
                return
            w = self._open(step)
            value = _number(loss)
            if value is not None:
                w.add_scalar("loss", value, step)
            if step_s:
                w.add_scalar("steps_per_s", 1.0 / step_s, step)
            for name, v in metrics.items():
                value = _number(v)
                if value is not None:
                    w.add_scalar(str(name), value, step)

    def marker(self, tag: str, value: Any, step: int | None, flush: bool = False) -> None:
        """A scalar marker (``checkpoint/<tier>``, ``recovery/downtime_s``); ``flush``: write
        everything queued to the file now."""
        value = _number(value)
        with self._lock:
            if self._closed or step is None:
                return
            w = self._open(int(step))
            if value is not None:
                w.add_scalar(tag, value, int(step))
            if flush:
                w.flush()

    def close(self) -> None:
        """Flush and close (idempotent)."""
        with self._lock:
            self._closed = True
            if self._writer is not None:
                self._writer.close()
                self._writer = None
