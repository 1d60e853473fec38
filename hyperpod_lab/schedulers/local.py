"""Local backend: the same JobSpec as a torchrun job on this machine.

A scientist prototypes with ``--cluster local --procs-per-node 2`` and later submits the same
spec, unchanged, to a Slurm cluster. The job runs under ``hyperpod_lab.runtime.launch``
(torchrun plus our events) in its own session, wrapped by :mod:`._local_wrapper` which records
the exit code in ``<job_dir>/exit_code`` so state survives this process.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import signal
import subprocess
import sys

from hyperpod_lab.errors import JobStateError
from hyperpod_lab.jobs import JobStatus
from hyperpod_lab.schedulers.base import Scheduler
from hyperpod_lab.spec import JobSpec


def launch_argv(spec: JobSpec, job_dir: str, python: str, script: str) -> list[str]:
    """torchrun (via our launcher) for a single-node run of ``spec`` (pure). A checkpointless
    spec runs one replica group per node under a Lighthouse (:mod:`hyperpod_lab.runtime.ft_local`)."""
    restarts = spec.resiliency.max_retries if spec.resiliency.auto_resume else 0
    if spec.resiliency.recovery == "checkpointless":
        min_replicas = spec.elastic.min_nodes if spec.elastic.enabled else 1
        return [python, "-m", "hyperpod_lab.runtime.ft_local", f"--groups={spec.nodes}",
                f"--nproc-per-node={spec.procs_per_node}", f"--max-restarts={restarts}",
                f"--min-replicas={min_replicas}", script, *spec.args]
    return [python, "-m", "hyperpod_lab.runtime.launch", "--standalone", "--nnodes=1",
            f"--nproc-per-node={spec.world_size}",
            f"--max-restarts={spec.resiliency.max_retries if spec.resiliency.auto_resume else 0}",
            f"--log-dir={posixpath.join(job_dir, 'logs', 'torchrun')}", "--redirects=3", "--tee=3",
            script, *spec.args]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


class LocalScheduler(Scheduler):
    """Runs jobs as local processes; ``nodes x procs_per_node`` ranks on this machine."""

    def _argv(self, spec, job_id):
        return launch_argv(spec, self.job_dir(job_id), self.profile.python or sys.executable,
                           self.staged_script(spec, job_id))

    def _env(self, spec, job_id):
        env = dict(os.environ)
        d = self.job_dir(job_id)
        env.update(spec.env)
        env.update({"HYPERPOD_LAB_JOB_ID": job_id, "HYPERPOD_LAB_JOB_DIR": d,
                    "HYPERPOD_LAB_SPEC": posixpath.join(d, "spec.json"),
                    "HYPERPOD_LAB_SHARED_ROOT": self.profile.shared_root})
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def render(self, spec, job_id):
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(spec.env.items()))
        return (env + " " if env else "") + shlex.join(self._argv(spec, job_id)) + "\n"

    def submit(self, spec, job_id, script_bytes):
        d = self.stage(spec, job_id, script_bytes)
        out = open(os.path.join(d, "logs", "launcher.log"), "ab")
        p = subprocess.Popen([sys.executable, "-m", "hyperpod_lab.schedulers._local_wrapper", d, "--",
                              *self._argv(spec, job_id)],
                             env=self._env(spec, job_id), cwd=d, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return str(p.pid)

    def poll(self, records):
        out = {}
        for rec in records:
            try:
                code = int(open(os.path.join(rec.job_dir, "exit_code")).read().strip())
            except (FileNotFoundError, ValueError):
                code = None
            if code is not None:
                if os.path.exists(os.path.join(rec.job_dir, "cancelled")):
                    out[rec.job_id] = (JobStatus.CANCELLED, code, "cancelled")
                else:
                    out[rec.job_id] = (JobStatus.COMPLETED if code == 0 else JobStatus.FAILED, code, None)
            elif _alive(int(rec.native_id)):
                out[rec.job_id] = (JobStatus.RUNNING, None, None)
            else:
                out[rec.job_id] = (JobStatus.FAILED, None, "launcher exited without recording an exit code")
        return out

    def cancel(self, rec):
        open(os.path.join(rec.job_dir, "cancelled"), "w").close()
        # the job's launcher, and the agents ``scale`` started (each in a session of its own)
        pids = [rec.native_id] + [pid for j in self.joins(rec) for pid in j["native_id"].split(",")]
        for pid in pids:
            try:
                os.killpg(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass

    def logs(self, rec, rank=None):
        if rank is not None:
            return self.rank_log(rec, rank)
        try:
            return open(os.path.join(rec.job_dir, "logs", "launcher.log"), errors="replace").read()
        except FileNotFoundError:
            return ""

    def _start_join(self, rec, spec, offset, add_nodes, index):
        """``add_nodes`` more replica-group agents joining the job's Lighthouse; their pids."""
        from hyperpod_lab.runtime.ft_local import agent_argv, group_env

        pids = []
        for g in range(offset, offset + add_nodes):
            env = {**self._env(spec, rec.job_id), **group_env(g, spec.nodes)}
            out = open(os.path.join(rec.job_dir, "logs", f"join-group-{g}.log"), "ab")
            p = subprocess.Popen(agent_argv(self.profile.python or sys.executable, spec.procs_per_node,
                                            spec.resiliency.max_retries,
                                            os.path.join(rec.job_dir, "logs", "torchrun", f"group-{g}"),
                                            self.staged_script(spec, rec.job_id), spec.args),
                                 env=env, cwd=rec.job_dir, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            out.close()
            pids.append(p.pid)
        return ",".join(map(str, pids))

    def inject_fault(self, rec, rank):
        info = self.rank_info(rec, rank)
        try:
            os.kill(int(info["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            raise JobStateError(f"rank {rank} (pid {info['pid']}) of job {rec.job_id} is not running") from None
        return info
