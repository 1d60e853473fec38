"""Hang detection (issue 15, items 1, 2 and 4), with real parts:

* the heartbeat: a real mapped file written by one process and read by another (seqlock, ring);
* the hang timeout T: no T before enough step times, the floor, 10 x p99, warm-up after a restart;
* the watchdog on a real process that beats and then stops (SIGSTOP): its stacks by py-spy
  (``--nonblocking``), ``fault.detected`` {reason: "hang"}, the process killed, the stacks in its
  log; without py-spy the rank's own faulthandler writes them; a rank waiting in a collective
  gets twice T;
* the local backend: a 2-rank DDP job (``tests/scripts/hang_train.py``) whose rank 1 is stopped
  with ``inject-fault --kind hang`` is detected within T + 5 s with its stack in the job's log,
  torchrun restarts it from its checkpoint and the job completes;
* the dev cluster (real Slurm, 2 nodes, checkpointless): rank 1 stopped with SIGSTOP is detected
  as hung within the derived T + 5 s (T = max(30 s, 10 x p99) after warm-up) with its stack in
  the log, the group is restarted, heals from its peer and the job completes; a fault-free run of
  500 steps raises no hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from slurm_jobs import Follow

from hyperpod_lab import cli
from hyperpod_lab.errors import SpecError
from hyperpod_lab.node import watchdog as wd
from hyperpod_lab.node.watchdog import HeartbeatWriter, Watchdog, Worker, derived_hang_timeout, heartbeat_file, read_heartbeat
from hyperpod_lab.spec import JobSpec, ResiliencyPolicy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANG_TRAIN = os.path.join(REPO, "tests", "scripts", "hang_train.py")
FT = os.path.join(REPO, "tests", "scripts", "ft_train.py")


# --------------------------------------------------------------------------- the heartbeat
def test_heartbeat_is_read_by_another_process_with_its_ring(tmp_path):
    hb = HeartbeatWriter(heartbeat_file(str(tmp_path), 1), global_rank=5, local_rank=1)
    for s in range(300):
        hb.step(s, 0.1 + s * 1e-4, 0.08, 0.02 + s * 1e-4, now=1000.0 + s)
    hb.section("forward", wait=False, timeout_s=None, now=2000.0)
    code = textwrap.dedent(f"""
        from hyperpod_lab.node.watchdog import read_heartbeat, RING
        b = read_heartbeat({heartbeat_file(str(tmp_path), 1)!r}, since=10)
        print(b.pid, b.global_rank, b.local_rank, b.steps, b.step, b.section, b.last_progress, b.last_step_time,
              len(b.entries), b.entries[0][0], b.entries[-1][0], RING)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pid, grank, lrank, steps, step, section, progress, last_step, n, first, last, ring = out.stdout.split()
    assert (int(pid), int(grank), int(lrank), int(steps), int(step)) == (os.getpid(), 5, 1, 300, 299)
    assert section == "forward" and float(progress) == 2000.0 and float(last_step) == 1299.0
    # 290 entries written after the first 10, the ring keeps the newest 256
    assert (int(n), int(first), int(last)) == (int(ring), 300 - int(ring), 299)
    beat = read_heartbeat(heartbeat_file(str(tmp_path), 1), since=299)
    assert [e[0] for e in beat.entries] == [299] and beat.entries[0][3] == pytest.approx(0.02 + 299e-4)
    hb.section(None, now=2001.0)
    assert read_heartbeat(heartbeat_file(str(tmp_path), 1)).section is None
    hb.close()
    os.symlink(heartbeat_file(str(tmp_path), 1), heartbeat_file(str(tmp_path), 2))
    assert read_heartbeat(heartbeat_file(str(tmp_path), 2)) is None  # a link is never followed
    assert read_heartbeat(str(tmp_path / "none.hb")) is None


