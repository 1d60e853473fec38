"""Tests of the in-job runtime with real processes: two launcher agents on this host (gloo, CPU).

Two launches, shared by the tests through module fixtures (about 50 s on 2 cores):

* ``killed_run``: two ``hyperpod_lab.node.launch`` agents (``--nnodes 2``, one worker each,
  c10d rendezvous on 127.0.0.1) train ``tests/scripts/tiny_train.py`` for 40 steps with a
  checkpoint every 5; right after the first checkpoint commits, rank 1's worker is SIGKILLed
  (its pid from ``ranks/rank-1.json``). Both agents restart their workers, which resume from the
  newest complete checkpoint and finish.
* ``resumed_run``: a copy of that run's checkpoints where the newest lost its commit marker, plus
  a committed-but-garbage checkpoint and an incomplete one, is resumed by a single agent with two
  workers (``--standalone``); it must skip all three and resume from the one before.

The training script's batches depend only on (step, rank), so resumed training is bit-exact.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from agents import (
    assert_same,
    complete_steps,
    is_our_worker,
    job_with_checkpoints_of,
    kinds,
    load_dump,
    read_events,
    stop_launchers,
    tail_logs,
)
from ports import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "tiny_train.py")
STEPS, EVERY, KEEP = 40, 5, 2
STEP_INTERVAL_S = 0.5


# ---- helpers ------------------------------------------------------------------------------

def _env(job_dir: str, job_id: str, node: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({
        "HYPERPOD_LAB_JOB_DIR": job_dir,
        "HYPERPOD_LAB_JOB_ID": job_id,
        "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": str(STEP_INTERVAL_S),
        # required when agents re-rendezvous (see hyperpod_lab.node.launch / the report)
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "OMP_NUM_THREADS": "1",
    })
    env.pop("SLURMD_NODENAME", None)
    if node:
        env["SLURMD_NODENAME"] = node
    return env






# ---- fixtures -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("killed")
    job_dir = str(base / "job")
    os.makedirs(job_dir)
    port = free_port()
    procs, logs = [], []
    for node in ("n1", "n2"):
        log = str(base / f"agent-{node}.log")
        logs.append(log)
        with open(log, "w") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "hyperpod_lab.node.launch", "--nnodes", "2", "--nproc-per-node", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "killed-run",
                 "--max-restarts", "3", "--monitor-interval", "0.1",
                 "--log-dir", os.path.join(job_dir, "logs"), "--tee", "3",
                 SCRIPT, "--steps", str(STEPS), "--every", str(EVERY), "--keep", str(KEEP), "--sleep", "0.05",
                 "--dump"],
                cwd=ROOT, env=_env(job_dir, "killed-run", node), stdout=out, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + 90
        while not kinds(read_events(job_dir), "checkpoint.saved"):
            assert time.monotonic() < deadline, "no checkpoint within 90 s" + tail_logs(logs)
            assert all(p.poll() is None for p in procs), "a launcher exited early" + tail_logs(logs)
            time.sleep(0.05)
        with open(os.path.join(job_dir, "ranks", "rank-1.json")) as f:
            victim = json.load(f)
        assert is_our_worker(victim["pid"], job_dir, "tiny_train.py"), victim
        os.kill(victim["pid"], signal.SIGKILL)
        t_kill = time.time()
        rcs = [p.wait(timeout=120) for p in procs]
    except BaseException:
        stop_launchers(procs, job_dir, "tiny_train.py")
        raise
    return {"job_dir": job_dir, "rcs": rcs, "victim": victim, "t_kill": t_kill, "logs": logs,
            "events": read_events(job_dir)}


@pytest.fixture(scope="module")
def resumed_run(killed_run, tmp_path_factory):
    base = tmp_path_factory.mktemp("resumed")
    job_dir, ck = job_with_checkpoints_of(killed_run["job_dir"], base)
    newest = complete_steps(job_dir)[-1]
    os.remove(os.path.join(ck, f"step-{newest:08d}", "COMMITTED"))       # a save that never committed
    os.makedirs(os.path.join(ck, "step-00000042"))                       # committed, but garbage
    with open(os.path.join(ck, "step-00000042", ".metadata"), "wb") as f:
        f.write(b"not a pickle")
    with open(os.path.join(ck, "step-00000042", "COMMITTED"), "w") as f:
        json.dump({"step": 42}, f)
    os.makedirs(os.path.join(ck, "step-00000045"))                       # a half-written save
    with open(os.path.join(ck, "step-00000045", "__0_0.distcp"), "wb") as f:
        f.write(b"\0" * 100)
    log = str(base / "agent.log")
    with open(log, "w") as out:
        p = subprocess.Popen(
            [sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nproc-per-node", "2",
             "--monitor-interval", "0.1", "--log-dir", os.path.join(job_dir, "logs"),
             SCRIPT, "--steps", str(STEPS), "--every", str(EVERY), "--keep", str(KEEP), "--sleep", "0", "--dump"],
            cwd=ROOT, env=_env(job_dir, "resumed-run", None), stdout=out, stderr=subprocess.STDOUT)
    try:
        rc = p.wait(timeout=90)
    except BaseException:
        stop_launchers([p], job_dir, "tiny_train.py")
        raise
    return {"job_dir": job_dir, "rc": rc, "newest_before": newest, "logs": [log], "events": read_events(job_dir)}


# ---- the kill-a-worker scenario ----------------------------------------------------------------
def test_killed_worker_job_recovers_and_finishes(killed_run):
    ev = killed_run["events"]
    assert killed_run["rcs"] == [0, 0], tail_logs(killed_run["logs"])
    finished = kinds(ev, "finished")
    assert len(finished) == 1 and finished[0]["data"]["status"] == "succeeded"
    assert finished[0]["data"]["steps"] == STEPS
    assert len(kinds(ev, "started")) == 1


def test_recovery_events_in_order(killed_run):
    ev = killed_run["events"]
    victim = killed_run["victim"]
    fault = next(e for e in ev if e["kind"] == "fault.detected" and e["data"]["rank"] == 1)
    assert fault["writer"] == "agent-n2"
    assert fault["data"]["signal"] == "SIGKILL" and fault["data"]["exitcode"] == -9
    assert fault["data"]["pid"] == victim["pid"] and fault["data"]["node"] == "n2"
    assert fault["data"]["local_rank"] == 0 and fault["data"]["reason"]
    started = next(e for e in ev if e["kind"] == "recovery.started" and e["writer"] == "agent-n2")
    assert started["data"] == {"restart_count": 1, "reason": "local worker failed", "node": "n2", "level": "process"}
    # the other agent restarts too: its worker failed on the dead peer, or it saw n2 re-rendezvous
    other = next(e for e in ev if e["kind"] == "recovery.started" and e["writer"] == "agent-n1")
    assert other["data"]["reason"] in ("local worker failed", "peer re-rendezvous")
    restored = next(e for e in ev if e["kind"] == "checkpoint.restored")
    completed = next(e for e in ev if e["kind"] == "recovery.completed")
    finished = next(e for e in ev if e["kind"] == "finished")
    assert fault["time"] <= started["time"] < restored["time"] < completed["time"] < finished["time"]
    assert other["time"] < restored["time"]

    # resumed from the newest checkpoint committed before the fault
    saved_before = [e["data"]["step"] for e in kinds(ev, "checkpoint.saved") if e["time"] < fault["time"]]
    assert restored["data"]["step"] == max(saved_before)
    assert restored["data"]["tier"] == "persistent" and restored["data"]["bytes"] > 0
    assert completed["data"]["restored_step"] == restored["data"]["step"]
    assert completed["data"]["restored_from"] == "persistent"
    assert completed["data"]["restart_count"] == 1
    assert 0 < completed["data"]["downtime_s"] < 60
    # the downtime is measured from the first detection of this incident
    assert completed["time"] - completed["data"]["downtime_s"] == pytest.approx(fault["time"], abs=0.5)
    first_after = next(e for e in kinds(ev, "step") if e["time"] > completed["time"])
    assert first_after["data"]["step"] == restored["data"]["step"] + 1


def test_rank_files_describe_the_restarted_workers(killed_run):
    job_dir = killed_run["job_dir"]
    for rank in (0, 1):
        with open(os.path.join(job_dir, "ranks", f"rank-{rank}.json")) as f:
            info = json.load(f)
        assert info["rank"] == rank and info["world_size"] == 2 and info["local_rank"] == 0
        assert info["restart_count"] == 1 and info["node"] in ("n1", "n2")
        assert info["host"] == socket.gethostname() and info["pid"] > 0
        # --log-dir with --tee: the worker's stdout of this incarnation is in log_file
        assert info["log_file"].startswith(os.path.join(job_dir, "logs"))
        with open(info["log_file"]) as f:
            assert f"rank {rank}/2 restart_count=1 " in f.read()
    with open(os.path.join(job_dir, "ranks", "rank-1.json")) as f:
        assert json.load(f)["pid"] != killed_run["victim"]["pid"]


def test_checkpoints_saved_committed_and_retained(killed_run):
    ev = killed_run["events"]
    saved = kinds(ev, "checkpoint.saved")
    assert {e["data"]["step"] for e in saved} == set(range(EVERY - 1, STEPS, EVERY))
    for e in saved:
        d = e["data"]
        assert e["writer"] == "rank-0" and d["tier"] == "persistent" and d["bytes"] > 0
        assert 0 <= d["blocked_s"] <= d["total_s"]
        assert d["path"].endswith(f"step-{d['step']:08d}")
    job_dir = killed_run["job_dir"]
    assert complete_steps(job_dir) == [STEPS - 1 - EVERY, STEPS - 1]
    assert sorted(os.listdir(os.path.join(job_dir, "checkpoints"))) == [f"step-{STEPS - 1 - EVERY:08d}",
                                                                         f"step-{STEPS - 1:08d}"]
    with open(os.path.join(job_dir, "checkpoints", f"step-{STEPS - 1:08d}", "COMMITTED")) as f:
        marker = json.load(f)
    assert marker["step"] == STEPS - 1 and marker["world_size"] == 2 and marker["bytes"] > 0


def test_step_events_are_rate_limited(killed_run):
    ev = killed_run["events"]
    steps = kinds(ev, "step")
    assert all(e["writer"] == "rank-0" for e in steps)
    assert 2 <= len(steps) < STEPS / 2
    restored_at = next(e["time"] for e in ev if e["kind"] == "recovery.completed")
    for incarnation in ([e for e in steps if e["time"] < restored_at], [e for e in steps if e["time"] > restored_at]):
        assert incarnation, "each (re)start emits its first step"
        assert incarnation[0]["data"]["steps_per_s"] is None
        for a, b in zip(incarnation, incarnation[1:]):
            assert b["time"] - a["time"] >= STEP_INTERVAL_S - 0.05
            assert b["data"]["steps_per_s"] > 0 and b["data"]["step"] > a["data"]["step"]
    assert steps[0]["data"]["step"] == 0


# ---- restore: skipping incomplete/corrupt checkpoints, exact round trip -------------------------
def test_incomplete_and_corrupt_checkpoints_are_skipped(resumed_run):
    ev = resumed_run["events"]
    assert resumed_run["rc"] == 0, tail_logs(resumed_run["logs"])
    newest = resumed_run["newest_before"]
    corrupt = kinds(ev, "checkpoint.corrupt")
    assert [os.path.basename(os.path.dirname(e["data"]["path"])) for e in corrupt] == [
        "step-00000045", "step-00000042", f"step-{newest:08d}"]
    assert "commit marker" in corrupt[0]["data"]["reason"] and "commit marker" in corrupt[2]["data"]["reason"]
    assert "commit marker" not in corrupt[1]["data"]["reason"]
    restored = kinds(ev, "checkpoint.restored")
    assert len(restored) == 1 and restored[0]["data"]["step"] == newest - EVERY
    assert all(e["time"] < restored[0]["time"] for e in corrupt)
    finished = kinds(ev, "finished")
    assert finished and finished[0]["data"]["steps"] == STEPS
    # incomplete dirs were removed, the committed-but-unloadable one set aside, retention re-applied
    names = sorted(os.listdir(os.path.join(resumed_run["job_dir"], "checkpoints")))
    assert [n for n in names if n.startswith("step-")] == [f"step-{newest - EVERY:08d}", f"step-{newest:08d}"]
    assert [n for n in names if n.startswith("corrupt-")][0].startswith("corrupt-step-00000042-")
    assert complete_steps(resumed_run["job_dir"]) == [newest - EVERY, newest]


def test_restore_round_trip_is_exact(killed_run, resumed_run):
    """What a fresh process restores equals what the saving process held: model, AdamW state, and
    the per-rank state saved under per-rank keys."""
    step = resumed_run["newest_before"] - EVERY
    for rank in (0, 1):
        saved = load_dump(killed_run["job_dir"], f"step-{step}-rank-{rank}.pt")
        restored = load_dump(resumed_run["job_dir"], f"restored-rank-{rank}.pt")
        assert restored["rank"] == rank
        assert_same(saved["model"], restored["model"], "model")
        assert_same(saved["optim"], restored["optim"], "optim")
        assert_same(saved["local"], restored["local"], "local")
        assert int(restored["local"]["samples_seen"]) == 32 * (step + 1)
        assert int(restored["optim"]["state"][0]["step"]) == step + 1


def test_resumed_training_is_bit_exact(killed_run, resumed_run):
    """Both runs were interrupted and resumed from different checkpoints; both must end with the
    same parameters and optimizer state."""
    for rank in (0, 1):
        a = load_dump(killed_run["job_dir"], f"final-rank-{rank}.pt")
        b = load_dump(resumed_run["job_dir"], f"final-rank-{rank}.pt")
        assert_same(a["model"], b["model"], "model")
        assert_same(a["optim"], b["optim"], "optim")
        assert_same(a["local"], b["local"], "local")


# ---- outside torchrun ---------------------------------------------------------------------------
def test_plain_python_is_a_single_member_job(tmp_path):
    """``python train.py`` (or a notebook): rank 0 of 1, a fresh temporary job dir, an adhoc id,
    and a real process group (the script wraps its model in DDP and checkpoints with DCP)."""
    env = _env("", "", None)
    for k in ("HYPERPOD_LAB_JOB_DIR", "HYPERPOD_LAB_JOB_ID"):
        env.pop(k)
    out = subprocess.run([sys.executable, SCRIPT, "--steps", "10", "--every", "5", "--sleep", "0"],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("rank "))
    fields = dict(kv.split("=", 1) for kv in line.split()[2:])
    job_dir = fields["job_dir"]
    try:
        assert line.startswith("rank 0/1 ") and fields["job_id"].startswith("adhoc-")
        ev = read_events(job_dir)
        assert [e["kind"] for e in ev if e["kind"] != "step"] == [
            "started", "checkpoint.saved", "checkpoint.saved", "finished"]
        assert ev[0]["data"]["world_size"] == 1 and ev[0]["job_id"] == fields["job_id"]
        assert kinds(ev, "step")[0]["data"]["step"] == 0
        assert complete_steps(job_dir) == [4, 9]
        with open(os.path.join(job_dir, "ranks", "rank-0.json")) as f:
            info = json.load(f)
        assert info["world_size"] == 1 and info["log_file"] is None and info["restart_count"] == 0
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)


def test_runtime_imports_no_jupyter_and_no_dcp_until_used():
    code = ("import sys, hyperpod_lab.runtime, hyperpod_lab.node.launch\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('IPython', 'ipykernel', 'ipywidgets', 'jupyter_server', 'jupyterlab', 'paramiko', 'tornado'))\n"
            "assert not bad, bad\n"
            "assert 'torch.distributed.checkpoint' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], env=_env("", "", None), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
