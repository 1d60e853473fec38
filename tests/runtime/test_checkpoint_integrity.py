"""Integrity of the persistent checkpoint tier, with real processes (two workers, gloo on CPU).

Two launches (``python -m hyperpod_lab.node.launch --standalone --nproc-per-node 2``), shared
through module fixtures:

* ``killed_write``: trains 20 steps with a checkpoint every 4; right after the save of step 11
  started (its shard file appeared), rank 1 SIGKILLs itself while the asynchronous write is in
  flight. The agent restarts both workers; they must skip the uncommitted step 11 (a
  ``checkpoint.corrupt`` naming its missing marker), resume from step 7 with exactly the state
  saved there, and finish.
* ``corrupted_resume``: a copy of those checkpoints where step 19 has one flipped byte in a shard,
  step 15 lost its commit marker and step 11 has a truncated shard is resumed; all three must be
  skipped with a ``checkpoint.corrupt`` naming the offending file, step 7 loaded, and training
  must end bit-exact with the uninterrupted result.

And a checkpoint we wrote is loaded by plain ``torch.distributed.checkpoint.load`` in a fresh
process that never imports hyperpod_lab.

This file is also the training script of these tests and of ``tests/runtime/test_s3_tier.py`` (run as
``python tests/runtime/test_checkpoint_integrity.py --steps ...``; see :func:`train_main`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.abspath(__file__)
HIDDEN = 64


# ---- the training script ----------------------------------------------------------------------
def train_main(argv: list[str] | None = None) -> None:
    """A deterministic DDP training run with a per-rank "blob" that makes every rank write a
    large shard. Batches depend only on (step, rank); the blob of rank r holds
    ``step + 1 + 1000 * r`` everywhere after ``step``, so a partially loaded blob shows.

    Test hooks: ``--kill-during-write STEP`` (rank ``--kill-rank``, first incarnation only:
    SIGKILL itself once its shard file of that step's asynchronous save appeared);
    ``--hold STEP:PATH`` (repeatable; first incarnation: wait before STEP until PATH exists);
    ``--dump`` (torch.save model/blob facts at every save, after restore and at the end).
    """
    sys.path.insert(0, os.path.join(ROOT, "tests", "scripts"))
    from toy_training import arg_parser, mlp, model_state, regression_step, setup

    p = arg_parser(steps=20, every=4, sleep=0.0)
    p.add_argument("--blob-mb", type=float, default=1.0)
    p.add_argument("--kill-during-write", type=int, default=None)
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--hold", action="append", default=[])
    p.add_argument("--dump", action="store_true")
    p.add_argument("--s3-uri", default=None)
    p.add_argument("--s3-every", type=int, default=None)
    p.add_argument("--s3-keep", type=int, default=2)
    p.add_argument("--s3-attempts", type=int, default=2)
    p.add_argument("--s3-backoff", type=float, default=0.1)
    p.add_argument("--s3-requeue", type=float, default=1.0)
    a = p.parse_args(argv)

    import torch

    import hyperpod_lab.runtime as hp
    from hyperpod_lab.runtime.checkpoint.s3 import S3Tier

    with hp.init() as ctx:
        n = max(1, int(a.blob_mb * (1 << 20)) // 4)
        model, opt, local, state = setup(ctx, lambda: mlp(HIDDEN), blob=torch.zeros(n))
        s3 = None
        if a.s3_uri:
            s3 = S3Tier(ctx, a.s3_uri, every_steps=a.s3_every or a.every, keep_last=a.s3_keep,
                        max_attempts=a.s3_attempts, backoff_s=a.s3_backoff, requeue_after_s=a.s3_requeue,
                        multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
        ckpt = hp.Checkpointer(ctx, every_steps=a.every, keep_last=a.keep, s3=s3)
        start = ckpt.restore(state)
        dumps = os.path.join(ctx.job_dir, "dumps")
        first = not ctx.is_restart
        holds = {int(h.split(":", 1)[0]): h.split(":", 1)[1] for h in a.hold}

        def dump(name: str) -> None:
            if a.dump:
                os.makedirs(dumps, exist_ok=True)
                blob = local["blob"]
                torch.save({"model": model_state(model), "optim": opt.state_dict(), "rank": ctx.rank,
                            "blob_min": float(blob.min()), "blob_max": float(blob.max()),
                            "samples_seen": int(local["samples_seen"])},
                           os.path.join(dumps, f"{name}-rank-{ctx.rank}.pt"))

        dump(f"restored-{ctx.restart_count}")
        print(f"rank {ctx.rank}/{ctx.world_size} restart_count={ctx.restart_count} start={start}", flush=True)
        for step in range(start, a.steps):
            if first and step in holds:
                while not os.path.exists(holds[step]):
                    time.sleep(0.05)
            loss = regression_step(ctx, step, model, opt, local)
            local["blob"].fill_(float(step + 1 + 1000 * ctx.rank))
            saved = ckpt.maybe_save(step, state)
            if saved and first and a.kill_during_write == step and ctx.rank == a.kill_rank:
                step_dir = os.path.join(ckpt.root, f"step-{step:08d}")
                deadline = time.monotonic() + 1.0
                while time.monotonic() < deadline:  # our shard is being written: die now
                    if os.path.isdir(step_dir) and any(f.startswith(f"__{ctx.rank}_") for f in os.listdir(step_dir)):
                        break
                    time.sleep(0.0005)
                print(f"rank {ctx.rank}: SIGKILL during the write of step {step}, files now: "
                      f"{sorted(os.listdir(step_dir)) if os.path.isdir(step_dir) else None}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if saved:
                dump(f"step-{step}")
            ctx.step(step, loss.item())
            if a.sleep:
                time.sleep(a.sleep)
        dump("final")


if __name__ == "__main__":
    train_main()
    sys.exit(0)


# ---- the tests ----------------------------------------------------------------------------------
import pytest  # noqa: E402
from agents import assert_same, complete_steps, job_with_checkpoints_of, kinds, load_dump, read_events, stop_launchers, tail_logs  # noqa: E402

STEPS, EVERY, KEEP, BLOB_MB = 20, 4, 5, 24.0


def launch_env(job_dir: str, job_id: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({"HYPERPOD_LAB_JOB_DIR": job_dir, "HYPERPOD_LAB_JOB_ID": job_id,
                "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.5", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "OMP_NUM_THREADS": "1", **extra})
    env.pop("SLURMD_NODENAME", None)
    return env


def launch(job_dir: str, log: str, args: list[str], env: dict[str, str], restarts: int = 1) -> subprocess.Popen:
    """Start one standalone agent with two workers running this file as the training script."""
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nproc-per-node", "2",
             "--max-restarts", str(restarts), "--monitor-interval", "0.1",
             "--log-dir", os.path.join(job_dir, "logs"), "--tee", "3", SCRIPT, *args],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def assert_restored_exactly(job_dir: str, restored_name: str, saved_dir: str, step: int) -> None:
    """The state a worker holds right after restore equals what was saved at ``step``; the
    per-rank blob is whole (not a mix of two saves)."""
    for rank in (0, 1):
        saved = load_dump(saved_dir, f"step-{step}-rank-{rank}.pt")
        got = load_dump(job_dir, f"{restored_name}-rank-{rank}.pt")
        assert_same(saved["model"], got["model"], "model")
        assert_same(saved["optim"], got["optim"], "optim")
        expect = float(step + 1 + 1000 * rank)
        assert got["blob_min"] == got["blob_max"] == expect
        assert got["samples_seen"] == saved["samples_seen"] == 32 * (step + 1)


# ---- fixtures -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def killed_write(tmp_path_factory):
    base = tmp_path_factory.mktemp("killed-write")
    job_dir = str(base / "job")
    log = str(base / "agent.log")
    proc = launch(job_dir, log, ["--steps", str(STEPS), "--every", str(EVERY), "--keep", str(KEEP),
                                 "--blob-mb", str(BLOB_MB), "--kill-during-write", "11", "--kill-rank", "1", "--dump"],
                  launch_env(job_dir, "killed-write"))
    try:
        rc = proc.wait(timeout=120)
    except BaseException:
        stop_launchers([proc], job_dir, SCRIPT)
        raise
    return {"job_dir": job_dir, "rc": rc, "logs": [log], "events": read_events(job_dir)}


@pytest.fixture(scope="module")
def corrupted_resume(killed_write, tmp_path_factory):
    base = tmp_path_factory.mktemp("corrupted")
    job_dir, ck = job_with_checkpoints_of(killed_write["job_dir"], base)
    assert complete_steps(job_dir) == [3, 7, 11, 15, 19]
    flipped = os.path.join(ck, "step-00000019", "__0_0.distcp")
    with open(flipped, "r+b") as f:  # one flipped byte in the middle of the tensor data
        f.seek(os.path.getsize(flipped) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    os.remove(os.path.join(ck, "step-00000015", "COMMITTED"))
    truncated = os.path.join(ck, "step-00000011", "__1_0.distcp")
    with open(truncated, "r+b") as f:
        f.truncate(os.path.getsize(truncated) // 2)
    log = str(base / "agent.log")
    proc = launch(job_dir, log, ["--steps", str(STEPS), "--every", str(EVERY), "--keep", str(KEEP),
                                 "--blob-mb", str(BLOB_MB), "--dump"],
                  launch_env(job_dir, "corrupted-resume"), restarts=0)
    try:
        rc = proc.wait(timeout=90)
    except BaseException:
        stop_launchers([proc], job_dir, SCRIPT)
        raise
    return {"job_dir": job_dir, "rc": rc, "logs": [log], "events": read_events(job_dir),
            "flipped": flipped, "truncated": truncated}


# ---- tests ------------------------------------------------------------------------------------
def test_kill_during_write_resumes_from_newest_complete(killed_write):
    ev, job_dir = killed_write["events"], killed_write["job_dir"]
    assert killed_write["rc"] == 0, tail_logs(killed_write["logs"])
    fault = kinds(ev, "fault.detected")
    assert fault and fault[0]["data"]["rank"] == 1 and fault[0]["data"]["signal"] == "SIGKILL"
    # the write of step 11 was in flight: it never committed, restore skipped it, loaded step 7
    corrupt = kinds(ev, "checkpoint.corrupt")
    assert [(e["data"]["tier"], e["data"]["step"]) for e in corrupt] == [("persistent", 11)], corrupt
    assert corrupt[0]["data"]["path"] == os.path.join(job_dir, "checkpoints", "step-00000011", "COMMITTED")
    assert "commit marker" in corrupt[0]["data"]["reason"]
    restored = kinds(ev, "checkpoint.restored")
    assert [(e["data"]["tier"], e["data"]["step"]) for e in restored] == [("persistent", 7)]
    assert restored[0]["data"]["bytes"] > 2 * BLOB_MB * 1e6 and restored[0]["data"]["seconds"] > 0
    assert fault[0]["time"] < corrupt[0]["time"] < restored[0]["time"]
    assert_restored_exactly(job_dir, "restored-1", job_dir, 7)
    assert kinds(ev, "finished")[0]["data"]["steps"] == STEPS
    saved = kinds(ev, "checkpoint.saved", tier="persistent")
    assert [e["data"]["step"] for e in saved] == [3, 7, 11, 15, 19]
    for e in saved:
        d = e["data"]
        assert 0 <= d["blocked_s"] <= d["total_s"] and d["bytes"] > 2 * BLOB_MB * 1e6
    assert complete_steps(job_dir) == [3, 7, 11, 15, 19]


def test_commit_marker_lists_every_file_with_crc32(killed_write):
    from hyperpod_lab.runtime.checkpoint.format import file_checksum

    step_dir = os.path.join(killed_write["job_dir"], "checkpoints", "step-00000019")
    with open(os.path.join(step_dir, "COMMITTED")) as f:
        marker = json.load(f)
    names = sorted(n for n in os.listdir(step_dir) if n != "COMMITTED")
    assert sorted(marker["files"]) == names == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert marker["checksum"] == "crc32" and marker["step"] == 19 and marker["world_size"] == 2
    for rel, meta in marker["files"].items():
        assert (meta["bytes"], meta["checksum"]) == file_checksum(os.path.join(step_dir, rel))
        assert meta["checksum"].startswith("crc32:")
    assert marker["bytes"] == sum(m["bytes"] for m in marker["files"].values())
    saved19 = kinds(killed_write["events"], "checkpoint.saved", tier="persistent", step=19)[0]
    assert saved19["data"]["bytes"] == marker["bytes"]


def test_plain_dcp_load_reads_our_checkpoint(killed_write):
    """A fresh process with torch only (no hyperpod_lab) loads step 19 with dcp.load."""
    job_dir = killed_write["job_dir"]
    path = os.path.join(job_dir, "checkpoints", "step-00000019")
    out = os.path.join(job_dir, "plain-load.pt")
    code = f"""
import sys, torch
import torch.distributed.checkpoint as dcp
m = torch.nn.Sequential(torch.nn.Linear(8, {HIDDEN}), torch.nn.Tanh(), torch.nn.Linear({HIDDEN}, 1))
sd = {{"model": {{k: torch.zeros_like(v) for k, v in m.state_dict().items()}},
      "rank1": {{"blob": torch.zeros({int(BLOB_MB * (1 << 20)) // 4}),
                "samples_seen": torch.zeros((), dtype=torch.int64)}}}}
dcp.load(sd, checkpoint_id={path!r})
assert not [n for n in sys.modules if n.startswith("hyperpod_lab")]
torch.save(sd, {out!r})
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    import torch

    loaded = torch.load(out)
    final = load_dump(job_dir, "final-rank-0.pt")
    assert_same(final["model"], loaded["model"], "model")
    assert torch.all(loaded["rank1"]["blob"] == 1000.0 + STEPS) and int(loaded["rank1"]["samples_seen"]) == 32 * STEPS


def test_corrupt_shard_missing_marker_truncated_file_fall_back(corrupted_resume, killed_write):
    ev, job_dir = corrupted_resume["events"], corrupted_resume["job_dir"]
    assert corrupted_resume["rc"] == 0, tail_logs(corrupted_resume["logs"])
    corrupt = [e["data"] for e in kinds(ev, "checkpoint.corrupt")]
    ck = os.path.join(job_dir, "checkpoints")
    assert [(c["tier"], c["step"], c["path"]) for c in corrupt] == [
        ("persistent", 19, corrupted_resume["flipped"]),
        ("persistent", 15, os.path.join(ck, "step-00000015", "COMMITTED")),
        ("persistent", 11, corrupted_resume["truncated"]),
    ]
    assert "checksum mismatch" in corrupt[0]["reason"]
    assert "commit marker" in corrupt[1]["reason"]
    assert "truncated" in corrupt[2]["reason"]
    restored = kinds(ev, "checkpoint.restored")
    assert [(e["data"]["tier"], e["data"]["step"]) for e in restored] == [("persistent", 7)]
    assert_restored_exactly(job_dir, "restored-0", killed_write["job_dir"], 7)
    # the committed-but-corrupt ones are set aside, the uncommitted one removed; saves redone
    names = sorted(os.listdir(ck))
    assert [n for n in names if n.startswith("corrupt-")][0].startswith("corrupt-step-00000011-")
    assert [n for n in names if n.startswith("corrupt-")][1].startswith("corrupt-step-00000019-")
    assert complete_steps(job_dir) == [3, 7, 11, 15, 19]
    # training resumed from step 7 ends exactly where the uninterrupted run ended
    for rank in (0, 1):
        a = load_dump(killed_write["job_dir"], f"final-rank-{rank}.pt")
        b = load_dump(job_dir, f"final-rank-{rank}.pt")
        assert_same(a["model"], b["model"], "model")
        assert_same(a["optim"], b["optim"], "optim")
        assert b["blob_min"] == b["blob_max"] == float(STEPS + 1000 * rank)