def test_hang_timeout_needs_samples_and_has_a_floor():
    assert derived_hang_timeout([0.1] * (wd.MIN_SAMPLES - 1)) is None  # no T before enough samples
    assert derived_hang_timeout([0.1] * wd.MIN_SAMPLES) == wd.HANG_FLOOR_S == 30.0
    slow = [4.0] * 200 + [90.0] * 2  # p99 of 202 samples: the 200th smallest; two outliers do not count
    assert derived_hang_timeout(slow) == pytest.approx(wd.HANG_FACTOR * 4.0)
    assert derived_hang_timeout([2.0] * 100 + [5.0] * 5) == pytest.approx(50.0)  # 10 x p99 (5 s) above the floor


def test_spec_and_flags_for_hang_timeout_and_on_straggler(client):
    assert ResiliencyPolicy().hang_timeout_s is None and ResiliencyPolicy().on_straggler == "report"
    for bad in (0.5, -1, float("nan"), True, "60", 8 * 24 * 3600):
        with pytest.raises(SpecError, match="resiliency.hang_timeout_s"):
            JobSpec(script="t.py", resiliency=ResiliencyPolicy(hang_timeout_s=bad)).validate()
    with pytest.raises(SpecError, match="resiliency.on_straggler: must be one of report, exclude"):
        JobSpec(script="t.py", resiliency=ResiliencyPolicy(on_straggler="drop")).validate()
    spec = JobSpec.from_json(JobSpec(script="t.py", resiliency=ResiliencyPolicy(hang_timeout_s=90,
                                                                                 on_straggler="exclude")).to_json())
    assert spec.resiliency.hang_timeout_s == 90 and spec.resiliency.on_straggler == "exclude"
    a = cli.build_parser().parse_args(["submit", HANG_TRAIN, "--cluster", "local", "--hang-timeout", "45.5",
                                       "--on-straggler", "exclude"])
    res = cli.spec_from_args(a, []).resiliency
    assert res.hang_timeout_s == 45.5 and res.on_straggler == "exclude"
    res = cli.spec_from_args(cli.build_parser().parse_args(["submit", HANG_TRAIN, "--cluster", "local"]), []).resiliency
    assert res.hang_timeout_s is None and res.on_straggler == "report"
    assert res.startup_timeout_s is None  # the watchdog's default, 600 s
    res = cli.spec_from_args(cli.build_parser().parse_args(["submit", HANG_TRAIN, "--cluster", "local",
                                                            "--startup-timeout", "90"]), []).resiliency
    assert res.startup_timeout_s == 90.0
    assert JobSpec.from_json(JobSpec(script="t.py", resiliency=res).to_json()).resiliency.startup_timeout_s == 90.0
    for bad in (0.5, float("nan"), True, 8 * 24 * 3600):
        with pytest.raises(SpecError, match="resiliency.startup_timeout_s: must be seconds from 1"):
            JobSpec(script="t.py", resiliency=ResiliencyPolicy(startup_timeout_s=bad)).validate()
    with pytest.raises(SpecError, match="resiliency.hang_timeout_s"):
        cli.run(["submit", HANG_TRAIN, "--cluster", "local", "--hang-timeout", "0", "--dry-run"], client=client)
    with pytest.raises(SpecError, match="invalid choice: 'drop'"):
        cli.run(["submit", HANG_TRAIN, "--cluster", "local", "--on-straggler", "drop", "--dry-run"], client=client)


# --------------------------------------------------------------------------- the watchdog, one process
BEATER = textwrap.dedent("""
    import faulthandler, os, signal, sys, time
    from hyperpod_lab.node.watchdog import HeartbeatWriter, FAULTHANDLER_SIGNAL
    faulthandler.register(FAULTHANDLER_SIGNAL, file=sys.stdout, all_threads=True, chain=False)
    hb = HeartbeatWriter(sys.argv[1], int(sys.argv[4]), int(sys.argv[5]))
    mode = sys.argv[3]
    def stuck_here():
        if mode == "wait":
            hb.section("allreduce", wait=True)
        if mode.startswith("quorum"):  # a wait with its own timeout (Checkpointless: torchft's + 5 s)
            hb.section("quorum", wait=True, timeout_s=60.0)
        if mode in ("wait", "sleep", "quorum-wait"):
            time.sleep(3600)
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)
    t = time.monotonic()
    for s in range(int(sys.argv[2])):
        time.sleep(0.01)
        now = time.monotonic()
        hb.step(s, now - t, now - t, 0.0)
        t = now
    print("beaten", flush=True)
    stuck_here()
""")


