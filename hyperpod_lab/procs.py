"""Signal a job's process only after checking that it is one (Linux ``/proc``; standard library).

Fault injection and cancel find pids in files on shared storage (``ranks/rank-R.json``,
``joins.json``, the local launcher's id). A pid read from a file may have been reused by an
unrelated process since, or the file may have been written by someone else: before any signal,
:func:`verify` checks that

* the pid is > 1 (``kill(0)``, ``kill(-1)`` and ``kill(1)`` would hit a process group, every
  process of the user, or init);
* the process lives and its environment carries ``HYPERPOD_LAB_JOB_ID=<job id>`` (every
  backend exports it to the whole job: launcher, agents, workers);
* where the job recorded it, the process's start time (``/proc/<pid>/stat`` field 22, clock
  ticks since boot) is the recorded one, so a reused pid is refused even inside the job.

On a cluster node it runs as ``python -m hyperpod_lab.procs --job-id J --pid P [--start T]
[--signal KILL]`` (through ``srun --overlap`` on the rank's node): exit status 0 after the
signal, 3 when refused (the reason on stderr).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from hyperpod_lab.errors import JobStateError
from hyperpod_lab.jobdir import ENV_JOB_ID

REFUSED_EXIT = 3


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` from field 3 (state) on, or None when there is no such process."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if b")" not in stat:
        return None
    return stat.rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    None when there is no such process."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 overall; fields[0] is field 3 (state)


def is_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting to be reaped)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != b"Z"


def process_job_id(pid: int) -> str | None:
    """``$HYPERPOD_LAB_JOB_ID`` in the environment ``pid`` started with, or None (no such
    process, not ours to read, or no job id)."""
    try:
        with open(f"/proc/{int(pid)}/environ", "rb") as f:
            env = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    prefix = ENV_JOB_ID.encode() + b"="
    for item in env.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def verify(pid: object, job_id: str, start: int | None = None) -> int:
    """Check that ``pid`` is a live process of job ``job_id``; return it as an int.

    Args:
        pid: the pid as read from a job file (any type; it is validated).
        job_id: the hyperpod-lab job id.
        start: the process's recorded start time (clock ticks since boot), if the job recorded it.

    Raises:
        JobStateError: pid not an integer > 1, no such process, a process of another job or of
            none, or a different process under a reused pid; the message names which.
    """
    if isinstance(pid, bool) or not isinstance(pid, (int, str)) or not str(pid).strip().isdigit():
        raise JobStateError(f"job {job_id}: {pid!r} is not a process id; the job's files may be damaged")
    pid = int(pid)
    if pid <= 1:
        raise JobStateError(f"job {job_id}: refusing to signal pid {pid} (0, 1 and negative pids name process "
                            "groups, every process, or init); the job's files may be damaged")
    actual_start = process_start(pid)
    if actual_start is None:
        raise JobStateError(f"job {job_id}: process {pid} is not running")
    owner = process_job_id(pid)
    if owner != job_id:
        whose = f"job {owner}" if owner else "no hyperpod-lab job"
        raise JobStateError(f"job {job_id}: process {pid} belongs to {whose}; refusing to signal it "
                            "(its pid was reused, or the job's files name a process that is not the job's)")
    if start is not None and int(start) != actual_start:
        raise JobStateError(f"job {job_id}: process {pid} started at tick {actual_start}, not at the recorded "
                            f"tick {start}: its pid was reused; refusing to signal it")
    return pid


def signal_job_process(pid: object, job_id: str, sig: int, start: int | None = None, group: bool = False) -> bool:
    """:func:`verify`, then send ``sig`` to the process (``group``: to its process group, which
    must be led by it). Returns False when the process ended between the check and the signal.

    Raises:
        JobStateError: from :func:`verify`.
    """
    pid = verify(pid, job_id, start)
    try:
        if group:
            if os.getpgid(pid) != pid:
                raise JobStateError(f"job {job_id}: process {pid} does not lead a process group; refusing to "
                                    "signal a group it does not lead")
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hyperpod_lab.procs", description=__doc__.split("\n\n")[0])
    p.add_argument("--job-id", required=True)
    p.add_argument("--pid", required=True)
    p.add_argument("--start", type=int, default=None, help="recorded start time, clock ticks since boot")
    p.add_argument("--signal", default="KILL", help="signal name without SIG (default KILL)")
    a = p.parse_args(argv)
    try:
        sig = signal.Signals["SIG" + a.signal.upper().removeprefix("SIG")]
        if not signal_job_process(a.pid, a.job_id, sig, a.start):
            print(f"process {a.pid} ended before the signal", file=sys.stderr)
            return 1
    except KeyError:
        print(f"unknown signal {a.signal!r}", file=sys.stderr)
        return 2
    except JobStateError as e:
        print(str(e), file=sys.stderr)
        return REFUSED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
