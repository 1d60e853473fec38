"""The dev-cluster scene the queue-view tests look at (test helper, not product code): a held
(so always PENDING) job of another Unix user with a hostile name, a held job of ours, and node n3
DOWN with an operator's reason. :func:`queue_scene` sets it up and restores the cluster afterwards
(jobs cancelled, n3 resumed), whatever the test did.

n3 stays DOWN only while its slurmd does not answer: the dev cluster's ``ReturnToService=2``
(slurm.conf(5): "A DOWN node will become available for use upon registration with a valid
configuration") returned it to service within 0-7 s of ``State=DOWN`` (slurmctld.log:
``node_did_resp: node n3 returned to service``). So its slurmd is stopped (SIGSTOP) first, as a
hung node's would be, and continued afterwards.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess

OTHER_USER = "hplother"
OTHER_NAME = "a|b c <img src=x onerror=alert(1)>"  # '|', spaces and markup: one field, shown as text
OUR_NAME = "ours waits"
DOWN_NODE = "n3"
DOWN_REASON = "hpl queue test"


def ensure_other_user() -> None:
    """Create the Unix user :data:`OTHER_USER` (no home, no login shell) when it is missing."""
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", OTHER_USER], check=True, capture_output=True)


def _sbatch(*args: str) -> str:
    # --hold: the job stays PENDING (JobHeldUser) until released; it never runs
    res = subprocess.run(["sbatch", "--parsable", "--hold", "-D", "/tmp", "-o", "/dev/null", *args,
                          "--wrap", "sleep 60"], capture_output=True, text=True, check=True)
    return res.stdout.strip().split(";")[0]


@contextlib.contextmanager
def queue_scene(reason: str = DOWN_REASON):
    """Yields ``{"other": slurm id, "ours": slurm id, "node": "n3", "reason": reason}``."""
    from hyperpod_lab import devcluster

    ensure_other_user()
    ids: list[str] = []
    slurmd = None
    try:
        other = _sbatch(f"--uid={OTHER_USER}", f"--gid={OTHER_USER}", f"--job-name={OTHER_NAME}")
        ids.append(other)
        ours = _sbatch(f"--job-name={OUR_NAME}")
        ids.append(ours)
        slurmd = devcluster.node_pid(DOWN_NODE)
        os.kill(slurmd, signal.SIGSTOP)
        # scontrol(1) update: "State=DOWN ... Reason=<reason>" (one argv word, no shell)
        subprocess.run(["scontrol", "update", f"NodeName={DOWN_NODE}", "State=DOWN", f"Reason={reason}"],
                       check=True, capture_output=True)
        yield {"other": other, "ours": ours, "node": DOWN_NODE, "reason": reason}
    finally:
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True)
        if slurmd is not None:
            os.kill(slurmd, signal.SIGCONT)
        # "Invalid node state transition" when it is already up: fine
        subprocess.run(["scontrol", "update", f"NodeName={DOWN_NODE}", "State=RESUME"], capture_output=True)