def start_beater(tmp_path, steps: int, mode: str = "stop", local_rank: int = 0, rank: int = 3):
    log = tmp_path / f"rank-{rank}.log"
    out = open(log, "w")
    path = heartbeat_file(str(tmp_path), local_rank)
    proc = subprocess.Popen([sys.executable, "-c", BEATER, path, str(steps), mode, str(rank), str(local_rank)],
                            stdout=out, stderr=subprocess.STDOUT)
    out.close()
    deadline = time.monotonic() + 60
    while "beaten" not in log.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
        time.sleep(0.05)
    return proc, log


@contextlib.contextmanager
def watched(tmp_path, steps: int, mode: str = "stop", **kw):
    """:func:`start_beater` (global rank 3, local rank 0) and a watchdog over it (``kw``: its
    budgets) whose ``events`` are ``(kind, data)``. Yields ``(proc, log, dog, events)``; the
    process is killed and reaped on exit."""
    proc, log = start_beater(tmp_path, steps, mode=mode)
    try:
        events = []
        dog = Watchdog(str(tmp_path), "nodeA", lambda kind, **d: events.append((kind, d)), out=open(os.devnull, "w"),
                       **kw)
        dog.workers_started([Worker(local_rank=0, global_rank=3, pid=proc.pid, log_file=str(log))])
        yield proc, log, dog, events
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def two_local_ranks(tmp_path, hang_timeout_s: float):
    """Two beaters on one node after 30 steps each: local rank 0 (global 4) then sleeping (a rank
    blocked in a collective), local rank 1 (global 5) stopped (SIGSTOP); a watchdog over both
    whose ``events`` are the reports' data. Yields ``(dog, events, sleeping proc, stopped proc)``;
    both processes are killed on exit."""
    procs = []
    try:
        for local_rank, mode in enumerate(("sleep", "stop")):
            procs.append(start_beater(tmp_path, 30, mode=mode, local_rank=local_rank, rank=4 + local_rank))
        events = []
        dog = Watchdog(str(tmp_path), "nodeA", lambda kind, **d: events.append(d), out=open(os.devnull, "w"),
                       hang_timeout_s=hang_timeout_s)
        dog.workers_started([Worker(i, 4 + i, p.pid, str(log)) for i, (p, log) in enumerate(procs)])
        yield dog, events, procs[0][0], procs[1][0]
    finally:
        for p, _ in procs:
            p.kill()


def run_until(dog: Watchdog, timeout: float) -> tuple[list, float]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        hangs = dog.check()
        if hangs:
            return hangs, time.monotonic() - t0
        time.sleep(0.05)
    return [], time.monotonic() - t0


def test_a_stopped_rank_is_dumped_reported_and_killed(tmp_path):
    with watched(tmp_path, 40, hang_timeout_s=1.5) as (proc, log, dog, events):
        hangs, waited = run_until(dog, 20)
        assert len(hangs) == 1 and waited < 1.5 + 2, (hangs, waited)
        hang = hangs[0]
        assert events == [("fault.detected", hang)]
        assert hang["reason"] == "hang" and hang["rank"] == 3 and hang["node"] == "nodeA" and hang["root_cause"]
        assert hang["process_state"] == "stopped" and hang["stacks"] == "py-spy" and hang["timeout_source"] == "spec"
        assert hang["hang_timeout_s"] == 1.5 and 1.5 <= hang["stalled_s"] < 4 and hang["step"] == 39
        assert proc.wait(timeout=10) == -signal.SIGKILL
        text = log.read_text()
        assert "py-spy dump --pid" in text and "--nonblocking" in text and "stuck_here" in text, text
        assert "made no progress for" in text
        assert dog.killed_reason(proc.pid).startswith("killed by the hang watchdog")
        assert dog.check() == []  # once


