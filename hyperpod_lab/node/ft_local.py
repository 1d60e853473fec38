"""A checkpointless job on one machine: the job's torchft Lighthouse plus one launch agent per
data-parallel replica group — what the Slurm backend's batch script does across nodes.

    python -m hyperpod_lab.node.ft_local --groups 2 --nproc-per-node 1 --max-restarts 3 \\
        [--min-replicas 1] SCRIPT [ARGS...]

Runs in the job's environment (``$HYPERPOD_LAB_JOB_DIR`` ...). Each group's agent is
``python -m hyperpod_lab.node.launch --standalone`` with ``$HYPERPOD_LAB_REPLICA_GROUP`` set
and the node name ``local-g<G>``. Exit status 0 when the training finished (a ``finished``
event), even if some groups were lost on the way; else the first non-zero agent status.
SIGTERM stops every agent and the Lighthouse.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from hyperpod_lab.jobdir import ENV_JOB_DIR, JobPaths, group_env, launcher_argv, lighthouse_argv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hyperpod_lab.node.ft_local")
    p.add_argument("--groups", type=int, required=True)
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--max-restarts", type=int, default=3)
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    paths = JobPaths.from_env()
    if paths is None:
        p.error(f"${ENV_JOB_DIR} is not set (run it in a job's environment)")
    from hyperpod_lab.node.lighthouse import START_TIMEOUT_S, read_address

    # the supervised Lighthouse, as on Slurm: a crashed one is restarted on the same port
    with open(paths.lighthouse_log, "ab") as log:
        lighthouse = subprocess.Popen(lighthouse_argv(sys.executable, paths.folder, min_replicas=a.min_replicas,
                                                      host="127.0.0.1"),
                                      stdout=log, stderr=subprocess.STDOUT)
    read_address(paths.folder, timeout_s=START_TIMEOUT_S + 30)  # published: the agents find it
    agents = [subprocess.Popen(launcher_argv(sys.executable, a.script, a.args, nproc_per_node=a.nproc_per_node,
                                             max_restarts=a.max_restarts, log_dir=paths.group_torchrun_logs(g),
                                             nnodes=1, standalone=True, monitor_interval=0.1),
                               env={**os.environ, **group_env(g, a.groups)}) for g in range(a.groups)]

    def stop(*_):
        for proc in agents:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    codes = [proc.wait() for proc in agents]
    lighthouse.terminate()
    lighthouse.wait()
    from hyperpod_lab.jobdir import job_finished

    if job_finished(paths.folder):
        return 0
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
