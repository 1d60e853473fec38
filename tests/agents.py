"""Test helpers shared by the multi-process runtime tests (tests only): reading a job's events,
and stopping the launch agents a test started plus any stray worker."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import torch

from benchmarks._common import stop_procs


def read_events(job_dir: str) -> list[dict]:
    """Every schema-v1 event of the job (all writer files), ordered by time."""
    out = []
    edir = os.path.join(job_dir, "events")
    for name in sorted(os.listdir(edir)) if os.path.isdir(edir) else []:
        if name.endswith(".jsonl"):
            with open(os.path.join(edir, name)) as f:
                for line in f:
                    if line.strip():
                        ev = json.loads(line)
                        assert ev["v"] == 1
                        out.append(ev)
    return sorted(out, key=lambda e: e["time"])


def kinds(events: list[dict], kind: str, **match) -> list[dict]:
    """The events of ``kind`` whose data has every ``key=value`` in ``match``."""
    return [e for e in events if e["kind"] == kind and all(e["data"].get(k) == v for k, v in match.items())]


def is_our_worker(pid: int, job_dir: str, script: str) -> bool:
    """Whether ``pid`` runs ``script`` for ``job_dir`` (so a recycled pid is never killed)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return False
    return script.encode() in cmd and f"HYPERPOD_LAB_JOB_DIR={job_dir}".encode() in env


def stop_launchers(procs: list[subprocess.Popen], job_dir: str, script: str) -> None:
    """Stop launchers we started (SIGTERM lets the agent stop its workers), then stray workers."""
    stop_procs(procs, timeout_s=20)
    rdir = os.path.join(job_dir, "ranks")
    for name in os.listdir(rdir) if os.path.isdir(rdir) else []:
        with open(os.path.join(rdir, name)) as f:
            pid = json.load(f)["pid"]
        if is_our_worker(pid, job_dir, script):
            os.kill(pid, signal.SIGKILL)


def tail_logs(paths: list[str], chars: int = 6000) -> str:
    """The last ``chars`` characters of each log file, headed by its path (for assertion messages)."""
    text = ""
    for p in paths:
        with open(p, errors="replace") as f:
            text += f"\n===== {p}\n" + f.read()[-chars:]
    return text


def complete_steps(job_dir: str) -> list[int]:
    """Steps of the job's persistent checkpoints that have a commit marker, ascending."""
    root = os.path.join(job_dir, "checkpoints")
    return sorted(int(n[5:]) for n in os.listdir(root)
                  if n.startswith("step-") and os.path.exists(os.path.join(root, n, "COMMITTED")))


def job_with_checkpoints_of(src_job_dir: str, base) -> tuple[str, str]:
    """A new job directory ``<base>/job`` holding a copy of ``src_job_dir``'s persistent checkpoints
    and of its checkpoint key (the checkpoints are authenticated with it: without the key they
    are refused, as a foreign job's would be).

    Returns:
        ``(job_dir, its checkpoints directory)``.
    """
    job_dir = os.path.join(str(base), "job")
    ck = os.path.join(job_dir, "checkpoints")
    shutil.copytree(os.path.join(src_job_dir, "checkpoints"), ck)
    shutil.copy2(os.path.join(src_job_dir, "checkpoint.key"), os.path.join(job_dir, "checkpoint.key"))
    return job_dir, ck


def load_dump(job_dir: str, name: str) -> dict:
    """A state dump a test script wrote to ``<job_dir>/dumps/<name>``."""
    return torch.load(os.path.join(job_dir, "dumps", name), weights_only=False)


def assert_same(a, b, where: str = "") -> None:
    """Bit-equality of nested tensors/dicts/lists (dtype included), naming the first difference."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), f"tensors differ at {where}"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"keys differ at {where}: {sorted(a)} vs {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"lengths differ at {where}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{a!r} != {b!r} at {where}"


def assert_global_sample_order(job_dir: str, steps: int, *, samples: int = 1024, global_batch: int = 32,
                               micro_batch: int = 4, seed: int = 7) -> None:
    """The sample ids ``tests/scripts/ft_train.py --record-samples`` recorded (``<job_dir>/samples/``)
    are, step by step, the global batch of a run without a fault: the union over the ranks that
    committed step s is the s-th global batch of the seeded order (``ElasticBatches.positions``),
    each id once, for every step 0..steps-1, whatever ranks restarted, healed or joined."""
    import glob
    from collections import defaultdict

    from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches

    ref = ElasticBatches(samples, global_batch, micro_batch, seed=seed, base_lr=0.01)
    seen: dict[int, dict[str, list[int]]] = defaultdict(dict)
    for path in glob.glob(os.path.join(job_dir, "samples", "rank-*.jsonl")):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                seen[rec["step"]][path] = rec["samples"]  # a redone step: the committed attempt's ids
    assert sorted(seen) == list(range(steps)), f"steps with recorded samples: {sorted(seen)[:5]}..."
    for step in range(steps):
        ids = [i for part in seen[step].values() for i in part]
        want = [int(i) for i in ref.positions(step * global_batch, global_batch)]
        assert sorted(ids) == sorted(want), f"step {step}: the job saw {sorted(ids)}, a run without faults {sorted(want)}"


def launch_standalone(tmp_path, script_text: str, nproc: int, job_id: str, max_restarts: int = 1,
                      timeout_s: float = 240) -> subprocess.CompletedProcess:
    """Run ``script_text`` under ``hyperpod_lab.node.launch --standalone`` (torchrun's agent, as
    every hyperpod-lab launch runs it) with ``nproc`` workers on this host, the job directory
    ``tmp_path/job`` (its events there); returns the finished launch (text output)."""
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / f"{job_id}.py"
    script.write_text(script_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPOD_LAB_")}
    env.update(PYTHONPATH=repo, HYPERPOD_LAB_JOB_DIR=str(tmp_path / "job"), HYPERPOD_LAB_JOB_ID=job_id)
    return subprocess.run([sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nproc-per-node",
                           str(nproc), "--max-restarts", str(max_restarts), "--monitor-interval", "0.1", str(script)],
                          env=env, capture_output=True, text=True, timeout=timeout_s)