def test_without_py_spy_the_rank_writes_its_own_stacks(tmp_path, monkeypatch):
    monkeypatch.setattr(wd, "find_py_spy", lambda: None)
    with watched(tmp_path, 40, hang_timeout_s=1.0) as (proc, log, dog, events):
        hangs, _ = run_until(dog, 20)
        assert hangs and hangs[0]["stacks"] == "faulthandler", hangs
        assert proc.wait(timeout=10) == -signal.SIGKILL
        text = log.read_text()
        assert 'in stuck_here' in text and "faulthandler" in text and "py-spy not found" in text, text


def test_the_early_budget_before_enough_step_times_then_the_derived_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(wd, "HANG_FLOOR_S", 1.0)
    # 3 steps: within the warm-up, no derived T yet; the early budget max(min(floor, S), 10 x the
    # slowest step) catches the stopped rank (before issue 26 it was never declared hung)
    with watched(tmp_path, 3) as (proc, log, dog, events):
        hangs, _ = run_until(dog, 30)
        assert dog.timeout() == (None, "warm-up")
        assert hangs and hangs[0]["timeout_source"] == "early" and hangs[0]["step"] == 2, hangs
        assert hangs[0]["hang_timeout_s"] >= 1.0 and hangs[0]["stalled_s"] >= hangs[0]["hang_timeout_s"]
    # 60 steps: 55 samples after the warm-up: T = max(1 s, 10 x p99 of ~10 ms steps) = 1 s
    with watched(tmp_path, 60) as (proc, log, dog, events):
        hangs, waited = run_until(dog, 20)
        assert hangs and hangs[0]["timeout_source"] == "derived" and hangs[0]["hang_timeout_s"] == 1.0
        assert len(dog.samples) == 60 - wd.WARMUP_STEPS


def test_a_rank_waiting_in_a_collective_gets_twice_the_timeout(tmp_path):
    with watched(tmp_path, 40, mode="wait", hang_timeout_s=1.0) as (proc, log, dog, events):
        hangs, waited = run_until(dog, 20)
        assert hangs and hangs[0]["section"] == "allreduce" and hangs[0]["stalled_s"] >= 2.0, hangs
        assert hangs[0]["process_state"] == "sleeping"
        assert "Thread" in log.read_text() and "stuck_here" in log.read_text()  # py-spy on a live process


def test_a_wait_sections_timeout_spares_a_waiting_rank_but_not_a_stopped_one(tmp_path):
    """A checkpointless rank waits in its quorum/all-reduce sections with torchft's own timeout
    (plus 5 s) as the section's budget, so that a short ``hang_timeout_s`` does not kill a survivor
    waiting there for a stopped peer (seen in benchmarks/recovery_ladder.py: the survivor killed at
    2 x T, the stopped rank left alone). A *stopped* rank in such a section waits for nobody: it
    gets the budget outside sections (here the spec's T = 1 s)."""
    with watched(tmp_path, 40, mode="quorum-stop", hang_timeout_s=1.0) as (proc, log, dog, events):
        hangs, waited = run_until(dog, 20)
        assert len(hangs) == 1 and waited < 1.0 + 2, (hangs, waited)
        assert hangs[0]["timeout_source"] == "spec" and hangs[0]["section"] == "quorum", hangs
        assert hangs[0]["process_state"] == "stopped"
        assert proc.wait(timeout=10) == -signal.SIGKILL
    with watched(tmp_path, 40, mode="quorum-wait", hang_timeout_s=1.0) as (proc, log, dog, events):
        hangs, waited = run_until(dog, 3.0)  # 3 x T, beyond the 2 x T a victim gets outside the section
        assert hangs == [] and proc.poll() is None, hangs


