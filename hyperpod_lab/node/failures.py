"""What a torchrun worker failure says, read without torch: the launch agent and the storm guard
both pick a root cause and word its reason the same way (duck-typed over torch's
``torch.distributed.elastic.multiprocessing.api.ProcessFailure``: ``exitcode``, ``error_file``,
``timestamp``, ``message``, ``error_file_data``)."""

from __future__ import annotations

import os
import signal
from typing import Any


def root_cause_key(global_rank: int, failure: Any) -> tuple:
    """Sort key of a torchrun ``ProcessFailure`` for the root cause: a signal other than SIGTERM
    first, then an exit code, then SIGTERM (a consequence); older error files first, then the
    lowest global rank. Returns ``(category, error-file mtime in seconds, rank)``."""
    if failure.exitcode == -signal.SIGTERM:
        category = 2
    elif failure.exitcode < 0:
        category = 0
    else:
        category = 1
    try:
        when = os.path.getmtime(failure.error_file)  # ns resolution; the recorded timestamp has 1 s
    except (OSError, TypeError):
        when = float(getattr(failure, "timestamp", 0) or 0)
    return (category, when, global_rank)


def failure_reason(failure: Any, sig: str | None) -> str:
    """A one-line reason for a ``ProcessFailure``: the recorded exception's last line if any."""
    msg = failure.message
    if isinstance(msg, dict):
        msg = msg.get("message", "")
    lines = [ln.strip() for ln in str(msg or "").splitlines() if ln.strip()]
    if lines and failure.error_file_data and "To enable traceback" not in lines[-1]:
        return lines[-1][:500]
    if sig:
        return f"worker killed by {sig}"
    return f"worker exited with code {failure.exitcode}"
