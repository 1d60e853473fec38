"""Helpers for tests that act on the dev cluster's Slurm jobs as an operator (or a failing node)
would: scontrol, and the job's processes on this host (both dev nodes run on it)."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def scontrol(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True)


def job_pids(slurm_job_id, node: str | None = None) -> list[int]:
    """PIDs of this host's processes that belong to Slurm job ``slurm_job_id`` (on ``node`` if
    given), read from each process's environment (srun sets SLURM_JOB_ID and SLURMD_NODENAME)."""
    want = {f"SLURM_JOB_ID={slurm_job_id}".encode()}
    if node:
        want.add(f"SLURMD_NODENAME={node}".encode())
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            pids.append(int(entry))
    return pids


def kill_node_processes(slurm_job_id, node: str) -> None:
    """A node that dies takes its processes with it: SIGKILL the job's processes on ``node``."""
    for pid in job_pids(slurm_job_id, node):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_until_gone(slurm_job_id, timeout_s: float = 60.0) -> None:
    """Wait until no process of the job's previous run is left on this host. Slurm delays a
    requeued job's start until the old run is gone; a test that releases it early
    (``StartTime=now``) waits for that itself, and for the next whole second."""
    deadline = time.monotonic() + timeout_s
    left = job_pids(slurm_job_id)
    while left:
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of Slurm job {slurm_job_id} still alive after {timeout_s} s: {left}")
        time.sleep(0.2)
        left = job_pids(slurm_job_id)
    # slurmd revoked the old run's credential (in whole seconds) before its processes ended, and
    # refuses a credential created in that same second ("Job credential revoked": Slurm's
    # src/common/slurm_cred.c, ``cred->ctime <= j->revoked``), so the release waits for the next one
    time.sleep(1.05 - time.time() % 1.0)


def wait_pending(client, job_id: str, timeout_s: float = 20.0) -> None:
    """Wait until the job is back in the queue (requeued)."""
    deadline = time.monotonic() + timeout_s
    while client.status(job_id).status != "pending":
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} was not requeued within {timeout_s} s: {client.status(job_id)}")
        time.sleep(0.2)


class Follow:
    """A job's events as they arrive, read through the client's EventReader."""

    def __init__(self, client, job_id: str):
        self.client, self.job_id = client, job_id
        self.reader = client.event_reader(job_id)
        self.events: list = []

    def until(self, pred, what: str, timeout: float = 240) -> None:
        """Read events until ``pred()`` holds; fail after ``timeout`` seconds, or as soon as the job
        failed for good (a ``job.failed`` event without requeue), with the log tail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.events.extend(self.reader.poll())
            if pred():
                return
            ended = [e for e in self.events if e.kind == "job.failed" and not e.data.get("requeue")]
            if ended:
                raise AssertionError(f"the job failed while waiting for {what}: {ended[-1].data.get('reason')}\n"
                                     f"{self.client.logs(self.job_id)[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {[e.kind for e in self.events][-30:]}\n"
                             f"{self.client.logs(self.job_id)[-4000:]}")

    def step(self) -> int:
        return max([e.data["step"] for e in self.events if e.kind == "step"], default=-1)

    def kinds(self, kind: str, **match) -> list:
        return [e for e in self.events if e.kind == kind and all(e.data.get(k) == v for k, v in match.items())]

    def node_marked_down(self, node: str, reason: str, replicas_left: int = 1) -> tuple[float, dict, dict]:
        """Three more steps, then Slurm marks ``node`` DOWN (``scontrol update State=DOWN``); wait
        until the job goes on with ``replicas_left`` replica groups and the supervisor reported the
        node. Returns ``(time of the DOWN, the supervisor's fault.detected data, the first
        elastic.scaled data after it)``."""
        target = self.step() + 3
        self.until(lambda: self.step() >= target, "every group training before the node is lost")
        t = time.time()
        out = scontrol("update", f"NodeName={node}", "State=DOWN", f"Reason={reason}")
        assert out.returncode == 0, out.stderr
        self.until(lambda: [e for e in self.kinds("elastic.scaled") if e.time > t
                            and e.data["new_replicas"] == replicas_left], f"the job going on after {node} went down")
        # the supervisor reports the node when its srun step ends, which can be after the survivors'
        # quorum has already gone on without it (the events come from different writers, in no set order)
        self.until(lambda: [e for e in self.kinds("fault.detected", reason="node down") if e.time > t],
                   f"the supervisor's report of {node} down", timeout=120)
        down = [e for e in self.kinds("fault.detected", reason="node down") if e.time > t][0].data
        scaled = [e for e in self.kinds("elastic.scaled") if e.time > t][0].data
        return t, down, scaled
