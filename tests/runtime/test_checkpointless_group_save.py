"""A replica group of two ranks saves its persistent checkpoint while it trains (found by the
16-node x 2-process dev-cluster job, docs/scale.md "What broke"): the gradient all-reduce
inside the group and the persistent checkpoint's background DCP save used the same gloo group
(``ctx.cpu_group``) from two threads, and the group hung at its first persistent save until the
hang watchdog killed it. Real processes on this host: the job's Lighthouse and one launch agent
with two workers (tests/scripts/ft_train.py, default tiered policy: memory every step,
persistent every 10 steps)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from agents import kinds
from test_checkpointless import SCRIPT, Job

STEPS = 12  # one persistent save (after step 9), then steps on


class TwoRankJob(Job):
    def start_group(self, group: int) -> None:
        log = open(os.path.join(self.job_dir, f"agent-{group}.log"), "ab")
        self.agents[group] = subprocess.Popen(
            [sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nnodes=1",
             "--nproc-per-node=2", "--max-restarts=0", "--monitor-interval=0.1", SCRIPT, "--steps", str(STEPS),
             *self.args], env=self.env(group), stdout=log, stderr=subprocess.STDOUT)


def test_a_two_rank_group_saves_its_persistent_checkpoint_while_training(tmp_path):
    job = TwoRankJob(tmp_path, groups=1, args=["--step-sleep", "0.05"])
    t0 = time.monotonic()
    try:
        events = job.finish(timeout=120)  # before the fix: no end, the hang watchdog's kill after 35 s
    finally:
        job.stop()
    saved = [e["data"]["step"] for e in kinds(events, "checkpoint.saved") if e["data"]["tier"] == "persistent"]
    assert 9 in saved, saved
    assert not [e for e in events if e["kind"] in ("checkpoint.failed", "fault.detected")], job.logs()[-3000:]
    assert kinds(events, "finished")[-1]["data"]["steps"] == STEPS
    print(f"2-rank group, {STEPS} steps with a persistent save: {time.monotonic() - t0:.1f} s")
