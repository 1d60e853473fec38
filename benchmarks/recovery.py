"""Downtime per failure and goodput: checkpoint-restart versus checkpointless recovery.

Both modes run 2 data-parallel ranks on this host (gloo, CPU) with the same step time
(``--step-sleep``), and a rank is SIGKILLed mid-run, ``--faults`` times, each kill at a random
point of a step (uniform over one step after a step was seen, seeded by ``--seed``; real failures
do not wait for a step boundary; ``--kill-phase after-step`` kills as soon as a step is seen, as
this benchmark did before):

* ``checkpoint_restart`` (the baseline): one torchrun agent (``tests/scripts/tiny_train.py``,
  DDP); a fault restarts every rank, which reload the newest persistent (DCP) checkpoint. The
  checkpoint interval is the Young/Daly interval sqrt(2 C MTBF) for the save cost C measured in
  this run's warm-up and an MTBF of ``--mtbf`` seconds (a fair baseline: the interval that
  minimises its expected loss).
* ``checkpointless``: one replica group per rank under a torchft Lighthouse
  (``tests/scripts/ft_train.py``); the survivor goes on, the restarted rank heals from it.

Downtime per failure (``downtime_s``) = the wall time the failure cost the job, the same way for
both modes: with R the last step committed before the kill (at t_R) and S the fault-free step
time (median step interval before the kill, this run), the first commit of step R+3 after the
kill comes at t_R + 3 S + downtime. It counts detection, restart, restore, recomputing lost
steps and the lost work of the interrupted step; a kill that lands after the interrupted step's
all-reduce is charged where it is noticed, one step later. ``kill_to_back_s`` is this benchmark's
earlier measure: wall seconds from the kill until a step at or beyond R is committed (the baseline
stops at R recommitted, the checkpointless job at R+1 committed: one step more than the baseline;
and a kill after the all-reduce reads as ~0). Steps lost = R - first step committed after the
kill + 1. ``--goodput-s`` runs the checkpointless job that long with a rank killed every
``--mtbf`` seconds: goodput = committed steps x fault-free step time / wall time. JSON to
``benchmarks/results/recovery.json``.

    .venv/bin/python benchmarks/recovery.py --faults 3 --goodput-s 600
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
TINY = os.path.join(ROOT, "tests", "scripts", "tiny_train.py")
FT = os.path.join(ROOT, "tests", "scripts", "ft_train.py")
AFTER = 3  # downtime is read at the commit of step R + AFTER (R: the last step before the kill)
TARGET_REDUCTION = 0.95

from benchmarks._common import stop_procs, write_results  # noqa: E402


def _events(job_dir: str) -> list:
    """The job's events so far, by time (``hyperpod_lab.events.EventReader``)."""
    from hyperpod_lab.events import EventReader

    return EventReader(job_dir).poll()


def _steps(job_dir: str) -> list[tuple[float, int]]:
    return [(e.time, e.data["step"]) for e in _events(job_dir) if e.kind == "step"]


