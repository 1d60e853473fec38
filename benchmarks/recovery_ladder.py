"""Downtime per fault kind as the recovery parts are switched on in turn, on the dev cluster (issue 26, item 5).

One job per configuration, each ``examples/train_lm.py`` (a tiny model) on 2 nodes x 1 process
of the real 3-node dev cluster (``hyperpod-lab dev-cluster up``) with one spare node, and the same
four faults in the same order, each into rank 1 (on n2) once the job trains steadily:

1. ``exception``: ``inject-fault --kind exception`` (the rank raises inside its step);
2. ``kill``: ``inject-fault`` (SIGKILL of the rank's process);
3. ``hang``: ``inject-fault --kind hang`` (SIGSTOP; the launch agent's watchdog, ``--hang-timeout 5``);
4. ``node``: ``scontrol update NodeName=n2 State=DOWN`` (Slurm loses the node; the spare n3 takes over).

Configurations, each adding one part to the one before:

* ``checkpoint-restart`` (the baseline): ``--recovery restart``, a persistent (DCP) checkpoint
  every 10 steps; any fault restarts every rank, which restore it; node DOWN: the supervisor runs
  the step again on n1 and the spare;
* ``+ peer healing``: ``--recovery checkpointless --in-process-restarts 0``: the faulted rank's
  process restarts and heals from the live replica; the other group goes on;
* ``+ in-process``: the in-process rung on (an exception is redone in the same process);
* ``+ hot spare``: the spare's processes are started with the job (``HYPERPOD_LAB_HOT_SPARES``
  unset; the configurations before set it to 0, a cold spare);
* ``+ data cache``: the corpus read from each node's copy in ``/dev/shm`` (``hp.NodeCache``) instead
  of shared storage (the configurations before pass ``--no-data-cache``).

Downtime per fault (``downtime_s``), the same for every configuration (as ``benchmarks/recovery.py``):
with R the last step committed before the fault (at t_R) and S the fault-free step time (median
interval of the 10 steps before), the first commit of step R + 3 after the fault comes at
t_R + 3 S + downtime: detection, restart, restore or heal, recomputed steps and the interrupted
step's lost work, as the job saw them. For the node fault, ``spare_first_step_s`` is the time from
the first ``fault.detected`` to the first step with the spare. Ratios against checkpoint-restart in
the same run. ``rank_back_s``: from the fault to the first step the faulted rank takes part in
again (the first step after its heal from a live peer or its in-process restart; restart: after
the restart's ``recovery.completed``). For
``exception`` the fault's time is its ``fault.detected`` (the rank raises at its next look for the
request, within 0.5 s). JSON to ``benchmarks/results/recovery_ladder.json``.

    .venv/bin/python benchmarks/recovery_ladder.py       # ~12 min on a 2-core machine
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
EXAMPLE = os.path.join(ROOT, "examples", "train_lm.py")
AFTER = 3
FAULTS = ("exception", "kill", "hang", "node")
MODEL = ["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--batch-size", "4", "--seq-len", "32"]
CONFIGS = (
    ("checkpoint-restart", ["--recovery", "restart", "--checkpoint-every", "10"], "0", True),
    ("+ peer healing", ["--recovery", "checkpointless", "--in-process-restarts", "0"], "0", True),
    ("+ in-process", ["--recovery", "checkpointless"], "0", True),
    ("+ hot spare", ["--recovery", "checkpointless"], "1", True),
    ("+ data cache", ["--recovery", "checkpointless"], "1", False),
)

from benchmarks._common import write_results  # noqa: E402


def _scontrol(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True)


class Job:
    def __init__(self, client, name: str, opts: list[str], hot: str, no_cache: bool, step_sleep: float):
        from hyperpod_lab import cli

        self.client = client
        args = ["--steps", "100000", "--step-sleep", str(step_sleep), *MODEL] + (["--no-data-cache"] if no_cache else [])
        self.job_id = cli.run(["submit", EXAMPLE, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", "1",
                               "--spares", "1", "--hang-timeout", "5", "--name", name, *opts,
                               "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001", "--env", "RUST_LOG=warn",
                               "--env", f"HYPERPOD_LAB_HOT_SPARES={hot}", "--", *args], client=client)
        self.reader, self.events = client.event_reader(self.job_id), []

    def poll(self) -> list:
        self.events += self.reader.poll()
        return self.events

    def steps(self) -> list[tuple[float, int]]:
        return [(e.time, e.data["step"]) for e in self.poll() if e.kind == "step"]

    def wait(self, pred, what: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.job_id}: no {what} within {timeout} s\n{self.client.logs(self.job_id)[-3000:]}")
            if [e for e in self.events if e.kind == "job.failed" and not e.data.get("requeue")]:
                raise SystemExit(f"{self.job_id} failed while waiting for {what}\n"
                                 f"{self.client.logs(self.job_id)[-3000:]}")
            time.sleep(0.1)

    def top(self) -> int:
        return max((s for _, s in self.steps()), default=-1)


def figures(steps: list[tuple[float, int]], t_fault: float) -> dict:
    """downtime_s (see the module doc), steps_lost and the step time S, from the step events."""
    before: dict[int, float] = {}
    for t, s in steps:
        if t <= t_fault:
            before[s] = min(before.get(s, t), t)
    reached = max(before)
    seq = sorted(before.items())[-11:]
    step_s = statistics.median([b[1] - a[1] for a, b in zip(seq, seq[1:]) if b[0] == a[0] + 1])
    after = sorted((t, s) for t, s in steps if t > t_fault)
    done = next(t for t, s in after if s == reached + AFTER)
    return {"downtime_s": round(done - before[reached] - AFTER * step_s, 3), "step_s": round(step_s, 4),
            "steps_lost": max(0, reached - after[0][1] + 1)}


def rank_back(job: Job, t: float, reached: int, *, restart_mode: bool):
    """A function giving the time of the first step after the faulted rank is back, or None yet.
    Back: restart, the restart's ``recovery.completed`` (rank 0, every rank restored);
    checkpointless, the faulted rank's own return: its heal from a live peer
    (``checkpoint.restored`` tier replica, a restarted process or a spare) or its in-process
    restart's ``recovery.completed`` {level: "in-process"}."""
    def first() -> float | None:
        ev = job.poll()
        if restart_mode:
            marks = [e.time for e in ev if e.kind == "recovery.completed" and e.time > t]
        else:
            marks = [e.time for e in ev if e.time > t and (
                (e.kind == "checkpoint.restored" and e.data.get("tier") == "replica")
                or (e.kind == "recovery.completed" and e.data.get("level") == "in-process"))]
        if not marks:
            return None
        later = [e.time for e in ev if e.kind == "step" and e.time >= min(marks) and e.data["step"] > reached]
        return min(later) if later else None
    return first