def test_a_stopped_rank_is_handled_alone_before_its_waiting_local_peer(tmp_path):
    """Both local ranks stalled past T (one stopped, one blocked behind it, e.g. in DDP's
    all-reduce): only the stopped one is reported and killed; torchrun then restarts the other."""
    with two_local_ranks(tmp_path, hang_timeout_s=1.0) as (dog, events, blocked, stopped):
        time.sleep(1.5)  # both stalled past T by the first check
        hangs = dog.check()
        assert [h["rank"] for h in hangs] == [5] and hangs[0]["process_state"] == "stopped", hangs
        assert stopped.wait(timeout=10) == -signal.SIGKILL and blocked.poll() is None


# --------------------------------------------------------------------------- early hangs (issue 26 item 4)
def test_a_rank_stopped_in_its_first_steps_is_caught_within_its_early_budget(tmp_path):
    """A rank stopped after 3 steps (no derived T yet: about 25 steps are needed) is hung after
    its early budget max(min(30 s, S), 10 x its slowest step), S the start-up budget: here S = 2 s
    and ~10 ms steps, so 2 s. Before issue 26 it was never declared hung."""
    with watched(tmp_path, 3, startup_timeout_s=2.0) as (proc, log, dog, events):
        hangs, waited = run_until(dog, 30)
        assert len(hangs) == 1, (hangs, waited)
        hang = hangs[0]
        assert hang["timeout_source"] == "early" and hang["process_state"] == "stopped" and hang["step"] == 2, hang
        slowest = dog.watched[0].slowest
        assert hang["hang_timeout_s"] == pytest.approx(max(2.0, wd.HANG_FACTOR * slowest), abs=1e-3)
        assert hang["hang_timeout_s"] <= hang["stalled_s"] < hang["hang_timeout_s"] + 2.0, hang
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert "hang timeout" in log.read_text() and "early" in log.read_text()


def test_a_rank_stopped_before_its_first_step_is_caught_within_its_startup_budget(tmp_path):
    """Start-up (heartbeat created by hp.init(), no step yet): a stopped rank is hung after the
    start-up budget S; a running one (it may wait for a stopped peer) after twice S."""
    with watched(tmp_path, 0, startup_timeout_s=1.5) as (proc, log, dog, events):
        hangs, waited = run_until(dog, 30)
        assert len(hangs) == 1 and waited < 1.5 + 2, (hangs, waited)
        hang = hangs[0]
        assert hang["timeout_source"] == "startup" and hang["hang_timeout_s"] == 1.5 and hang["step"] is None, hang
        assert 1.5 <= hang["stalled_s"] < 1.5 + 2 and hang["process_state"] == "stopped"
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert "before its first step" in log.read_text()
    with watched(tmp_path, 0, mode="sleep", startup_timeout_s=1.0) as (proc, log, dog, events):
        hangs, waited = run_until(dog, 30)
        assert hangs and hangs[0]["timeout_source"] == "startup" and hangs[0]["process_state"] == "sleeping", hangs
        assert hangs[0]["stalled_s"] >= 2 * 1.0, hangs  # VICTIM_FACTOR x S
    # without a spec value, the default budget (600 s): nothing is declared hung in 2 s
    with watched(tmp_path, 0) as (proc, log, dog, events):
        assert dog.startup_timeout_s == wd.STARTUP_TIMEOUT_S == 600.0
        assert run_until(dog, 2.0)[0] == [] and proc.poll() is None


def test_a_stopped_rank_is_killed_at_once_when_its_worker_group_is_stopped(tmp_path):
    """torchrun stopping the workers (a peer failed first) would SIGTERM a stopped rank and wait
    its 30 s grace: stop_group reports it as a hang and SIGKILLs it at once; a running rank is left
    to torchrun's SIGTERM."""
    with two_local_ranks(tmp_path, hang_timeout_s=600.0) as (dog, events, running, stopped):
        assert dog.check() == []  # far from any budget
        t0 = time.monotonic()
        hangs = dog.stop_group()
        assert time.monotonic() - t0 < 10
        assert [h["rank"] for h in hangs] == [5] and events == hangs, hangs
        assert hangs[0]["timeout_source"] == "group-stop" and hangs[0]["hang_timeout_s"] == 600.0
        assert hangs[0]["process_state"] == "stopped" and hangs[0]["step"] == 29
        assert stopped.wait(timeout=5) == -signal.SIGKILL and running.poll() is None
        assert dog.killed_reason(stopped.pid).startswith("killed by the hang watchdog: stopped (stopped) when its worker")
        assert dog.stop_group() == []  # once


