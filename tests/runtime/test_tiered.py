"""Tests of the tiered checkpointer: memory, peer and persistent tiers, with real processes.

Two launches of ``tests/scripts/tiered_train.py`` by two launcher agents on this host, named as
nodes n1 and n2 (``SLURMD_NODENAME``), one worker each, gloo. As on the dev cluster, both "nodes"
share this host's ``/dev/shm``, which is why the memory tier's paths include the node name; the
tests point ``HYPERPOD_LAB_SHM_DIR`` at a directory of their own and wipe ``<job>/n2`` to play
the loss of node n2's memory.

* ``node_loss_run`` (overlap off): rank 1 SIGKILLs itself in the middle of copying its memory
  snapshot of step 14 -> both workers restart and resume from step 9, each from its own memory
  (the torn slot is not used). Later the test SIGKILLs node n2's agent and worker, wipes n2's
  shared memory and starts a replacement agent for n2 -> rank 0 resumes from its own memory,
  rank 1 from the replica rank 0 held ("peer"), and nothing is read from storage.
* ``fallback_run`` (overlap on, background copies slowed down): at step 14 both copies of rank
  1's state (its own snapshot and the replica on n1) are deleted and rank 1 is killed -> the
  restart falls back to the persistent tier (step 9). Every overlapped snapshot is compared
  with the state at its step.

The batches depend only on (step, rank), so restored states can be compared bit for bit with the
dumps the script wrote at the saved step. Plus in-process tests of the memory tier and of
the placement function, and a two-process contract test of the transports.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
import torch
from agents import assert_same, kinds, read_events, stop_launchers
from ports import free_port

from hyperpod_lab.runtime.checkpoint import memory as memory_tier
from hyperpod_lab.runtime.checkpoint.memory import MemoryTier
from hyperpod_lab.runtime.checkpoint.peer import partner_map, sources_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "tiered_train.py")
KILL_STEP = 14


# ---- helpers ------------------------------------------------------------------------------

def _env(job_dir: str, job_id: str, node: str, shm: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({"HYPERPOD_LAB_JOB_DIR": job_dir, "HYPERPOD_LAB_JOB_ID": job_id, "HYPERPOD_LAB_SHM_DIR": shm,
                "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.5", "HYPERPOD_LAB_PEER_TIMEOUT_S": "30",
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1", "SLURMD_NODENAME": node, "PYTHONFAULTHANDLER": "1"})
    for k in ("TIERED_KILL_RANK", "TIERED_KILL_AT_STEP", "TIERED_WIPE_AT_STEP", "TIERED_SLOW_COPY_S"):
        env.pop(k, None)
    env.update(extra)
    return env


def _agent(job_dir: str, job_id: str, node: str, port: int, shm: str, log: str, args: list[str],
           nproc: int = 1, **extra: str) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "hyperpod_lab.node.launch", "--nnodes", "2", "--nproc-per-node", str(nproc),
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job_id,
             # a dead agent leaves the rendezvous after ~2 s instead of 15 s
             "--rdzv-conf", "keep_alive_interval=1,keep_alive_max_attempt=2",
             "--max-restarts", "3", "--monitor-interval", "0.1",
             "--log-dir", os.path.join(job_dir, "logs", node + "-" + uuid.uuid4().hex[:6]), "--tee", "3",
             SCRIPT, *args],
            cwd=ROOT, env=_env(job_dir, job_id, node, shm, **extra), stdout=out, stderr=subprocess.STDOUT)


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Wait until the first agent hosts the c10d store (so the agent that dies later is not it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the first agent exited"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("the first agent never listened")


def _start_agents(base, job_id: str, shm: str, args: list[str], nproc: int = 1,
                  **fault: str) -> tuple[str, int, list]:
    """A new job ``base/job`` and its two agents: n1 (the c10d store's host) first, then n2.

    Returns:
        ``(job_dir, rendezvous port, [agent n1, agent n2])``; on failure both are stopped.
    """
    job_dir = str(base / "job")
    os.makedirs(job_dir)
    port = free_port()
    procs = [_agent(job_dir, job_id, "n1", port, shm, str(base / "agent-n1.log"), args, nproc, **fault)]
    try:
        _wait_port(port, procs[0])
        procs.append(_agent(job_dir, job_id, "n2", port, shm, str(base / "agent-n2.log"), args, nproc, **fault))
    except BaseException:
        stop_launchers(procs, job_dir, "tiered_train.py")
        raise
    return job_dir, port, procs




def _logs(base) -> str:
    text = ""
    for p in sorted(glob.glob(os.path.join(str(base), "*.log"))) + sorted(
            glob.glob(os.path.join(str(base), "job", "logs", "**", "*.log"), recursive=True)):
        with open(p, errors="replace") as f:
            text += f"\n===== {p}\n" + f.read()[-3000:]
    return text


def _worker_pid(job_dir: str, rank: int, node: str) -> int:
    with open(os.path.join(job_dir, "ranks", f"rank-{rank}.json")) as f:
        info = json.load(f)
    assert info["node"] == node, info
    return info["pid"]



def _load(job_dir: str, name: str) -> dict:
    return torch.load(os.path.join(job_dir, "dumps", name), weights_only=False)



def _assert_state_equal(a: dict, b: dict) -> None:
    for part in ("model", "optim", "local"):
        assert_same(a[part], b[part], part)


@pytest.fixture(scope="module")
def shm_dir():
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    import tempfile

    d = tempfile.mkdtemp(prefix="hyperpod-lab-test-shm-", dir=base)
    yield d
    shutil.rmtree(d, ignore_errors=True)


# ---- launches -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def node_loss_run(tmp_path_factory, shm_dir):
    base, job_id = tmp_path_factory.mktemp("nodeloss"), "tiered-nodeloss"
    args = ["--steps", "40", "--memory-every", "5", "--every", "20", "--sleep", "0.1", "--dump"]
    fault = {"TIERED_KILL_RANK": "1", "TIERED_KILL_AT_STEP": str(KILL_STEP)}
    job_dir, port, procs = _start_agents(base, job_id, shm_dir, args, **fault)
    try:
        deadline = time.monotonic() + 90
        # incarnation 1 (after the self-kill) restored; wait until rank 1's replica of a step >= 19
        # is committed on n1
        while True:
            ev = read_events(job_dir)
            restored = kinds(ev, "checkpoint.restored")
            t_r = max((e["time"] for e in restored), default=None)
            held = [e["data"]["step"] for e in kinds(ev, "checkpoint.saved", tier="peer", node="n1", of_rank=1)
                    if len(restored) >= 2 and e["time"] > t_r and e["data"]["step"] >= 19]
            # ... and the script dumped both ranks' state at that step (to compare with later)
            if held and all(os.path.exists(os.path.join(job_dir, "dumps", f"inc1-step-{max(held)}-rank-{r}.pt"))
                            for r in (0, 1)):
                break
            assert time.monotonic() < deadline, "no replica of step >= 19 within 90 s" + _logs(base)
            assert all(p.poll() is None for p in procs), "an agent exited early" + _logs(base)
            time.sleep(0.05)
        # lose node n2: its agent, its worker (the agent's death does not kill it), its memory
        victim = _worker_pid(job_dir, 1, "n2")
        procs[1].kill()
        os.kill(victim, signal.SIGKILL)
        t_kill = time.time()
        procs[1].wait()
        shutil.rmtree(os.path.join(shm_dir, job_id, "n2"))
        procs.append(_agent(job_dir, job_id, "n2", port, shm_dir, str(base / "agent-n2-new.log"), args))
        rcs = [procs[0].wait(timeout=120), procs[2].wait(timeout=60)]
    except BaseException:
        stop_launchers(procs, job_dir, "tiered_train.py")
        raise
    return {"job_dir": job_dir, "base": base, "rcs": rcs, "t_kill": t_kill, "events": read_events(job_dir),
            "shm": os.path.join(shm_dir, job_id)}


@pytest.fixture(scope="module")
def fallback_run(tmp_path_factory, shm_dir):
    base, job_id = tmp_path_factory.mktemp("fallback"), "tiered-fallback"
    args = ["--steps", "30", "--memory-every", "5", "--every", "10", "--sleep", "0.02", "--overlap", "--dump"]
    fault = {"TIERED_WIPE_AT_STEP": str(KILL_STEP), "TIERED_SLOW_COPY_S": "0.02"}
    job_dir, _, procs = _start_agents(base, job_id, shm_dir, args, **fault)
    try:
        rcs = [p.wait(timeout=120) for p in procs]
    except BaseException:
        stop_launchers(procs, job_dir, "tiered_train.py")
        raise
    return {"job_dir": job_dir, "base": base, "rcs": rcs, "events": read_events(job_dir),
            "shm": os.path.join(shm_dir, job_id)}


# ---- kill during a memory save; node loss ------------------------------------------------------
def test_node_loss_run_finishes(node_loss_run):
    ev = node_loss_run["events"]
    assert node_loss_run["rcs"] == [0, 0], _logs(node_loss_run["base"])
    finished = kinds(ev, "finished")
    assert len(finished) == 1 and finished[0]["data"]["steps"] == 40
    a, b = (_load(node_loss_run["job_dir"], f"final-rank-{r}.pt") for r in (0, 1))
    # the DDP replicas' parameters agree after mixed-tier restores (BatchNorm running stats are
    # per rank: each rank's last forward updated them with its own batch)
    params = [k for k in a["model"] if "running_" not in k and "num_batches" not in k]
    assert_same({k: a["model"][k] for k in params}, {k: b["model"][k] for k in params}, "model")
    assert int(a["local"]["samples_seen"]) == int(b["local"]["samples_seen"]) == 32 * 40
    # a normal end releases the shared memory
    assert not os.path.exists(node_loss_run["shm"]) or not any(
        files for _d, _s, files in os.walk(node_loss_run["shm"]))


def test_kill_during_memory_save_resumes_from_newest_complete_step(node_loss_run):
    ev, job_dir = node_loss_run["events"], node_loss_run["job_dir"]
    fault = next(e for e in ev if e["kind"] == "fault.detected")
    assert fault["writer"] == "agent-n2" and fault["data"]["signal"] == "SIGKILL"
    before = [e for e in ev if e["time"] < fault["time"]]
    # rank 1 died copying step 14: its step-14 slot was never committed; rank 0's may have been
    assert {e["data"]["step"] for e in kinds(before, "checkpoint.saved", tier="memory", rank=1)} == {4, 9}
    first = sorted(kinds(ev, "checkpoint.restored"), key=lambda e: e["time"])[:2]
    assert sorted((e["data"]["rank"], e["data"]["tier"], e["data"]["step"]) for e in first) == [
        (0, "memory", 9), (1, "memory", 9)]
    for e in first:
        assert e["data"]["bytes"] > 0 and 0 <= e["data"]["seconds"] < 30
    for rank in (0, 1):
        restored = _load(job_dir, f"inc1-restored-rank-{rank}.pt")
        assert restored["start"] == 10
        _assert_state_equal(_load(job_dir, f"inc0-step-9-rank-{rank}.pt"), restored)
    completed = kinds(ev, "recovery.completed")[0]
    assert completed["data"]["restored_from"] == "memory" and completed["data"]["restored_step"] == 9


def test_node_loss_restores_from_peer_without_storage(node_loss_run):
    ev, job_dir, t_kill = node_loss_run["events"], node_loss_run["job_dir"], node_loss_run["t_kill"]
    # the newest step of rank 1 whose replica n1 held when n2 was lost
    held = max(e["data"]["step"] for e in kinds(ev, "checkpoint.saved", tier="peer", node="n1", of_rank=1)
               if e["time"] < t_kill)
    after = [e for e in kinds(ev, "checkpoint.restored") if e["time"] > t_kill]
    by_node = {e["data"]["node"]: e["data"] for e in after}
    assert len(after) == 2 and set(by_node) == {"n1", "n2"}, after
    assert by_node["n1"]["tier"] == "memory" and by_node["n2"]["tier"] == "peer"
    assert by_node["n1"]["step"] == by_node["n2"]["step"] == held
    assert by_node["n2"]["from_node"] == "n1" and by_node["n2"]["bytes"] > 0
    # no storage read: the persistent tier restored nothing in the whole run
    assert not kinds(ev, "checkpoint.restored", tier="persistent")
    assert all(e["data"]["tier"] in ("memory", "peer") for e in kinds(ev, "checkpoint.restored"))
    completed = [e for e in kinds(ev, "recovery.completed") if e["time"] > t_kill]
    assert completed and completed[0]["data"]["restored_from"] == "peer"
    assert completed[0]["data"]["restored_step"] == held
    for rank in (0, 1):
        restored = _load(job_dir, f"inc2-restored-rank-{rank}.pt")
        assert restored["start"] == held + 1
        _assert_state_equal(_load(job_dir, f"inc1-step-{held}-rank-{rank}.pt"), restored)


def test_saved_events_report_bytes_and_times(node_loss_run):
    ev = node_loss_run["events"]
    mem = kinds(ev, "checkpoint.saved", tier="memory")
    assert {e["writer"] for e in mem} == {"rank-0", "rank-1"}
    for e in mem:
        d = e["data"]
        assert d["bytes"] > 0 and 0 <= d["blocked_s"] <= d["total_s"] and (d["step"] + 1) % 5 == 0
        # bounded: keep_last (2) own slots + 2 replica slots, page-rounded
        assert 0 < d["memory_bytes"] <= 4 * ((d["bytes"] + 4095) // 4096 * 4096)
    peer = kinds(ev, "checkpoint.saved", tier="peer")
    assert peer and all(e["data"]["of_rank"] != e["data"]["rank"] and e["data"]["bytes"] > 0 for e in peer)
    persistent = kinds(ev, "checkpoint.saved", tier="persistent")
    assert {e["data"]["step"] for e in persistent} >= {39}


# ---- both copies lost -> persistent; overlap consistency ------------------------------------------
def test_losing_both_copies_falls_back_to_persistent(fallback_run):
    ev, job_dir = fallback_run["events"], fallback_run["job_dir"]
    assert fallback_run["rcs"] == [0, 0], _logs(fallback_run["base"])
    assert kinds(ev, "finished")[0]["data"]["steps"] == 30
    restored = kinds(ev, "checkpoint.restored")
    assert [(e["data"]["tier"], e["data"]["step"]) for e in restored] == [("persistent", 9)], restored
    assert kinds(ev, "recovery.completed")[0]["data"]["restored_from"] == "persistent"
    want = [_load(job_dir, f"inc0-step-9-rank-{rank}.pt") for rank in (0, 1)]
    got = [_load(job_dir, f"inc1-restored-rank-{rank}.pt") for rank in (0, 1)]
    buffers = [k for k in want[0]["model"] if "running_" in k or "num_batches" in k]
    for k in buffers:
        # DCP saves a key present on every rank once (from one rank of its choice): both ranks get
        # the same BatchNorm running stats, as DDP's buffer broadcast at the next forward would do
        assert torch.equal(got[0]["model"][k], got[1]["model"][k])
        assert any(torch.equal(got[0]["model"][k], w["model"][k]) for w in want), k
    for rank in (0, 1):
        assert got[rank]["start"] == 10
        for k in buffers:
            want[rank]["model"][k] = got[rank]["model"][k]
        _assert_state_equal(want[rank], got[rank])


def test_overlap_snapshots_equal_the_state_at_their_step(fallback_run):
    job_dir = fallback_run["job_dir"]
    snaps = sorted(glob.glob(os.path.join(job_dir, "dumps", "inc*-snap-*-rank-*.pt")))
    assert len(snaps) >= 8, snaps  # steps 4, 9 (and 14 is cut by the kill), 19, 24 on two ranks
    for path in snaps:
        inc, _snap, step, _rank, rank = os.path.basename(path)[:-3].split("-")
        _assert_state_equal(_load(job_dir, f"{inc}-step-{step}-rank-{rank}.pt"), torch.load(path, weights_only=False))
    # the copies really overlapped the next step: the optimizer pre-hook had to wait for them
    mem = kinds(fallback_run["events"], "checkpoint.saved", tier="memory")
    assert mem and max(e["data"]["blocked_s"] for e in mem) > 0.05


# ---- one process (python train.py): its own memory across a crash --------------------------------
def test_single_process_resumes_from_its_own_memory(tmp_path, shm_dir):
    """A world of one (no torchrun): SIGKILLed in the middle of the memory save of step 14, run
    again, it resumes from its own memory at step 9 (the torn slot of step 14 unused)."""
    job_dir = str(tmp_path / "job")
    env = _env(job_dir, "tiered-single", "solo", shm_dir)
    env.pop("SLURMD_NODENAME")
    args = [sys.executable, SCRIPT, "--steps", "20", "--every", "100", "--sleep", "0", "--dump"]
    first = subprocess.run(args, env=dict(env, TIERED_KILL_RANK="0", TIERED_KILL_AT_STEP=str(KILL_STEP)),
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
    second = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stdout + second.stderr
    restored = kinds(read_events(job_dir), "checkpoint.restored")
    assert [(e["data"]["tier"], e["data"]["step"]) for e in restored] == [("memory", 9)]
    got = _load(job_dir, "inc0-restored-rank-0.pt")
    assert got["start"] == 10
    # (both runs count as incarnation 0; the second starts at step 10, so this dump is the first's)
    _assert_state_equal(_load(job_dir, "inc0-step-9-rank-0.pt"), got)
    assert not os.path.exists(os.path.join(shm_dir, "tiered-single"))  # released at the normal end


# ---- in-process: the memory tier alone; placement; transports -------------------------------------
def _toy_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    extra = {"pos": 3, "rng": torch.get_rng_state(), "nested": {"t": torch.arange(5, dtype=torch.float64)}}
    return {"model": model, "optim": opt, "extra": extra}


def _train(state, n=1):
    for _ in range(n):
        state["model"](torch.randn(6, 4)).square().sum().backward()
        state["optim"].step()
        state["optim"].zero_grad()
        state["extra"]["pos"] += 1
        state["extra"]["nested"]["t"] += 1


def _export(state):
    import copy

    return {"model": {k: v.clone() for k, v in state["model"].state_dict().items()},
            "optim": copy.deepcopy(state["optim"].state_dict()), "local": copy.deepcopy(state["extra"])}


def test_memory_tier_round_trip_ring_and_torn_slots(tmp_path, monkeypatch):
    state = _toy_state()
    tier = MemoryTier(str(tmp_path / "rank-0"), keep_last=2)
    _train(state)
    tier.snapshot(0, state)
    at0 = _export(state)
    _train(state)
    tier.snapshot(1, state, overlap=True)
    tier.wait_copy()
    at1 = _export(state)
    tier.wait()
    assert tier.complete_steps() == [1, 0]
    size = tier.last.nbytes
    assert tier.memory_bytes == 2 * ((size + 4095) // 4096 * 4096)

    # a copy that dies half-way leaves its slot without a record: never used
    calls = [0]
    real = memory_tier._copy_leaf

    def dying(dst, src, non_blocking):
        calls[0] += 1
        if calls[0] == 4:
            raise KeyboardInterrupt("killed mid-copy")
        real(dst, src, non_blocking)

    monkeypatch.setattr(memory_tier, "_copy_leaf", dying)
    _train(state)
    with pytest.raises(KeyboardInterrupt):
        tier.snapshot(2, state)
    monkeypatch.setattr(memory_tier, "_copy_leaf", real)
    assert tier.complete_steps() == [1]  # step 0's slot was reused and is torn now
    assert tier.memory_bytes == 2 * ((size + 4095) // 4096 * 4096)  # the ring did not grow
    tier.close()

    # a fresh process (a new MemoryTier on the same files) restores step 1 exactly
    fresh = _toy_state()
    again = MemoryTier(str(tmp_path / "rank-0"), keep_last=2)
    assert again.restore(fresh) == 1
    got = _export(fresh)
    assert_same(at1["model"], got["model"], "model")
    assert_same(at1["optim"], got["optim"], "optim")
    assert_same(at1["local"], got["local"], "extra")
    assert at0["local"]["pos"] + 1 == got["local"]["pos"]

    # a flipped byte fails the checksum: that slot is skipped
    again.snapshot(3, fresh)
    again.wait()
    slot = next(s for s in again.ring.slots if (s.read_record() or {}).get("step") == 3)
    slot.buf[10] ^= 0xFF
    assert again.restore(_toy_state()) == 1
    again.close(remove=True)
    assert not os.path.exists(tmp_path / "rank-0")


def test_memory_tier_rejects_sharded_and_odd_state(tmp_path):
    tier = MemoryTier(str(tmp_path / "r"), keep_last=1)
    with pytest.raises(TypeError):
        tier.snapshot(0, {"x": 3})
    with pytest.raises(TypeError):
        tier.snapshot(0, {"x": {"s": torch.eye(3).to_sparse()}})
    tier.close(remove=True)


def test_partner_map_places_replicas_on_other_nodes():
    nodes = ["a", "a", "b", "b", "c", "c"]
    p = partner_map(nodes, 1)
    assert p == {0: [2], 1: [3], 2: [4], 3: [5], 4: [0], 5: [1]}  # (r + local_world_size) % world
    p2 = partner_map(nodes, 5)  # capped at nodes - 1
    assert all(len(v) == 2 and all(nodes[h] != nodes[r] for h in v) for r, v in p2.items())
    assert sources_of(p, 0) == [4]
    assert partner_map(["a", "a"], 1) == {0: [], 1: []}
    assert partner_map(["n1", "n2"], 1) == {0: [1], 1: [0]}


_CONTRACT = r"""
import os, sys, time, torch, torch.distributed as dist
from datetime import timedelta
from hyperpod_lab.runtime.checkpoint.peer import GlooTransport, StagedTransport, PeerError
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2,
                        timeout=timedelta(seconds=30))
