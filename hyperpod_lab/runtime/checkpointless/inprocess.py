"""In-process restart of a checkpointless step: the escalation ladder's first rung.

A recoverable fault in a rank's step (an exception in its forward/backward or data loading, an
``inject-fault --kind exception``) does not end the process. Inside
``with ft.recoverable():`` (:meth:`~hyperpod_lab.runtime.checkpointless.ft.Checkpointless.recoverable`)
the exception is caught, the rank still takes part in the step's all-reduce (so no peer waits on
it), and the reduced failure count makes *every* replica group drop that step: no group commits
it, no optimizer steps, no state diverges and nothing needs healing. The next ``begin_step``
redoes the same step, with the same samples, in the same live process: no new interpreter, torch
import, model build, data-loader start or heal. The job loses the failed attempt, about one step.

The ladder (HyperPod's ``numRestartBeforeFullJobRestart`` / ``maxFullJobRestarts`` /
``evalPeriodSeconds``; NVRx's ``--ft-max-no-progress-cycles``), each level an event
``recovery.started`` {level}:

1. **in-process** (this module): at most ``resiliency.in_process_restarts`` restarts within
   ``resiliency.restart_window_s`` seconds (sliding window);
2. **process**: beyond that budget, or for a fault that cannot be caught in process (a kill, a
   segfault, a hang the watchdog kills), or in a replica group of several ranks (below), the
   exception propagates, the process ends, and the node's launch agent restarts its workers
   (``--max-restarts``), which heal from a live peer;
3. **job**: the supervisor relaunches the group on a spare, or Slurm requeues the job.

**No progress**: when ``resiliency.storm_restarts`` (K) in-process restarts in a row gained no
committed step, the next failed step stops the job: the rank whose step failed emits
``fault.detected`` {reason: "no progress", level: "in-process", restarts: K}, the storm record
``storm.json`` is written (``job.failed``, :mod:`hyperpod_lab.node.storm`) and every rank of every
group, having seen the same reduced failure count, exits with
:data:`~hyperpod_lab.node.storm.STORM_EXIT`; no launch agent restarts them.

Why not NVRx's ``inprocess.Wrapper`` (nvidia-resiliency-ext 0.7.0): it restarts the wrapped
function on *all* ranks at once (its usage guide), tearing down and re-creating the process
group, which torchft already reconfigures at every quorum; it requires NCCL >= 2.26.2 (no
gloo/CPU path to test here); and its docs state it is "not fully compatible with modern
torch.distributed.run, because it automatically terminates all local workers upon any local
worker process failure", which is our launch agent's job. The step-level redo here keeps the
other groups' processes and groups untouched and reuses torchft's commit protocol.

Replica groups of several ranks (FSDP2/HSDP): a rank that fails mid-step may leave its group's
peers inside an in-group collective (an FSDP2 all-gather or reduce-scatter) that it will never
join; gloo cannot abort one (NCCL's ``ncclCommAbort`` can; not done here, no GPU to test it). So
in a group of several ranks the exception goes to the process level, with the reason in the
``recovery.started`` event of the launch agent and in the rank's log.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

DEFAULT_IN_PROCESS_RESTARTS = 5
"""In-process restarts allowed within the window when the spec sets none."""
DEFAULT_RESTART_WINDOW_S = 3600.0
"""The window (seconds) the in-process budget counts over when the spec sets none."""

LEVEL_IN_PROCESS = "in-process"
LEVEL_PROCESS = "process"
LEVEL_JOB = "job"
RECOVERY_LEVELS = (LEVEL_IN_PROCESS, LEVEL_PROCESS, LEVEL_JOB)
"""``recovery.started`` ``level`` values, lowest first (docs/events.md)."""

NO_PROGRESS = "no progress"


@dataclass(frozen=True)
class Verdict:
    """What to do with one failed step: ``action`` is ``"in-process"`` (restart in place),
    ``"process"`` (let the exception end the process) or ``"no progress"`` (stop the job);
    ``reason`` says why, for the events and the log."""

    action: str
    reason: str


class InProcessRestarts:
    """The in-process rung's budget and no-progress count for one rank.

    Args:
        budget: in-process restarts allowed within ``window_s`` (0 disables the rung).
        window_s: seconds the budget counts over (a sliding window).
        no_progress_after: K: in-process restarts in a row without a committed step after
            which the next failed step stops the job (``resiliency.storm_restarts``).
        clock: a monotonic clock, seconds (tests pass their own).
    """

    def __init__(self, budget: int = DEFAULT_IN_PROCESS_RESTARTS, window_s: float = DEFAULT_RESTART_WINDOW_S,
                 no_progress_after: int = 3, clock=time.monotonic):
        self.budget, self.window_s, self.k, self.clock = int(budget), float(window_s), int(no_progress_after), clock
        self._times: deque[float] = deque()
        self.without_progress = 0
        """In-process restarts since the last committed step."""
        self.total = 0
        """In-process restarts of this process so far."""

    @classmethod
    def from_spec(cls, spec) -> "InProcessRestarts":
        """From a :class:`~hyperpod_lab.spec.JobSpec`'s ``resiliency`` (or None: the defaults)."""
        res = getattr(spec, "resiliency", None)
        if res is None:
            return cls()
        return cls(res.in_process_restarts, res.restart_window_s, res.storm_restarts)

    def committed(self) -> None:
        """A step was committed: progress; the no-progress count starts over."""
        self.without_progress = 0

    def failed_step(self, *, own: bool, can_restart_in_process: bool = True, why_not: str = "") -> Verdict:
        """A step of the job was dropped because a rank's step raised (``own``: this rank's; else
        another rank's, as the step's reduced failure count shows). Every rank of every group
        calls it for the same dropped steps, so they reach ``"no progress"`` together.

        Returns:
            The verdict: ``"no progress"`` when K in-process restarts in a row already gained no
            step; for ``own`` faults ``"process"`` when the rung cannot serve (``why_not``) or its
            budget is spent, else ``"in-process"``; for another rank's fault ``"in-process"`` (this
            rank only redoes the step).
        """
        if self.without_progress >= self.k:
            return Verdict(NO_PROGRESS, f"{self.without_progress} in-process restarts in a row gained no step "
                                        f"(resiliency.storm_restarts = {self.k})")
        self.without_progress += 1
        if not own:
            return Verdict(LEVEL_IN_PROCESS, "another rank's step failed: the step is redone")
        if not can_restart_in_process:
            return Verdict(LEVEL_PROCESS, why_not)
        now = self.clock()
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
        if len(self._times) >= self.budget:
            return Verdict(LEVEL_PROCESS, f"in-process budget spent: {len(self._times)} restarts within "
                                          f"{self.window_s:g} s (resiliency.in_process_restarts = {self.budget})")
        self._times.append(now)
        self.total += 1
        return Verdict(LEVEL_IN_PROCESS, f"in-process restart {self.total}: the step is redone in this process")