def run_config(client, name: str, opts: list[str], hot: str, no_cache: bool, step_sleep: float) -> dict:
    job = Job(client, name.replace("+ ", "ladder-").replace(" ", "-"), opts, hot, no_cache, step_sleep)
    out: dict[str, dict] = {}
    try:
        job.wait(lambda: job.top() >= 20, "step 20", timeout=600)
        for fault in FAULTS:
            start = job.top()
            job.wait(lambda: job.top() >= start + 12, "steady steps")  # 12 steps since the last recovery
            t = time.time()
            if fault == "node":
                assert _scontrol("update", "NodeName=n2", "State=DOWN",
                                 "Reason=hyperpod-lab benchmark: node lost").returncode == 0
            else:
                client.inject_fault(job.job_id, 1, kind=fault)
            if fault == "exception":  # it lands at the rank's next look (<= 0.5 s): the fault is when it raised
                job.wait(lambda: [e for e in job.poll() if e.kind == "fault.detected" and e.time > t], "the exception")
                t = min(e.time for e in job.events if e.kind == "fault.detected" and e.time > t)
            reached = max(s for tt, s in job.steps() if tt <= t)
            job.wait(lambda: [s for tt, s in job.steps() if tt > t and s >= reached + AFTER], f"recovery from {fault}")
            back = rank_back(job, t, reached, restart_mode=opts[1] == "restart")
            job.wait(lambda: back() is not None, "the faulted rank back")
            out[fault] = figures(job.steps(), t)
            out[fault]["rank_back_s"] = round(back() - t, 3)
            detected = [e.time for e in job.poll() if e.kind == "fault.detected" and e.time >= t]
            out[fault]["detected_after_s"] = round(min(detected) - t, 3) if detected else None
            if fault == "node":
                job.wait(lambda: [e for e in job.poll() if e.kind == "step" and e.time > t
                                  and (e.data.get("replicas") == 2 or opts[1] == "restart")], "a step with the spare")
                first = min(e.time for e in job.events if e.kind == "step" and e.time > t
                            and (e.data.get("replicas") == 2 or opts[1] == "restart"))
                out[fault]["spare_first_step_s"] = round(first - min(detected), 3) if detected else None
            print(f"  {name}: {fault}: downtime {out[fault]['downtime_s']} s, faulted rank back after "
                  f"{out[fault]['rank_back_s']} s (step {out[fault]['step_s']} s, {out[fault]['steps_lost']} steps "
                  "lost)", flush=True)
        storage = [e.data.get("tier") for e in job.events if e.kind == "checkpoint.restored"
                   and e.data.get("tier") not in ("replica",)]
    finally:
        client.cancel(job.job_id)
        _scontrol("update", "NodeName=n2", "State=RESUME")
    return {"faults": out, "storage_restores": len(storage), "job_id": job.job_id}


def make_table(res: dict) -> str:
    """The README's table: per configuration and fault, the job-wide downtime with its reduction
    against checkpoint-restart (same run), then when the faulted rank was back."""
    base = res["configs"].get("checkpoint-restart")
    rows = ["job-wide downtime (reduction vs checkpoint-restart) / faulted rank back",
            "| configuration | " + " | ".join(FAULTS) + " |", "|---|" + "---:|" * len(FAULTS)]
    for name, r in res["configs"].items():
        cells = []
        for f in FAULTS:
            d, back = r["faults"][f]["downtime_s"], r["faults"][f]["rank_back_s"]
            b = base["faults"][f]["downtime_s"] if base else None
            ratio = f" ({1 - d / b:.0%} less)" if b and name != "checkpoint-restart" else ""
            cells.append(f"{d:.2f} s{ratio} / {back:.2f} s")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--step-sleep", type=float, default=0.2)
    p.add_argument("--only", nargs="*", default=None, help="configuration names to run (default: all)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "recovery_ladder.json"))
    a = p.parse_args()
    from hyperpod_lab import devcluster
    from hyperpod_lab.submit.client import Client

    devcluster.up(quiet=True, nodes=3)
    client = Client()
    res: dict = {"configs": {}, "faults": list(FAULTS), "step_sleep_s": a.step_sleep}
    for name, opts, hot, no_cache in CONFIGS:
        if a.only and name not in a.only:
            continue
        print(f"{name} ...", flush=True)
        res["configs"][name] = run_config(client, name, opts, hot, no_cache, a.step_sleep)
        time.sleep(5)  # the cancelled job's steps end; n2 back in service
    res["table"] = make_table(res)
    print(res["table"])
    write_results(a.out, res, said="wrote")


if __name__ == "__main__":
    main()