# --------------------------------------------------------------------------- real jobs
def stop_rank_1(client, argv: list[str], at_step: int, timeout: float = 240) -> tuple[str, Follow, float, dict]:
    """``hyperpod-lab submit <argv>``, followed until step ``at_step`` (within ``timeout`` s), then
    its rank 1 SIGSTOPped (``inject-fault --kind hang``). Returns ``(job id, its Follow, the time
    of the stop, inject_fault's answer)``."""
    job_id = cli.run(["submit", *argv], client=client)
    job = Follow(client, job_id)
    job.until(lambda: job.step() >= at_step, f"step {at_step}", timeout=timeout)
    t_stop = time.time()
    return job_id, job, t_stop, client.inject_fault(job_id, 1, kind="hang")


def test_local_ddp_rank_stopped_is_detected_restarted_and_the_job_completes(client):
    """A 2-rank DDP job, T = 5 s (--hang-timeout): rank 1 SIGSTOPped by inject-fault --kind hang is
    reported hung within T + 5 s with its stack (the script's line) in the job's log; torchrun
    restarts the workers, which resume from the checkpoint, and the job completes."""
    steps = 200
    job_id, job, t_hang, info = stop_rank_1(client, [
        HANG_TRAIN, "--cluster", "local", "--procs-per-node", "2", "--name", "hang-local", "--hang-timeout", "5",
        "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001",
        "--", "--steps", str(steps), "--sleep", "0.05", "--every", "10"], at_step=30)
    assert info["kind"] == "hang" and info["how"] == f"SIGSTOP to pid {info['pid']}"
    job.until(lambda: job.kinds("fault.detected", reason="hang"), "the hang", timeout=60)
    hang = job.kinds("fault.detected", reason="hang")[0]
    assert hang.data["rank"] == 1 and hang.data["hang_timeout_s"] == 5.0 and hang.data["timeout_source"] == "spec"
    assert hang.data["process_state"] == "stopped" and hang.data["stacks"] == "py-spy"
    assert hang.time - t_hang <= 5.0 + 5.0, f"detected {hang.time - t_hang:.1f} s after the SIGSTOP"
    job.until(lambda: job.kinds("finished"), "finished", timeout=300)
    assert client.wait(job_id, timeout_s=60).status == "completed"
    killed = [e for e in job.kinds("fault.detected") if e.data.get("pid") == info["pid"] and e.data.get("signal")]
    assert killed and killed[0].data["reason"].startswith("killed by the hang watchdog") and not killed[0].data["root_cause"]
    rec = job.kinds("recovery.completed")
    assert rec and rec[0].data["restored_from"] == "persistent" and rec[0].data["downtime_s"] < 60
    assert job.kinds("finished")[0].data["steps"] == steps
    log = client.logs(job_id)
    assert "hyperpod-lab: watchdog: rank 1" in log and "py-spy dump --pid" in log and "(hang_train.py:" in log, log[-3000:]
    assert len(job.kinds("fault.detected", reason="hang")) == 1


