"""A checkpointless job on one machine: the job's torchft Lighthouse plus one launch agent per
data-parallel replica group — what the Slurm backend's batch script does across nodes.

    python -m hyperpod_lab.runtime.ft_local --groups 2 --nproc-per-node 1 --max-restarts 3 \\
        [--min-replicas 1] SCRIPT [ARGS...]

Runs in the job's environment (``$HYPERPOD_LAB_JOB_DIR`` ...). Each group's agent is
``python -m hyperpod_lab.runtime.launch --standalone`` with ``$HYPERPOD_LAB_REPLICA_GROUP`` set
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

from hyperpod_lab.runtime.context import ENV_JOB_DIR, ENV_REPLICA_GROUP


def agent_argv(python: str, nproc_per_node: int, max_restarts: int, log_dir: str, script: str,
               args: list[str]) -> list[str]:
    """The launch-agent command of one replica group (pure)."""
    return [python, "-m", "hyperpod_lab.runtime.launch", "--standalone", "--nnodes=1",
            f"--nproc-per-node={nproc_per_node}", f"--max-restarts={max_restarts}", "--monitor-interval=0.1",
            f"--log-dir={log_dir}", "--redirects=3", "--tee=3", script, *args]


def group_env(group: int, groups: int) -> dict[str, str]:
    """The variables that make an agent replica group ``group`` of ``groups`` initial ones."""
    return {ENV_REPLICA_GROUP: str(group), "HYPERPOD_LAB_REPLICA_GROUPS": str(groups),
            "SLURMD_NODENAME": f"local-g{group}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hyperpod_lab.runtime.ft_local")
    p.add_argument("--groups", type=int, required=True)
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--max-restarts", type=int, default=3)
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    job_dir = os.environ[ENV_JOB_DIR]
    from hyperpod_lab.runtime.lighthouse import read_address

    # the supervised Lighthouse, as on Slurm: a crashed one is restarted on the same port
    with open(os.path.join(job_dir, "logs", "lighthouse.log"), "ab") as log:
        lighthouse = subprocess.Popen([sys.executable, "-m", "hyperpod_lab.runtime.lighthouse", "--job-dir", job_dir,
                                       f"--min-replicas={a.min_replicas}", "--host", "127.0.0.1"],
                                      stdout=log, stderr=subprocess.STDOUT)
    read_address(job_dir, timeout_s=30)  # published: the agents find it
    log_dir = os.path.join(job_dir, "logs", "torchrun")
    agents = [subprocess.Popen(agent_argv(sys.executable, a.nproc_per_node, a.max_restarts,
                                          os.path.join(log_dir, f"group-{g}"), a.script, a.args),
                               env={**os.environ, **group_env(g, a.groups)}) for g in range(a.groups)]

    def stop(*_):
        for proc in agents:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    codes = [proc.wait() for proc in agents]
    lighthouse.terminate()
    lighthouse.wait()
    from hyperpod_lab.runtime.ft import _job_finished

    if _job_finished(job_dir):
        return 0
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
