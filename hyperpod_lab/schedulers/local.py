"""Local backend: the same JobSpec as a torchrun job on this machine.

A scientist prototypes with ``--cluster local --procs-per-node 2`` and later submits the same
spec, unchanged, to a Slurm cluster. The job runs under ``hyperpod_lab.node.launch``
(torchrun plus our events) in its own session, wrapped by :mod:`._local_wrapper` which records
the exit code in ``<job_dir>/exit_code`` so state survives this process.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys

from hyperpod_lab.errors import JobStateError
from hyperpod_lab.jobdir import ENV_PREFIX, JobPaths, effective_restarts, ft_local_argv, group_env, job_env, launcher_argv
from hyperpod_lab.procs import is_running, process_start, signal_job_process
from hyperpod_lab.schedulers.base import LogChunk, Scheduler, read_log_range
from hyperpod_lab.spec import RECOVERY_CHECKPOINTLESS, JobSpec
from hyperpod_lab.submit.jobs import JobStatus


def launch_argv(spec: JobSpec, job_dir: str, python: str, script: str) -> list[str]:
    """torchrun (via our launcher) for a single-node run of ``spec`` (pure). A checkpointless
    spec runs one replica group per node under a Lighthouse (``python -m
    hyperpod_lab.node.ft_local``, started as a process: the submit side never imports torch)."""
    restarts = effective_restarts(spec.resiliency)
    if spec.resiliency.recovery == RECOVERY_CHECKPOINTLESS:
        return ft_local_argv(python, script, spec.args, groups=spec.nodes, nproc_per_node=spec.procs_per_node,
                             max_restarts=restarts,
                             min_replicas=spec.elastic.min_nodes if spec.elastic.enabled else 1)
    return launcher_argv(python, script, spec.args, standalone=True, nproc_per_node=spec.world_size,
                         max_restarts=restarts, log_dir=JobPaths(job_dir).torchrun_logs)


def _private_log(path: str):
    """``path`` opened for appending, created 0600 (private to the user)."""
    return open(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")


class LocalScheduler(Scheduler):
    """Runs jobs as local processes; ``nodes x procs_per_node`` ranks on this machine."""

    #: a native id is the launcher wrapper's pid: digits, no leading zero (:meth:`Scheduler.native_id`)
    NATIVE_ID = re.compile(r"[1-9][0-9]{0,9}")
    NATIVE_ID_FORM = "a process id: digits only"

    def _argv(self, spec, job_id):
        return launch_argv(spec, self.job_dir(job_id), self.profile.python or sys.executable,
                           self.staged_script(spec, job_id))

    def _env(self, spec, job_id, secrets):
        """The job's environment, built up from a minimal one, never a copy of this process's (the
        submitting process may be the Jupyter server, holding its own credentials and tokens):

        1. from this process: PATH, HOME, USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ, TMPDIR,
           PYTHONPATH, VIRTUAL_ENV, LD_LIBRARY_PATH, CUDA_VISIBLE_DEVICES and hyperpod-lab's own
           HYPERPOD_LAB_* settings (timeouts, intervals), those that are set;
        2. the spec's ``env``; 3. ``secrets`` (``spec.secret_env``'s values, as the submitting side
           resolved and allowed them); 4. the job's HYPERPOD_LAB_* variables; OMP_NUM_THREADS=1
           unless set. A job that needs another variable names it in ``env`` or ``secret_env``.
        """
        names = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH",
                 "VIRTUAL_ENV", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")
        env = {k: v for k, v in os.environ.items() if k in names or k.startswith(("LC_", ENV_PREFIX))}
        paths = self.paths(job_id)
        env.update(spec.env)
        env.update(secrets)
        env.update(job_env(job_id, paths.folder, paths.spec, self.profile.shared_root))
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def render(self, spec, job_id):
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(spec.env.items()))
        return (env + " " if env else "") + shlex.join(self._argv(spec, job_id)) + "\n"

    def submit(self, spec, job_id, script_bytes, secrets=None):
        d = self.stage(spec, job_id, script_bytes)
        out = _private_log(JobPaths(d).launcher_log)
        p = subprocess.Popen([sys.executable, "-m", "hyperpod_lab.schedulers._local_wrapper", d, "--",
                              *self._argv(spec, job_id)],
                             env=self._env(spec, job_id, secrets or {}), cwd=d, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return str(p.pid)

    def poll(self, records):
        out = {}
        for rec in records:
            try:
                code = int(open(JobPaths(rec.job_dir).exit_code).read().strip())
            except (FileNotFoundError, ValueError):
                code = None
            if code is not None:
                if os.path.exists(JobPaths(rec.job_dir).cancelled):
                    out[rec.job_id] = (JobStatus.CANCELLED, code, "cancelled")
                else:
                    out[rec.job_id] = (JobStatus.COMPLETED if code == 0 else JobStatus.FAILED, code, None)
            elif not self.NATIVE_ID.fullmatch(str(rec.native_id).strip()):  # never int()'d, never signalled
                out[rec.job_id] = (JobStatus.UNKNOWN, None, f"the job record's native id {str(rec.native_id)[:100]!r} "
                                                            f"is not a process id (digits); it is not used")
            elif is_running(int(rec.native_id)):
                out[rec.job_id] = (JobStatus.RUNNING, None, None)
            else:
                out[rec.job_id] = (JobStatus.FAILED, None, "launcher exited without recording an exit code")
        return out

    def cancel(self, rec):
        """SIGTERM the job's launcher wrapper and the agents ``scale`` started, each after
        :func:`hyperpod_lab.procs.verify`: a pid in ``joins.json`` that is not the job's is
        refused (JobStateError naming it) after the job's own were signalled.

        One SIGTERM per process, never to a whole process group: the wrapper passes it on to
        the launcher (or the checkpointless driver, which passes it to each agent), and an agent
        shuts its workers down. torchrun's agent that gets a second SIGTERM during that shutdown
        hangs with its workers unreaped (seen with a group-wide signal: each agent got one from
        the group and one from the driver)."""
        own = self.native_id(rec.native_id, f"the job record of {rec.job_id} (native_id)")
        open(JobPaths(rec.job_dir).cancelled, "w").close()
        pids = [own] + [pid for j in self.joins(rec) for pid in str(j.get("native_id", "")).split(",")]
        refused = []
        for pid in pids:
            try:
                signal_job_process(pid, rec.job_id, signal.SIGTERM)
            except JobStateError as e:
                if not (str(pid).strip().isdigit() and int(pid) > 1 and process_start(int(pid)) is None):
                    refused.append(str(e))  # alive but not the job's, or not a pid at all
        if refused:
            raise JobStateError("; ".join(refused))

    def log_range(self, rec, rank=None, offset=None, length=None):
        """A byte range of the launcher's log (or of one rank's log): one bounded read."""
        if rank is not None:
            return self.rank_log(rec, rank, offset, length)
        try:
            return read_log_range(self.remote, JobPaths(rec.job_dir).launcher_log, offset, length)
        except FileNotFoundError:
            return LogChunk("", 0, 0, 0)

    def _start_join(self, rec, spec, offset, add_nodes, index, secrets):
        """``add_nodes`` more replica-group agents joining the job's Lighthouse; their pids."""
        paths = JobPaths(rec.job_dir)
        pids = []
        for g in range(offset, offset + add_nodes):
            env = {**self._env(spec, rec.job_id, secrets), **group_env(g, spec.nodes)}
            out = _private_log(paths.group_log(g))
            p = subprocess.Popen(launcher_argv(self.profile.python or sys.executable,
                                               self.staged_script(spec, rec.job_id), spec.args, standalone=True,
                                               nproc_per_node=spec.procs_per_node,
                                               max_restarts=effective_restarts(spec.resiliency), monitor_interval=0.1,
                                               log_dir=paths.group_torchrun_logs(g)),
                                 env=env, cwd=rec.job_dir, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            out.close()
            pids.append(p.pid)
        return ",".join(map(str, pids))

    def health(self):
        """This machine as the one node (``idle``, its CPU count); see :meth:`Scheduler.health`."""
        return {"state": "up", "error": None, "nodes": [
            {"name": socket.gethostname(), "state": "idle", "cpus": os.cpu_count() or 1, "partitions": []}]}

    def _kill_rank(self, rec, rank):
        """``inject-fault --kind kill``: SIGKILL rank ``rank`` after :func:`hyperpod_lab.procs.verify`
        (the pid is the job's, its start time the recorded one). Raises JobStateError otherwise."""
        info = self.rank_info(rec, rank)
        if not signal_job_process(info.get("pid"), rec.job_id, signal.SIGKILL, start=info.get("proc_start")):
            raise JobStateError(f"rank {rank} (pid {info['pid']}) of job {rec.job_id} is not running")
        return info

    def _stop_rank(self, rec, rank):
        """``inject-fault --kind hang``: SIGSTOP rank ``rank`` after :func:`hyperpod_lab.procs.verify`
        (as :meth:`_kill_rank`); the launch agent's watchdog must catch it. Raises JobStateError."""
        info = self.rank_info(rec, rank)
        if not signal_job_process(info.get("pid"), rec.job_id, signal.SIGSTOP, start=info.get("proc_start")):
            raise JobStateError(f"rank {rank} (pid {info['pid']}) of job {rec.job_id} is not running")
        return {**info, "how": f"SIGSTOP to pid {info['pid']}"}

    def _fail_node(self, rec, rank):
        """``inject-fault --kind node``: there is no scheduler here to fail a node. Raises JobStateError."""
        raise JobStateError("the local backend has no nodes; use --kind kill or exception")