def test_local_stopped_rank_is_killed_at_once_when_a_peers_collective_times_out(client):
    """No budget runs out (start-up and hang timeouts of a week): rank 1 stopped in its first steps
    makes rank 0's all-reduce time out (5 s here). torchrun then SIGTERMs rank 1 and used to wait
    its 30 s grace (a stopped process cannot act on SIGTERM); the agent now has the watchdog report
    it (timeout_source "group-stop") and SIGKILL it first, so the job trains again within seconds."""
    week = str(7 * 24 * 3600)
    job_id, job, t_stop, info = stop_rank_1(client, [
        HANG_TRAIN, "--cluster", "local", "--procs-per-node", "2", "--name", "hang-group-stop",
        "--hang-timeout", week, "--startup-timeout", week,
        "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001", "--env", "HYPERPOD_LAB_COLLECTIVE_TIMEOUT_S=5",
        "--", "--steps", "40", "--sleep", "0.1"], at_step=1)
    job.until(lambda: job.kinds("fault.detected", reason="hang"), "the stopped rank's report", timeout=60)
    ev = job.kinds("fault.detected", reason="hang")[0]
    assert ev.data["timeout_source"] == "group-stop" and ev.data["pid"] == info["pid"], ev.data
    assert ev.data["process_state"] == "stopped" and ev.data["rank"] == 1 and ev.data["stacks"] == "py-spy"
    assert ev.time - t_stop < 5 + 10, f"reported {ev.time - t_stop:.1f} s after the SIGSTOP"  # the 5 s timeout
    job.until(lambda: [e for e in job.kinds("step") if e.time > ev.time], "a step after the report", timeout=60)
    again = min(e.time for e in job.kinds("step") if e.time > ev.time) - ev.time
    assert again < 20, f"trained again {again:.1f} s after the report (torchrun's SIGTERM grace is 30 s)"
    job.until(lambda: job.kinds("finished"), "finished", timeout=300)
    assert client.wait(job_id, timeout_s=60).status == "completed"
    killed = [e for e in job.kinds("fault.detected") if e.data.get("pid") == info["pid"] and e.data.get("signal")]
    assert killed and "stopped (stopped) when its worker group was stopped" in killed[0].data["reason"], killed


# --------------------------------------------------------------------------- the dev cluster
def test_dev_cluster_stopped_rank_is_caught_within_t_plus_5_s_and_a_fair_run_never_hangs(dev_cluster, client):
    """Must show, on real Slurm (2 nodes, checkpointless, the derived T): a rank stopped with
    SIGSTOP (inject-fault --kind hang) is detected as hung within T + 5 s with its stack in the
    log; its group is restarted, heals from the live peer and the job completes. Then a fault-free
    run of 500 steps raises no hang."""


    steps = 300
    job_id, job, t_hang, info = stop_rank_1(client, [
        FT, "--cluster", "local-slurm", "--procs-per-node", "1", "--nodes", "2", "--recovery", "checkpointless",
        "--name", "hang-ft", "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001", "--env", "RUST_LOG=warn",
        "--", "--steps", str(steps), "--step-sleep", "0.1"], at_step=40, timeout=600)
    assert info["node"] == "n2" and info["how"].startswith("SIGSTOP to pid")
    job.until(lambda: job.kinds("fault.detected", reason="hang"), "the hang", timeout=120)
    hang = job.kinds("fault.detected", reason="hang")[0].data
    detected = job.kinds("fault.detected", reason="hang")[0].time - t_hang
    assert hang["rank"] == 1 and hang["node"] == "n2" and hang["process_state"] == "stopped", hang
    assert hang["timeout_source"] == "derived" and hang["hang_timeout_s"] == 30.0, hang  # the floor: steps ~0.1 s
    assert hang["stacks"] == "py-spy"
    assert detected <= hang["hang_timeout_s"] + 5.0, f"detected {detected:.1f} s after the SIGSTOP (T {hang['hang_timeout_s']})"
    # the survivor never stopped: n1's group went on alone (the stopped group left the quorum)
    job.until(lambda: job.kinds("checkpoint.restored", tier="replica", replica_group=1), "rank 1 healing", timeout=120)
    job.until(lambda: job.kinds("finished"), "finished", timeout=600)
    rec = client.wait(job_id, timeout_s=120)
    assert rec.status == "completed", client.logs(job_id)[-3000:]
    assert job.kinds("finished")[-1].data["steps"] == steps
    log = client.logs(job_id)
    assert "hyperpod-lab: watchdog: rank 1" in log and "(ft_train.py:" in log, log[-4000:]
    assert len(job.kinds("fault.detected", reason="hang")) == 1  # only the stopped rank

    # a fault-free run of 500 steps: no hang, no straggler
    fair = cli.run(["submit", FT, "--cluster", "local-slurm", "--procs-per-node", "1", "--nodes", "2",
                    "--recovery", "checkpointless", "--name", "fair-ft",
                    "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001", "--env", "RUST_LOG=warn",
                    "--", "--steps", "500", "--step-sleep", "0.05"], client=client)
    job = Follow(client, fair)
    job.until(lambda: job.kinds("finished"), "finished", timeout=900)
    assert client.wait(fair, timeout_s=120).status == "completed"
    assert job.kinds("finished")[-1].data["steps"] == 500
    assert not job.kinds("fault.detected"), [e.data for e in job.kinds("fault.detected")]
    assert not job.kinds("straggler.detected"), [e.data for e in job.kinds("straggler.detected")]