other = 1 - rank
for t in (GlooTransport(None), StagedTransport(None, "cpu", chunk_bytes=1000)):
    for n in (0, 1, 999, 1000, 4321):
        out = (torch.arange(n) * (rank + 3) % 251).to(torch.uint8)
        got = torch.full((n,), 7, dtype=torch.uint8)
        t.exchange([(other, out)], [(other, got)], timeout=timedelta(seconds=20), tag=5)
        want = (torch.arange(n) * (other + 3) % 251).to(torch.uint8)
        assert torch.equal(got, want), (type(t).__name__, n)
dist.barrier()
# a receive the peer never sends must fail within the timeout (or when the peer exits), not hang
if rank == 0:
    t0 = time.monotonic()
    try:
        GlooTransport(None).exchange([], [(1, torch.empty(10, dtype=torch.uint8))],
                                     timeout=timedelta(seconds=1), tag=9)
    except PeerError as e:
        print("timeout ok", round(time.monotonic() - t0, 1), e)
    else:
        raise AssertionError("no timeout")
else:
    time.sleep(1.5)
print("contract ok", rank, flush=True)
os._exit(0)
"""


def test_transport_contract(tmp_path):
    """Both transports move buffers of every size both ways between two processes; a missing
    peer surfaces as PeerError within the timeout."""
    script = tmp_path / "contract.py"
    script.write_text(_CONTRACT)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    store = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), store], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=90)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "timeout ok" in outs[0]


def test_a_node_of_two_ranks_reports_each_memory_and_peer_save_once(tmp_path, shm_dir):
    """Issue 27, Deliver 2: n1 and n2 with 2 ranks each, memory every 5 steps, one replica on the
    other node. Each node's lowest rank writes one memory ``checkpoint.saved`` for its 2 ranks
    (``ranks``, ``rank_bytes``) and one peer event for the 2 replicas the node received
    (``of_ranks``: the other node's ranks), no rank writes its own, and the node's
    ``memory_bytes`` is what its shared memory holds for the job."""
    from hyperpod_lab.node.health import measured_shm_bytes

    job_id = "tiered-per-node"
    job_dir, _, procs = _start_agents(tmp_path, job_id, shm_dir, ["--steps", "20", "--memory-every", "5",
                                                                 "--every", "100", "--sleep", "0.05"], nproc=2)
    try:
        for p in procs:
            assert p.wait(timeout=240) == 0, _logs(tmp_path)
    finally:
        stop_launchers(procs, job_dir, "tiered_train.py")
    ev = read_events(job_dir)
    on = {json.load(open(f))["rank"]: json.load(open(f))["node"] for f in glob.glob(os.path.join(job_dir, "ranks", "*.json"))}
    local = {n: sorted(r for r, m in on.items() if m == n) for n in ("n1", "n2")}
    assert [len(v) for v in local.values()] == [2, 2], on
    mem, peer = kinds(ev, "checkpoint.saved", tier="memory"), kinds(ev, "checkpoint.saved", tier="peer")
    for tier, got in (("memory", mem), ("peer", peer)):
        per = {}
        for e in got:
            assert "rank" not in e["data"] and e["writer"] == f"rank-{local[e['data']['node']][0]}", e
            per.setdefault((e["data"]["node"], e["data"]["step"]), []).append(e["data"])
        assert sorted(per) == [(n, s) for n in ("n1", "n2") for s in (4, 9, 14, 19)], (tier, sorted(per))
        for (node, _), ds in per.items():
            (d,) = ds  # one event a node and step
            other = local["n2" if node == "n1" else "n1"]
            assert d["ranks" if tier == "memory" else "of_ranks"] == (local[node] if tier == "memory" else other), d
            assert len(d["rank_bytes"]) == 2 and d["bytes"] == sum(d["rank_bytes"]) > 0 and "missing_ranks" not in d, d
            # keep_last slots of its 2 ranks and of the 2 replicas it holds
            assert d["memory_bytes"] >= 2 * d["bytes"] if tier == "peer" else d["memory_bytes"] >= d["bytes"], d
    assert measured_shm_bytes(job_dir)[0] == max(e["data"]["memory_bytes"] for e in mem)
