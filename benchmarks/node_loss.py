"""Downtime after Slurm marks a node DOWN: a spare node versus a requeue (the baseline).

On the real dev cluster (``hyperpod-lab dev-cluster up``, 3 nodes), a checkpoint-restart job of
``examples/train_lm.py`` on 2 nodes with the memory tier every 2 steps (and its peer replicas)
runs until a peer replica exists; then ``scontrol update NodeName=n2 State=DOWN`` (what an operator
or slurmctld does with a failed node):

* ``requeue`` (the baseline, ``--spares 0``): the job's supervisor requeues it (``scontrol
  requeue``; Slurm holds a requeued job before it may start again); the new run restores from the
  memory/peer tiers.
* ``spare`` (``--spares 1``): the supervisor runs the step again at once on n1 and the spare n3; the
  lost node's rank comes back from the peer tier. No requeue, no queue wait.

Downtime = seconds from the DOWN to the first completed step after it (the ``step`` event's
time; also the runtime's own ``recovery.completed.downtime_s``, from the first ``fault.detected``).
Prints the ratio requeue / spare and writes ``benchmarks/results/node_loss.json``.

    .venv/bin/python benchmarks/node_loss.py            # ~4 min on a 2-core machine
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
EXAMPLE = os.path.join(ROOT, "examples", "train_lm.py")
from benchmarks._common import write_results  # noqa: E402


def _scontrol(*args: str) -> None:
    subprocess.run(["scontrol", *args], capture_output=True, text=True)


def run_once(client, spares: int, steps: int, step_sleep: float, timeout_s: float) -> dict:
    """Submit, wait for a peer replica, mark n2 DOWN, follow to the end; the measurements."""
    from hyperpod_lab import cli

    job_id = cli.run(["submit", EXAMPLE, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", "1",
                      "--spares", str(spares), "--checkpoint-memory-every", "2", "--checkpoint-every", "1000",
                      "--name", f"bench-node-loss-{spares}", "--", "--steps", str(steps),
                      "--step-sleep", str(step_sleep)], client=client)
    reader, events, t_down = client.event_reader(job_id), [], None
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            events += reader.poll()
            if t_down is None and [e for e in events if e.kind == "checkpoint.saved"
                                   and e.data.get("tier") == "peer" and e.data.get("step", 0) >= 5]:
                t_down = time.time()
                _scontrol("update", "NodeName=n2", "State=DOWN", "Reason=hyperpod-lab benchmark: node lost")
            if any(e.kind == "finished" for e in events):
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"{job_id}: not finished within {timeout_s} s")
    finally:
        _scontrol("update", "NodeName=n2", "State=RESUME")
    rec = client.wait(job_id, timeout_s=120)
    after = [e for e in events if e.time > t_down]
    first_step = min(e.time for e in after if e.kind == "step")
    recovered = [e for e in after if e.kind == "recovery.completed"]
    restored = [e for e in after if e.kind == "checkpoint.restored"]
    out = subprocess.run(["scontrol", "show", "job", "-o", rec.native_id], capture_output=True, text=True).stdout
    requeues = int(out.split("Restarts=")[1].split()[0]) if "Restarts=" in out else None
    return {"job_id": job_id, "spares": spares, "status": rec.status, "requeues": requeues,
            "downtime_s": round(first_step - t_down, 3),
            "runtime_downtime_s": recovered[0].data.get("downtime_s") if recovered else None,
            "restored_tiers": sorted(e.data.get("tier") for e in restored),
            "restored_nodes": sorted({e.data.get("node") for e in restored if e.data.get("node")})}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--step-sleep", type=float, default=0.1)
    p.add_argument("--timeout-s", type=float, default=600)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "node_loss.json"))
    a = p.parse_args()
    from hyperpod_lab import devcluster
    from hyperpod_lab.submit.client import Client

    devcluster.up(quiet=True, nodes=3)
    client = Client()
    spare = run_once(client, 1, a.steps, a.step_sleep, a.timeout_s)
    print(f"spare:   downtime {spare['downtime_s']:.2f} s, requeues {spare['requeues']}, "
          f"restored {spare['restored_tiers']} on {spare['restored_nodes']}", flush=True)
    requeue = run_once(client, 0, a.steps, a.step_sleep, a.timeout_s)
    print(f"requeue: downtime {requeue['downtime_s']:.2f} s, requeues {requeue['requeues']}, "
          f"restored {requeue['restored_tiers']} on {requeue['restored_nodes']}", flush=True)
    ratio = requeue["downtime_s"] / spare["downtime_s"] if spare["downtime_s"] > 0 else None
    print(f"downtime with a spare: {spare['downtime_s']:.2f} s vs {requeue['downtime_s']:.2f} s with a requeue "
          f"(baseline): {ratio:.1f}x less" if ratio else "ratio: n/a")
    res = {"benchmark": "node_loss", "time": time.time(), "steps": a.steps, "step_sleep_s": a.step_sleep,
           "baseline": "requeue", "spare": spare, "requeue": requeue, "requeue_over_spare": ratio}
    write_results(a.out, res, said="results:")


if __name__ == "__main__":
    main()