def test_dev_cluster_rank_stopped_in_its_first_steps_is_caught_within_its_budget_and_trains_again(dev_cluster, client):
    """Must show (issue 26 item 4), on real Slurm in restart mode: a 2-node plain-DDP job
    (hang_train.py, one rank per node, no wait sections) with a start-up budget of 10 s; rank 1 is
    SIGSTOPped (inject-fault --kind hang) within its first 10 steps, long before the derived T
    exists (about 25 steps). It is detected within its budget (early: max(min(30 s, 10 s),
    10 x its slowest step)), far sooner than gloo's 60 s collective timeout, killed at once, and the
    job trains again (a step event) within 15 s of the detection, then completes."""
    steps = 60
    job_id, job, t_stop, info = stop_rank_1(client, [
        HANG_TRAIN, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", "1", "--no-health-checks",
        "--startup-timeout", "10", "--name", "early-hang", "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001",
        "--env", "RUST_LOG=warn", "--", "--steps", str(steps), "--sleep", "0.2"], at_step=1, timeout=600)
    assert info["how"].startswith("SIGSTOP to pid")  # rank 1 is on n1 or n2: the rendezvous decides
    job.until(lambda: job.kinds("fault.detected", reason="hang"), "the hang", timeout=120)
    ev = job.kinds("fault.detected", reason="hang")[0]
    hang, detected = ev.data, ev.time - t_stop
    assert hang["rank"] == 1 and hang["node"] == info["node"] and hang["process_state"] == "stopped", hang
    assert hang["step"] is not None and hang["step"] <= 9, hang  # stopped within its first 10 steps
    assert hang["timeout_source"] == "early" and hang["hang_timeout_s"] >= 10.0, hang
    # within the budget (plus the monitor interval, the stacks and the event's write); the old
    # path was gloo's collective timeout (60 s) plus torchrun's 30 s SIGTERM grace
    assert detected <= hang["hang_timeout_s"] + 3.0, f"detected {detected:.1f} s after the SIGSTOP ({hang})"
    assert detected < 60.0
    job.until(lambda: [e for e in job.kinds("step") if e.time > ev.time], "a step after the detection", timeout=120)
    again = min(e.time for e in job.kinds("step") if e.time > ev.time) - ev.time
    assert again <= 15.0, f"trained again {again:.1f} s after the detection"
    job.until(lambda: job.kinds("finished"), "finished", timeout=300)
    rec = client.wait(job_id, timeout_s=120)
    assert rec.status == "completed", client.logs(job_id)[-3000:]
    assert job.kinds("finished")[-1].data["steps"] == steps
    assert len(job.kinds("fault.detected", reason="hang")) == 1  # rank 0, blocked behind it, was not reported
    print(f"early hang: step {hang['step']}, budget {hang['hang_timeout_s']} s, detected {detected:.2f} s after "
          f"the SIGSTOP, trained again {again:.2f} s after the detection")
