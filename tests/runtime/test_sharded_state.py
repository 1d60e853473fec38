"""Sharded (DTensor / FSDP2 / HSDP) state in the memory and peer tiers, with real gloo processes.

* ``fsdp``: 2 processes, FSDP2 ``fully_shard`` over a 1-D CPU mesh (uneven shards: one rank's
  shard of a 3-row weight has 2 rows, the other's 1; a 1-row weight leaves one rank an empty
  shard), AdamW. A memory snapshot after 3 steps, restored into the live model after 2 more
  steps and into a freshly built model and optimizer (no optimizer state yet), is bit-equal to
  the local shards saved, and the next step gives bit-equal parameters to the step taken from the
  saved state the first time. An overlap-mode snapshot (local shards copied in the background,
  the optimizer step waiting for them) reads back bit-equal to the state at its step. A snapshot whose mesh or placements differ from the live state's is
  refused with a message naming the tensor and both placements (:func:`compatible` and
  :func:`apply` agree), as are plain-vs-sharded mixes; ShardedTensor is refused by name.
* ``hsdp``: 4 processes, HSDP over a (replicate=2, shard=2) mesh, nodes n0 = ranks 0, 1 and
  n1 = ranks 2, 3. The peer tier's partner of each rank (:func:`partner_map`) is rank + 2: the
  rank holding the same shard in the other replica group (its local shards are bit-equal to the
  sender's). Replication over gloo, then the loss of node n1 (its ranks rebuild their model
  from scratch): each of its ranks receives its own snapshot back from its partner on n0 and
  restores bit-equal shards, with no storage involved.
* a restart-mode job: ``tests/runtime/fsdp_job.py`` (FSDP2, 2 processes, one launch agent,
  ``TieredCheckpointer`` with memory snapshots every 5 steps and no persistent checkpoint) whose
  rank 1 SIGKILLs itself before step 12: the agent restarts both processes, both restore step 9
  from tier "memory" with shards bit-equal to those saved, and the loss curve and the final
  shards equal those of a run without the fault, bit for bit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch
from agents import assert_same, kinds, read_events, stop_launchers
from ports import free_port

from hyperpod_lab.runtime.state import FORMAT, capture, load_meta

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_WORKER = r'''
import json, os, sys, torch, torch.distributed as dist
from datetime import timedelta
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from hyperpod_lab.runtime.checkpoint.memory import MemoryTier
from hyperpod_lab.runtime.checkpoint.peer import GlooTransport, Outgoing, exchange_snapshots, partner_map, sources_of
from hyperpod_lab.runtime.checkpoint.slots import SlotRing
from hyperpod_lab.runtime.state import apply, capture, compatible, load_meta, unflatten

mode, rank, world, store, out_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                        timeout=timedelta(seconds=60))
KEY = b"k" * 32
res = {"rank": rank}


def build(mesh, dims=None):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    for layer in (m[0], m[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, torch.optim.AdamW(m.parameters(), lr=0.05)


def step(m, opt, s):
    g = torch.Generator().manual_seed(100 * s + rank)
    x = torch.randn(16, 8, generator=g)
    loss = torch.nn.functional.mse_loss(m(x), x.sum(1, keepdim=True).sin())
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def locals_of(m, opt):
    """Every local shard of the model and the optimizer state (clones), by name."""
    out = {f"model/{k}": v.to_local().clone() for k, v in m.state_dict().items()}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            out[f"optim/{i}/{k}"] = (v.to_local() if isinstance(v, DTensor) else v).clone()
    return out


def same(a, b, what):
    assert a.keys() == b.keys(), (what, sorted(a), sorted(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), (what, k)


def placements(m, opt):
    return {k: (tuple(v.placements), tuple(v.device_mesh.mesh.flatten().tolist())) for k, v in m.state_dict().items()}


if mode == "fsdp":
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    m, opt = build(mesh)
    for s in range(3):
        step(m, opt, s)
    extra = {"seen": torch.tensor(48 * rank)}
    state = {"model": m, "optim": opt, "extra": extra}
    tier = MemoryTier(os.path.join(out_dir, f"rank-{rank}"), keep_last=2, rank=rank, world_size=world, key=KEY)
    snap = tier.snapshot(2, state)
    tier.wait()
    saved, saved_places = locals_of(m, opt), placements(m, opt)
    res["shard_rows"] = {k: list(v.shape) for k, v in saved.items() if k.startswith("model/")}
    meta = load_meta(snap.meta)
    res["n_dtensors"] = len(meta["dtensors"])
    res["mesh"] = meta["meshes"]
    # overlap mode: the local shards are copied in the background; the optimizer step waits for it
    over = MemoryTier(os.path.join(out_dir, f"overlap-{rank}"), keep_last=1, rank=rank, world_size=world, key=KEY)
    over.snapshot(2, state, overlap=True)
    res["deferrable"] = sum(capture(state).deferrable)
    hook = opt.register_step_pre_hook(lambda *_a: over.wait_copy())
    step(m, opt, 3)
    after3 = locals_of(m, opt)
    hook.remove()
    over.wait()
    _s, tree = over.read(2)
    got = {f"model/{k}": v.local for k, v in tree["model"].items()}
    got.update({f"optim/{i}/{k}": (v.local if hasattr(v, "spec") else v) for i, st in tree["optim"]["state"].items()
                for k, v in st.items()})
    same(got, saved, "the overlapped snapshot")
    over.close(remove=True)
    step(m, opt, 4)
    extra["seen"] += 1
    # 1) restore into the live (changed) state
    assert tier.restore(state) == 2
    same(locals_of(m, opt), saved, "restored into the live state")
    assert placements(m, opt) == saved_places
    assert int(extra["seen"]) == 48 * rank
    assert all(isinstance(v, DTensor) for v in m.state_dict().values())
    step(m, opt, 3)
    same(locals_of(m, opt), after3, "the step after the restore")
    # 2) restore into a fresh model and optimizer: no optimizer state yet (restart-mode restore)
    m2, opt2 = build(mesh)
    state2 = {"model": m2, "optim": opt2, "extra": {"seen": torch.tensor(-1)}}
    assert compatible(load_meta(snap.meta), state2) is None
    assert tier.restore(state2, step=2) == 2
    same(locals_of(m2, opt2), saved, "restored into a fresh model")
    step(m2, opt2, 3)
    same(locals_of(m2, opt2), after3, "the fresh model's step after the restore")
    # 3) mismatches: another mesh shape (HSDP 1 x world), and a plain (unsharded) model
    mesh2 = init_device_mesh("cpu", (1, world), mesh_dim_names=("replicate", "shard"))
    m3, opt3 = build(mesh2)
    state3 = {"model": m3, "optim": opt3, "extra": {"seen": torch.tensor(0)}}
    reason = compatible(load_meta(snap.meta), state3)
    try:
        tier.restore(state3)
    except ValueError as e:
        res["apply_error"] = str(e)
    else:
        raise AssertionError("a restore into another mesh did not fail")
    res["mesh_reason"] = reason
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    res["plain_reason"] = compatible(load_meta(snap.meta), {"model": plain, "optim": torch.optim.AdamW(
        plain.parameters()), "extra": {"seen": torch.tensor(0)}})
    plain_meta = load_meta(capture({"model": plain}).meta)
    res["reverse_reason"] = compatible(plain_meta, {"model": m})
    # 4) ShardedTensor (FSDP1's sharded state dicts) is refused by name
    from torch.distributed._shard.sharded_tensor import empty as st_empty
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    st = st_empty(ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)]), 4, 2)
    try:
        capture({"x": {"w": st}})
    except TypeError as e:
        res["sharded_tensor_error"] = str(e)
    tier.close(remove=True)

elif mode == "hsdp":
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    nodes = ["n0"] * (world // 2) + ["n1"] * (world // 2)
    partners = partner_map(nodes, 1)
    res["partners"] = partners[rank]
    m, opt = build(mesh)
    for s in range(3):
        step(m, opt, s)
    state = {"model": m, "optim": opt}
    tier = MemoryTier(os.path.join(out_dir, nodes[rank], f"rank-{rank}"), keep_last=2, rank=rank,
                      world_size=world, key=KEY, job_id="hsdp")
    snap = tier.snapshot(2, state)
    tier.wait()
    saved = locals_of(m, opt)
    res["coord"] = mesh.get_coordinate()
    # the partner holds the same shard: its local shards equal ours bit for bit
    flat = torch.cat([v.flatten().double() for v in saved.values()])
    got = [None] * world
    dist.all_gather_object(got, flat)  # shards of uneven size
    res["partner_same_shard"] = all(torch.equal(got[p], flat) for p in partners[rank])
    res["equal_to"] = [torch.equal(got[r], flat) for r in range(world)]
    # replication to the partner (every rank sends one and receives one, as the tiered checkpointer does)
    ctl = GlooTransport(None)
    rings = {s_: SlotRing(os.path.join(out_dir, nodes[rank], f"replica-of-rank-{s_}"), 2, key=KEY)
             for s_ in sources_of(partners, rank)}
    out = Outgoing(snap.slot.data(snap.nbytes), snap.meta, snap.record)
    got_r = exchange_snapshots(ctl, ctl, [(p, out) for p in partners[rank]], list(rings.items()),
                               timeout=timedelta(seconds=60), job_id="hsdp", expect_step=2)
    res["received_from"] = [r.src for r in got_r]
    # node n1 is lost: its ranks start over (fresh model, no optimizer state, no shared memory)
    lost = nodes[rank] == "n1"
    if lost:
        tier.close(remove=True)
        m, opt = build(mesh)
        state = {"model": m, "optim": opt}
    dist.barrier()
    # the holders on n0 send the replicas back; n1's ranks receive them into a new own ring
    sends = []
    if not lost:
        for s_, ring in rings.items():
            slot, rec, meta = ring.complete()[0]
            sends.append((s_, Outgoing(slot.data(rec["nbytes"]), meta, rec)))
    recvs = []
    own = None
    if lost:
        own = SlotRing(os.path.join(out_dir, nodes[rank], f"rank-{rank}"), 2, key=KEY)
        recvs = [(partners[rank][0], own)]
    back = exchange_snapshots(ctl, ctl, sends, recvs, timeout=timedelta(seconds=60), job_id="hsdp",
                              expect_step=2, state_ranks={p: rank for p in partners[rank]}, replica=False)
    if lost:
        rcv = back[0]
        assert compatible(load_meta(rcv.meta), state) is None
        apply(state, unflatten(load_meta(rcv.meta), rcv.slot.data(rcv.record["nbytes"])))
        same(locals_of(m, opt), saved, "healed from the partner's replica")
        res["healed_from"] = rcv.src
    # after the heal the replicas agree again: one more step keeps every pair bit-equal
    step(m, opt, 3)
    flat = torch.cat([v.flatten().double() for v in locals_of(m, opt).values()])
    got = [None] * world
    dist.all_gather_object(got, flat)  # shards of uneven size
    res["partner_same_after_step"] = all(torch.equal(got[p], flat) for p in partners[rank])
    if own is not None:
        own.remove()
    for ring in rings.values():
        ring.remove()
    if not lost:
        tier.close(remove=True)

with open(os.path.join(out_dir, f"result-{rank}.json"), "w") as f:
    json.dump(res, f)
print(json.dumps(res)[:3000], flush=True)
dist.barrier()
dist.destroy_process_group()
'''


def _run(tmp_path, mode: str, world: int) -> list[dict]:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    store = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, str(script), mode, str(r), str(world), store, str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * world, "\n".join(o[-4000:] for o in outs)
    return [json.loads((out / f"result-{r}.json").read_text()) for r in range(world)]


def test_fsdp2_round_trip_is_bit_equal_and_mismatches_are_named(tmp_path):
    res = _run(tmp_path, "fsdp", 2)
    # 4 parameters + 8 AdamW moments are DTensors (the 4 "step" counters are plain tensors)
    assert [r["n_dtensors"] for r in res] == [12, 12]
    # overlap mode defers every parameter shard and the optimizer state (16 tensors); rank 1's two
    # empty shards (of the 1-row weight and 1-element bias) have nothing to copy and are not deferred
    assert [r["deferrable"] for r in res] == [16, 14]
    assert res[0]["mesh"] == [{"shape": [2], "dims": ["shard"], "ranks": [0, 1], "device": "cpu"}]
    # uneven shards, including an empty one, went through
    assert res[0]["shard_rows"]["model/0.weight"] == [2, 8] and res[1]["shard_rows"]["model/0.weight"] == [1, 8]
    assert res[0]["shard_rows"]["model/2.weight"] == [1, 3] and res[1]["shard_rows"]["model/2.weight"] == [0, 3]
    for r in res:
        for text in (r["mesh_reason"], r["apply_error"]):
            assert "sharding does not match" in text and "model/0.weight" in text, text
            assert "mesh of shape (2,) ('shard',)" in text and "mesh of shape (1, 2) ('replicate', 'shard')" in text
            assert "persistent tier" in text
        assert "model/0.weight" in r["plain_reason"] and "plain (unsharded) tensor there" in r["plain_reason"]
        assert "the snapshot holds a plain (unsharded) tensor, the live state a DTensor [Shard(0)]" in r["reverse_reason"]
        assert "ShardedTensor" in r["sharded_tensor_error"] and "FSDP2" in r["sharded_tensor_error"]


def test_hsdp_peer_partner_holds_the_same_shard_and_heals_a_lost_node(tmp_path):
    res = _run(tmp_path, "hsdp", 4)
    assert [r["partners"] for r in res] == [[2], [3], [0], [1]]  # rank + procs_per_node, mod world
    assert [r["coord"] for r in res] == [[0, 0], [0, 1], [1, 0], [1, 1]]  # (replica group, shard)
    for r in res:
        assert r["partner_same_shard"], r
        # the other rank of the same node holds another shard (a test that could not tell them apart
        # would pass for any partner)
        neighbour = r["rank"] ^ 1
        assert not r["equal_to"][neighbour], r
        assert r["partner_same_after_step"], r
    assert [r["received_from"] for r in res] == [[2], [3], [0], [1]]
    assert [r.get("healed_from") for r in res] == [None, None, 0, 1]


def test_old_format_layouts_are_never_read():
    """The layout format was bumped for the DTensor entries: a layout of format 3 (or anything
    but :data:`FORMAT`) is refused, so an old slot is never reinterpreted."""
    assert FORMAT == 4
    meta = json.loads(capture({"x": {"w": torch.ones(2)}}).meta)
    assert load_meta(json.dumps(meta).encode())["dtensors"] == {}
    for fmt in (3, 5):
        with pytest.raises(ValueError, match="format mismatch"):
            load_meta(json.dumps(dict(meta, format=fmt)).encode())
    # malformed DTensor entries are refused, not trusted
    for bad in ({"dtensors": [[0, {"m": 0, "p": [["s", 0]], "g": [2], "st": [1]}]], "meshes": []},
                {"dtensors": [[5, {"m": 0, "p": [["s", 0]], "g": [2], "st": [1]}]],
                 "meshes": [{"shape": [1], "dims": None, "ranks": [0], "device": "cpu"}]},
                {"dtensors": [[0, {"m": 0, "p": [["x", 0]], "g": [2], "st": [1]}]],
                 "meshes": [{"shape": [1], "dims": None, "ranks": [0], "device": "cpu"}]},
                {"dtensors": [], "meshes": [{"shape": [2], "dims": None, "ranks": [0], "device": "cpu"}]}):
        with pytest.raises(ValueError, match="malformed"):
            load_meta(json.dumps(dict(meta, **bad)).encode())


# ---- a restart-mode FSDP2 job restores from the memory tier after a kill --------------------------
JOB = os.path.join(ROOT, "tests", "runtime", "fsdp_job.py")
KILL_STEP = 12  # after the memory snapshots of steps 4 and 9; the restart resumes at step 10


def _launch(base, job_id: str, shm: str, **extra: str) -> tuple[str, int]:
    """One launch agent (a node) running ``fsdp_job.py`` on 2 processes, up to 2 restarts;
    returns ``(job_dir, exit status)``."""
    job_dir = str(base / "job")
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k in ("FSDP_KILL_RANK", "FSDP_KILL_AT_STEP"):
        env.pop(k, None)
    env.update({"HYPERPOD_LAB_JOB_DIR": job_dir, "HYPERPOD_LAB_JOB_ID": job_id, "HYPERPOD_LAB_SHM_DIR": shm,
                "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.5", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "OMP_NUM_THREADS": "1", "SLURMD_NODENAME": "n1", "PYTHONFAULTHANDLER": "1", **extra})
    port = free_port()
    with open(base / "agent.log", "a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hyperpod_lab.node.launch", "--nnodes", "1", "--nproc-per-node", "2",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job_id,
             "--max-restarts", "2", "--monitor-interval", "0.1", "--log-dir", os.path.join(job_dir, "logs"),
             "--tee", "3", JOB, "--steps", "20", "--memory-every", "5"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        rc = proc.wait(timeout=300)
    except BaseException:
        stop_launchers([proc], job_dir, "fsdp_job.py")
        raise
    return job_dir, rc


def _dump(job_dir: str, name: str) -> dict:
    return torch.load(os.path.join(job_dir, "fsdp", name), weights_only=False)


def _losses(job_dir: str, rank: int) -> list[tuple[int, int, float]]:
    with open(os.path.join(job_dir, "fsdp", f"loss-rank-{rank}.jsonl")) as f:
        return [(d["inc"], d["step"], float.fromhex(d["loss"])) for d in map(json.loads, f)]


def _agent_log(base) -> str:
    text = (base / "agent.log").read_text(errors="replace")[-3000:]
    for dirpath, _dirs, files in os.walk(base / "job" / "logs"):
        for name in files:
            with open(os.path.join(dirpath, name), errors="replace") as f:
                text += f"\n===== {name}\n" + f.read()[-2000:]
    return text


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    shm = tempfile.mkdtemp(prefix="hyperpod-lab-test-shm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        runs = {}
        for name, extra in (("clean", {}), ("fault", {"FSDP_KILL_RANK": "1", "FSDP_KILL_AT_STEP": str(KILL_STEP)})):
            base = tmp_path_factory.mktemp(name)
            job_dir, rc = _launch(base, f"fsdp-{name}", shm, **extra)
            assert rc == 0, _agent_log(base)
            runs[name] = {"job_dir": job_dir, "events": read_events(job_dir), "base": base,
                          "shm": os.path.join(shm, f"fsdp-{name}")}
        yield runs
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_fsdp2_job_restores_from_memory_after_a_kill(fsdp_runs):
    run = fsdp_runs["fault"]
    ev, job_dir = run["events"], run["job_dir"]
    fault = kinds(ev, "fault.detected")
    assert fault and fault[0]["data"]["signal"] == "SIGKILL", _agent_log(run["base"])
    restored = kinds(ev, "checkpoint.restored")
    assert sorted((e["data"]["rank"], e["data"]["tier"], e["data"]["step"]) for e in restored) == [
        (0, "memory", 9), (1, "memory", 9)]
    assert all(e["data"]["bytes"] > 0 for e in restored)
    assert kinds(ev, "recovery.completed")[0]["data"]["restored_from"] == "memory"
    assert not kinds(ev, "checkpoint.saved", tier="persistent")  # nothing on storage to fall back to
    for rank in (0, 1):
        saved, got = _dump(job_dir, f"inc0-step-9-rank-{rank}.pt"), _dump(job_dir, f"inc1-restored-rank-{rank}.pt")
        assert got["start"] == 10
        assert got["placements"] == saved["placements"] and all(p == ["Shard(dim=0)"] for p in got["placements"].values())
        assert_same(saved["model"], got["model"], "model")
        assert_same(saved["optim"], got["optim"], "optim")
    # uneven shards: 15 rows over 2 ranks is 8 + 7; the last weight's single row leaves rank 1 nothing
    shapes = [{k: tuple(v.shape) for k, v in _dump(job_dir, f"inc1-restored-rank-{r}.pt")["model"].items()}
              for r in (0, 1)]
    assert shapes[0]["0.weight"] == (8, 8) and shapes[1]["0.weight"] == (7, 8)
    assert shapes[0]["4.weight"] == (1, 7) and shapes[1]["4.weight"] == (0, 7)
    # a normal end released the shared memory
    assert not os.path.exists(run["shm"]) or not any(files for _d, _s, files in os.walk(run["shm"]))


def test_fsdp2_job_loss_curve_equals_a_no_fault_run(fsdp_runs):
    clean, fault = fsdp_runs["clean"], fsdp_runs["fault"]
    assert not kinds(clean["events"], "checkpoint.restored") and not kinds(clean["events"], "fault.detected")
    for rank in (0, 1):
        want = _losses(clean["job_dir"], rank)
        assert [(i, s) for i, s, _l in want] == [(0, s) for s in range(20)]
        got = _losses(fault["job_dir"], rank)
        first = [(s, loss) for i, s, loss in got if i == 0]
        second = [(s, loss) for i, s, loss in got if i == 1]
        # rank 1 died before step 12, rank 0 may have been stopped before finishing it
        assert [s for s, _l in first][:KILL_STEP] == list(range(KILL_STEP)) and len(first) <= KILL_STEP + 1
        assert [s for s, _l in second] == list(range(10, 20))
        curve = dict(first)
        curve.update(second)  # the resumed run's losses replace the lost steps' (10, 11, ...)
        assert [curve[s] for s in range(20)] == [loss for _i, _s, loss in want], rank  # bit for bit
        a, b = _dump(clean["job_dir"], f"final-rank-{rank}.pt"), _dump(fault["job_dir"], f"final-rank-{rank}.pt")
        assert_same(a["model"], b["model"], "final model")
        assert_same(a["optim"], b["optim"], "final optim")
