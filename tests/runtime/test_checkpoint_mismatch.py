"""An intact checkpoint that does not fit the training state is an error, not a reason to start
over (found while building the data path: a loader state of another shape made DCP's load fail
with "Missing key", the persistent tier called the step corrupt, set it aside, started the job at
step 0 and its next saves overwrote the newer steps).

A real single-process job (``hp.init`` on a job directory) saves a ``Linear(4, 4)`` for three
steps; a second start restores into a ``Linear(4, 5)``: it must raise
``CheckpointStateMismatch`` naming the step and the fix, and leave every checkpoint file as it
was, with no ``checkpoint.corrupt`` event. Restoring into the right shape then still works.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

JOB = r"""
import sys, torch
import hyperpod_lab.runtime as hp
from hyperpod_lab.errors import CheckpointStateMismatch

width, mode = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
with hp.init() as ctx:
    model = torch.nn.Linear(4, width)
    ckpt = hp.Checkpointer(ctx, every_steps=1, keep_last=3)
    if mode == "save":
        for step in range(3):
            ckpt.maybe_save(step, {"model": model})
        ckpt.wait()
    else:
        try:
            start = ckpt.restore({"model": model})
        except CheckpointStateMismatch as e:
            print("MISMATCH", e)
            sys.exit(7)
        print("RESTORED", start)
"""


def run(job_dir: str, width: int, mode: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HYPERPOD_LAB_JOB_DIR=job_dir, HYPERPOD_LAB_JOB_ID="mismatch-job", OMP_NUM_THREADS="1",
               PYTHONPATH=ROOT + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURMD_NODENAME"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-c", JOB, str(width), mode], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def tree(root: str) -> dict[str, str]:
    """Every file under ``root``: relative path -> SHA-256 of its bytes."""
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def events(job_dir: str) -> list[dict]:
    out = []
    folder = os.path.join(job_dir, "events")
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".jsonl")):  # (not the change log)
        with open(os.path.join(folder, name)) as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def test_an_intact_checkpoint_that_does_not_fit_the_state_is_an_error_and_changes_nothing(tmp_path):
    job_dir = str(tmp_path / "job")
    saved = run(job_dir, 4, "save")
    assert saved.returncode == 0, saved.stderr[-3000:]
    ckpts = os.path.join(job_dir, "checkpoints")
    before = tree(ckpts)
    assert any(p.startswith("step-00000002") for p in before), sorted(before)

    wrong = run(job_dir, 5, "restore")
    assert wrong.returncode == 7, (wrong.stdout[-2000:], wrong.stderr[-3000:])
    msg = wrong.stdout
    assert "step 2" in msg and "does not fit this job's training state" in msg and "Nothing was changed" in msg, msg
    assert "size mismatch" in msg or "shape" in msg.lower(), msg  # DCP's own reason is passed on
    assert tree(ckpts) == before, "a checkpoint file was renamed, removed or changed"
    assert not [e for e in events(job_dir) if e["kind"] == "checkpoint.corrupt"]

    right = run(job_dir, 4, "restore")
    assert right.returncode == 0 and "RESTORED 3" in right.stdout, (right.stdout, right.stderr[-3000:])