def _env(job_dir: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({"HYPERPOD_LAB_JOB_DIR": job_dir, "HYPERPOD_LAB_JOB_ID": os.path.basename(job_dir),
                "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.001", "OMP_NUM_THREADS": "1", "RUST_LOG": "warn",
                "HYPERPOD_LAB_SHM_DIR": os.path.join(job_dir, "shm"), **extra})
    return env


def _wait_step(job_dir: str, step: int, procs, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while max((s for _, s in _steps(job_dir)), default=-1) < step:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"job in {job_dir} did not reach step {step}")
        time.sleep(0.02)


def _pid(job_dir: str, rank: int) -> int:
    with open(os.path.join(job_dir, "ranks", f"rank-{rank}.json")) as f:
        return json.load(f)["pid"]


def _first_commits(job_dir: str) -> dict[int, float]:
    """Step -> the earliest time any writer reported it committed."""
    first: dict[int, float] = {}
    for t, s in _steps(job_dir):
        first[s] = min(first.get(s, t), t)
    return first


def _fault_figures(job_dir: str, t_kill: float) -> dict:
    """The figures of one fault (see the module docstring), from the job's step events."""
    st = _steps(job_dir)
    before = {}
    for t, s in st:
        if t <= t_kill:
            before[s] = min(before.get(s, t), t)
    reached = max(before)
    t_r = before[reached]
    seq = sorted(before.items())[-11:]
    step_s = statistics.median([b[1] - a[1] for a, b in zip(seq, seq[1:]) if b[0] == a[0] + 1])
    after = sorted((t, s) for t, s in st if t > t_kill)
    back = next((t for t, s in after if s >= reached), None)
    done = next((t for t, s in after if s == reached + AFTER), None)
    first = after[0][1] if after else None
    return {"downtime_s": None if done is None else round(done - t_r - AFTER * step_s, 3),
            "kill_to_back_s": None if back is None else round(back - t_kill, 3),
            "steps_lost": None if first is None else max(0, reached - first + 1),
            "kill_after_step_s": round(t_kill - t_r, 3), "step_s": round(step_s, 4)}


def _kill_at_random_phase(job_dir: str, rank: int, rng: random.Random | None, step_s: float) -> float:
    """SIGKILL ``rank`` (after a uniform random part of a step when ``rng`` is given); returns
    the kill's wall time."""
    if rng is not None:
        time.sleep(rng.uniform(0.0, step_s))
    t_kill = time.time()
    os.kill(_pid(job_dir, rank), signal.SIGKILL)
    return t_kill


def checkpoint_restart(tmp: str, faults: int, step_sleep: float, mtbf_s: float, rng: random.Random | None) -> dict:
    """The baseline. Warm-up measures the save cost C and the step time; then runs with the
    Young/Daly interval and kills rank 1 ``faults`` times."""
    from hyperpod_lab.goodput import young_daly_interval

    warm = os.path.join(tmp, "restart-warmup")
    os.makedirs(warm)
    subprocess.run([sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nnodes=1",
                    "--nproc-per-node=2", TINY, "--steps", "30", "--every", "5", "--sleep", str(step_sleep)],
                   env=_env(warm), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saves = [e.data["blocked_s"] for e in _events(warm) if e.kind == "checkpoint.saved"]
    st = _steps(warm)
    step_s = (st[-1][0] - st[5][0]) / (st[-1][1] - st[5][1])
    cost = statistics.median(saves)
    interval_s = young_daly_interval(cost, mtbf_s)
    every = max(1, round(interval_s / step_s))

    job = os.path.join(tmp, "restart")
    os.makedirs(job)
    steps = 60 + faults * 60
    agent = subprocess.Popen([sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nnodes=1",
                              "--nproc-per-node=2", f"--max-restarts={faults + 2}", "--monitor-interval=0.1", TINY,
                              "--steps", str(steps), "--every", str(every), "--sleep", str(step_sleep)],
                             env=_env(job), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = []
    try:
        target = 12
        for _ in range(faults):
            _wait_step(job, target, [agent])
            t_kill = _kill_at_random_phase(job, 1, rng, step_sleep)
            reached = max(s for t, s in _steps(job) if t <= t_kill)
            _wait_step(job, reached + AFTER, [agent])
            out.append(_fault_figures(job, t_kill))
            target = reached + AFTER + every + 7  # next fault at another phase of the interval
    finally:
        stop_procs([agent])
    return {"save_cost_s": round(cost, 4), "step_s": round(step_s, 4), "mtbf_s": mtbf_s,
            "young_daly_interval_s": round(interval_s, 2), "checkpoint_every_steps": every, "faults": out}


LIGHTHOUSE_ARGS: list[str] = []  # --heartbeat-ms / --quorum-tick-ms given to this run (default: the product's)


class FtJob:
    def __init__(self, tmp: str, name: str, steps: int, step_sleep: float):
        from hyperpod_lab.node.lighthouse import read_address

        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir)
        self.lh = subprocess.Popen([sys.executable, "-m", "hyperpod_lab.node.lighthouse", "--job-dir", self.dir,
                                    "--min-replicas", "1", "--host", "127.0.0.1", *LIGHTHOUSE_ARGS],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addr = read_address(self.dir, 30)
        self.args = ["--steps", str(steps), "--step-sleep", str(step_sleep), "--global-batch", "32",
                     "--micro-batch", "4"]
        self.agents = [self._agent(g) for g in (0, 1)]

    def _agent(self, g: int) -> subprocess.Popen:
        env = _env(self.dir, HYPERPOD_LAB_REPLICA_GROUP=str(g), HYPERPOD_LAB_REPLICA_GROUPS="2",
                   TORCHFT_LIGHTHOUSE=self.addr, SLURMD_NODENAME=f"n{g + 1}")
        return subprocess.Popen([sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nnodes=1",
                                 "--nproc-per-node=1", "--max-restarts=100", "--monitor-interval=0.1", FT, *self.args],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        stop_procs(self.agents + [self.lh])


def checkpointless(tmp: str, faults: int, step_sleep: float, rng: random.Random | None) -> dict:
    job = FtJob(tmp, "checkpointless", 60 + faults * 60, step_sleep)
    out = []
    try:
        target = 12
        for _ in range(faults):
            _wait_step(job.dir, target, job.agents)
            t_kill = _kill_at_random_phase(job.dir, 1, rng, step_sleep)
            reached = max(s for t, s in _steps(job.dir) if t <= t_kill)
            _wait_step(job.dir, reached + AFTER, job.agents)
            out.append(_fault_figures(job.dir, t_kill))
            # wait until the restarted rank has healed before the next fault
            deadline = time.monotonic() + 120
            while not [e for e in _events(job.dir) if e.kind == "checkpoint.restored" and e.time > t_kill
                       and e.data.get("tier") == "replica"] and time.monotonic() < deadline:
                time.sleep(0.1)
            target = max(s for _, s in _steps(job.dir)) + 10
    finally:
        job.stop()
    first = _first_commits(job.dir)
    from hyperpod_lab.node.lighthouse import read_info

    lh = read_info(job.dir)
    return {"faults": out, "storage_restores": sum(1 for e in _events(job.dir) if e.kind == "checkpoint.restored"
                                                   and e.data.get("tier") != "replica"),
            "step_s": round((first[10] - first[2]) / 8, 4),
            "lighthouse": {k: lh.get(k) for k in ("heartbeat_ms", "heartbeat_interval_ms", "quorum_tick_ms",
                                                  "join_timeout_ms")}}


def goodput_run(tmp: str, duration_s: float, every_s: float, step_sleep: float) -> dict:
    job = FtJob(tmp, "goodput", 10 ** 6, step_sleep)
    kills = 0
    try:
        _wait_step(job.dir, 5, job.agents)
        t0 = time.time()
        next_kill = t0 + every_s
        while time.time() < t0 + duration_s:
            if time.time() >= next_kill:
                try:
                    os.kill(_pid(job.dir, 1), signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass
                next_kill += every_s
            time.sleep(0.05)
        t1 = time.time()
    finally:
        job.stop()
    return {**_goodput(job.dir, t0, t1), "faults": kills, "fault_every_s": every_s}


def _goodput(job_dir: str, t0: float, t1: float) -> dict:
    """Committed steps in [t0, t1] x the fault-free step time / (t1 - t0). The fault-free step
    time is the median interval between consecutive steps' first commits in that window: each
    fault stretches one or two of the thousands of intervals, so the median is a step's own time
    (a median over the few warm-up steps before t0, as before, came out above it: goodput > 1)."""
    first = sorted((s, t) for s, t in _first_commits(job_dir).items() if t0 <= t <= t1)
    step_s = statistics.median([b[1] - a[1] for a, b in zip(first, first[1:]) if b[0] == a[0] + 1])
    return {"duration_s": round(t1 - t0, 1), "steps": len(first), "fault_free_step_s": round(step_s, 4),
            "goodput": round(len(first) * step_s / (t1 - t0), 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--faults", type=int, default=3)
    p.add_argument("--step-sleep", type=float, default=0.2)
    p.add_argument("--mtbf", type=float, default=60.0, help="seconds between faults (Young/Daly and goodput)")
    p.add_argument("--goodput-s", type=float, default=600.0, help="0 skips the goodput run")
    p.add_argument("--kill-phase", choices=("random", "after-step"), default="random",
                   help="random: each kill at a uniform random point of a step; after-step: as soon as a step is seen")
    p.add_argument("--seed", type=int, default=None, help="of the kill phases (default: random)")
    p.add_argument("--heartbeat-ms", type=int, default=None,
                   help="the Lighthouse's heartbeat timeout (default: the product's, 100 ms on loopback)")
    p.add_argument("--quorum-tick-ms", type=int, default=None, help="the Lighthouse's quorum tick (default: 10 ms)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "recovery.json"))
    a = p.parse_args()
    for flag, value in (("--heartbeat-ms", a.heartbeat_ms), ("--quorum-tick-ms", a.quorum_tick_ms)):
        if value is not None:
            LIGHTHOUSE_ARGS.extend([flag, str(value)])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop our agents
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2 ** 31)
    rng = (lambda k: random.Random(f"{seed}-{k}")) if a.kill_phase == "random" else (lambda k: None)
    tmp = tempfile.mkdtemp(prefix="hp-recovery-" + uuid.uuid4().hex[:6] + "-")
    base = checkpoint_restart(tmp, a.faults, a.step_sleep, a.mtbf, rng("restart"))
    ours = checkpointless(tmp, a.faults, a.step_sleep, rng("checkpointless"))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731

    def avg(mode: dict, key: str) -> float:
        return mean([f[key] for f in mode["faults"]])

    d_base, d_ours = avg(base, "downtime_s"), avg(ours, "downtime_s")
    k_base, k_ours = avg(base, "kill_to_back_s"), avg(ours, "kill_to_back_s")
    res = {"checkpoint_restart": base, "checkpointless": ours,
           "mean_downtime_s": {"checkpoint_restart": round(d_base, 3), "checkpointless": round(d_ours, 3)},
           "mean_kill_to_back_s": {"checkpoint_restart": round(k_base, 3), "checkpointless": round(k_ours, 3)},
           "mean_steps_lost": {"checkpoint_restart": avg(base, "steps_lost"), "checkpointless": avg(ours, "steps_lost")},
           "downtime_reduction": round(1 - d_ours / d_base, 4),
           "kill_to_back_reduction": round(1 - k_ours / k_base, 4),
           "target_downtime_reduction": TARGET_REDUCTION, "kill_phase": a.kill_phase, "seed": seed,
           "host": {"cpus": os.cpu_count(), "loadavg_1m_at_end": round(os.getloadavg()[0], 2)}}
    print(f"downtime per failure: checkpoint-restart {d_base:.2f} s, checkpointless {d_ours:.3f} s "
          f"-> reduction {res['downtime_reduction']:.1%} (target >= {TARGET_REDUCTION:.0%}); kill to back at the "
          f"step reached: {k_base:.2f} s vs {k_ours:.3f} s ({res['kill_to_back_reduction']:.1%}); steps lost "
          f"{res['mean_steps_lost']['checkpoint_restart']:.1f} vs {res['mean_steps_lost']['checkpointless']:.1f}")
    if a.goodput_s > 0:
        res["goodput"] = goodput_run(tmp, a.goodput_s, a.mtbf, a.step_sleep)
        g = res["goodput"]
        print(f"goodput: {g['goodput']:.1%} over {g['duration_s']} s with {g['faults']} faults (target >= 90 %)")
    write_results(a.out, res, said="wrote")


if __name__ == "__main__":
    main()
