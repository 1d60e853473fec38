"""One persistent checkpoint per job in checkpointless mode (issue 25, item 1), with real processes.

Real torchft Lighthouse and Managers, one launch agent per replica group on this host (the
harness of ``test_checkpointless.py``), gloo, a real S3 HTTP endpoint (moto on loopback). The
job is ``tests/scripts/persistent_job.py``, whose state after a step is the same bits whatever
the number of replica groups (exact gradient sums), so a 2-group job's checkpoint files can be
compared byte for byte with a 1-group job's.

* ``test_two_groups_write_the_files_of_one_group_once_rotating_the_writer``: every step
  directory of the 2-group job holds the same files (names, count, bytes) as the 1-group job's,
  at ``<job_dir>/checkpoints/step-*`` (no per-group copies); the writer alternates between the
  groups; S3 holds one copy per step, uploaded by the step's writer; plain
  ``torch.distributed.checkpoint.load`` reads the last step into a fresh model, equal to the
  trained one.
* ``test_every_group_falls_back_to_the_one_job_copy``: both groups and their memory tier lost:
  each restarted group restores the job's one copy (``recovery.fallback`` tier ``persistent``,
  or a heal from the group that did), the newest complete step; with ``legacy`` that step sits
  in an earlier version's ``replica-group-1/`` directory and the job's own root holds a newer
  torn one (a writer killed mid-save): the restore still takes the newest complete step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
from agents import kinds
from test_checkpointless import ROOT
from test_checkpointless import Job as _FtJob

SCRIPT = os.path.join(ROOT, "tests", "scripts", "persistent_job.py")
STEPS, EVERY = 12, 2


class Job(_FtJob):
    """The checkpointless harness running ``persistent_job.py``."""

    def start_group(self, group: int) -> None:
        log = open(os.path.join(self.job_dir, f"agent-{group}.log"), "ab")
        self.agents[group] = subprocess.Popen(
            [sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nnodes=1",
             "--nproc-per-node=1", "--max-restarts=3", "--monitor-interval=0.1", SCRIPT, *self.args],
            env=self.env(group), stdout=log, stderr=subprocess.STDOUT)


def _run(tmp_path, groups: int, args: list[str]) -> Job:
    return Job(tmp_path, groups, args).completed()


def _group_of(event: dict) -> int:
    """The replica group of an event's writer (one rank per group: ``rank-<G>``)."""
    writer = event["writer"]
    assert writer.startswith("rank-"), writer
    return int(writer[len("rank-"):])


def _step_dirs(job_dir: str) -> dict[str, str]:
    root = os.path.join(job_dir, "checkpoints")
    return {n: os.path.join(root, n) for n in sorted(os.listdir(root)) if n.startswith("step-")}


def _files(step_dir: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(step_dir)):
        with open(os.path.join(step_dir, name), "rb") as f:
            out[name] = f.read()
    return out


def _metadata(step_dir: str):
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(step_dir).read_metadata()


def _assert_same_checkpoint(two: str, one: str) -> None:
    """The step directory ``two`` (2-group job) holds the files of ``one`` (1-group job)."""
    import json

    a, b = _files(two), _files(one)
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    data = [n for n in a if n.endswith(".distcp")]
    assert data, f"no DCP data file in {two}: {sorted(a)}"
    for name in data:  # the tensors and the pickled non-tensor items, byte for byte
        assert a[name] == b[name], f"{name} differs between the 2-group and the 1-group job"
    # .metadata: DCP pickles the checkpoint's own path and a random save id (storage_meta) into
    # it; everything else in it (what is stored where: keys, shapes, dtypes, file, offset and
    # length of every item) must be equal
    ma, mb = _metadata(two), _metadata(one)
    assert ma.state_dict_metadata == mb.state_dict_metadata
    assert ma.storage_data == mb.storage_data
    assert ma.planner_data == mb.planner_data
    assert ma.storage_meta.checkpoint_id != mb.storage_meta.checkpoint_id  # what differs: the paths
    # the commit marker: the same file table (the .metadata entry aside), step and world size
    ja, jb = json.loads(a["COMMITTED"]), json.loads(b["COMMITTED"])
    assert (ja["step"], ja["world_size"]) == (jb["step"], jb["world_size"])
    fa = {k: v for k, v in ja["files"].items() if k != ".metadata"}
    assert fa == {k: v for k, v in jb["files"].items() if k != ".metadata"} and fa
    assert sorted(ja["files"]) == sorted(n for n in a if n != "COMMITTED")


def test_two_groups_write_the_files_of_one_group_once_rotating_the_writer(tmp_path, monkeypatch):
    from moto_server import CREDENTIALS, MotoServer

    srv = MotoServer(str(tmp_path / "moto.log")).start()
    try:
        srv.create_bucket("ckpt")
        for k, v in {**CREDENTIALS, "HYPERPOD_LAB_S3_ENDPOINT_URL": srv.url}.items():
            monkeypatch.setenv(k, v)
        args = ["--steps", str(STEPS), "--every", str(EVERY)]
        two = _run(tmp_path / "two", 2, args + ["--s3-uri", "s3://ckpt/runs"])
        one = _run(tmp_path / "one", 1, args)
        keys = [o["Key"] for o in srv.client().list_objects_v2(Bucket="ckpt", Prefix="runs/").get("Contents", [])]
    finally:
        srv.kill()

    saves = list(range(EVERY - 1, STEPS, EVERY))  # 0-based steps with a persistent save
    names = [f"step-{s:08d}" for s in saves]
    dirs2, dirs1 = _step_dirs(two.job_dir), _step_dirs(one.job_dir)
    assert sorted(dirs2) == sorted(dirs1) == names, (sorted(dirs2), sorted(dirs1))
    assert sorted(os.listdir(os.path.join(two.job_dir, "checkpoints"))) == names  # no per-group copies
    for name in names:
        _assert_same_checkpoint(dirs2[name], dirs1[name])

    ev = two.events()
    # the writer rotates: sorted(members)[save_index % 2], members {0, 1} throughout
    saved = sorted((e["data"]["step"], _group_of(e)) for e in kinds(ev, "checkpoint.saved", tier="persistent"))
    assert saved == [(s, i % 2) for i, s in enumerate(saves)], saved
    assert {e["data"]["replicas"] for e in kinds(ev, "step")} == {2}  # both groups in every step
    # S3: one copy of each step, under the job's prefix, uploaded once, by the step's writer
    uploads = sorted((e["data"]["step"], _group_of(e)) for e in kinds(ev, "checkpoint.saved", tier="s3"))
    assert uploads == saved, uploads
    base = f"runs/{two.job_id}/"
    assert keys and all(k.startswith(base) for k in keys), keys
    for name in names:
        got = sorted(k[len(base) + len(name) + 1:] for k in keys if k.startswith(base + name + "/"))
        assert got == sorted(os.listdir(dirs2[name])), (name, got)
    assert len(keys) == sum(len(os.listdir(d)) for d in dirs2.values())

    # plain DCP reads the last step into a fresh model: the trained parameters
    import torch.distributed.checkpoint as dcp

    fresh = torch.nn.Linear(8, 4)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    sd = {"model": fresh.state_dict()}
    dcp.load(sd, checkpoint_id=dirs2[names[-1]])
    fresh.load_state_dict(sd["model"])
    final = two.final(0)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, final[k]), k
    assert torch.equal(final["weight"], two.final(1)["weight"]) and torch.equal(final["weight"], one.final(0)["weight"])


@pytest.mark.parametrize("legacy", [False, True], ids=["job-copy", "legacy-layout"])
def test_every_group_falls_back_to_the_one_job_copy(tmp_path, legacy):
    steps, every = 40, 4
    job = Job(tmp_path, 2, ["--steps", str(steps), "--every", str(every), "--keep", "3", "--step-sleep", "0.2"])
    root = os.path.join(job.job_dir, "checkpoints")
    try:
        deadline = time.monotonic() + 180
        while len(kinds(job.events(), "checkpoint.saved", tier="persistent")) < 2:  # both groups wrote one
            assert time.monotonic() < deadline, job.logs()
            assert all(a.poll() is None for a in job.agents.values()), job.logs()
            time.sleep(0.1)
        lost = job.lose_every_node()  # and their memory tier
        complete = sorted(int(n[5:]) for n, p in _step_dirs(job.job_dir).items()
                          if os.path.exists(os.path.join(p, "COMMITTED")))
        newest = complete[-1]
        if legacy:  # an earlier version's per-group layout holds the newest step; a newer one is torn
            os.makedirs(os.path.join(root, "replica-group-1"))
            os.rename(os.path.join(root, f"step-{newest:08d}"), os.path.join(root, "replica-group-1", f"step-{newest:08d}"))
            torn = os.path.join(root, f"step-{newest + every:08d}")
            shutil.rmtree(torn, ignore_errors=True)
            shutil.copytree(os.path.join(root, f"step-{complete[-2]:08d}"), torn)
            os.remove(os.path.join(torn, "COMMITTED"))
        t_lost = job.start_groups(lost)
        ev = job.finish()
    finally:
        job.stop()

    fb = [e for e in kinds(ev, "recovery.fallback") if e["time"] >= t_lost]
    assert fb and all(e["data"]["tier"] == "persistent" and e["data"]["step"] == newest + 1 for e in fb), (fb, newest)
    restored = [e for e in kinds(ev, "checkpoint.restored") if e["time"] >= t_lost]
    assert {e["data"]["tier"] for e in restored} <= {"persistent", "replica"}, restored
    want = os.path.join(root, "replica-group-1" if legacy else "", f"step-{newest:08d}")
    assert all(os.path.normpath(e["data"]["path"]) == os.path.normpath(want)
               for e in restored if e["data"]["tier"] == "persistent"), (restored, want)
    healed = {e["data"]["replica_group"] for e in restored if e["data"]["tier"] == "replica"}
    assert {e["data"]["replica_group"] for e in fb} | healed == {0, 1}, (fb, healed)
    assert kinds(ev, "finished")[-1]["data"]["steps"] == steps
    assert set(range(steps)) <= {e["data"]["step"] for e in kinds(ev, "step")}
    assert torch.equal(job.final(0)["weight"], job.final(1)["weight"])


# ---- retention of the shared root and prefix (in process, real files, real S3 HTTP endpoint) --------
def _ctx(job_dir: str, job_id: str):
    """A one-rank JobContext without a process group (retention needs none)."""
    from hyperpod_lab.runtime.context import JobContext

    return JobContext(rank=0, world_size=1, local_rank=0, local_world_size=1, group_rank=0, nodes=1, node="test",
                      job_id=job_id, job_dir=job_dir, spec=None, restart_count=0, is_restart=False,
                      owns_default_group=False, cpu_group=None, step_interval_s=1.0)


def _dirs(root: str, complete: list[int], incomplete: list[int]) -> None:
    for s in complete + incomplete:
        d = os.path.join(root, f"step-{s:08d}")
        os.makedirs(d)
        with open(os.path.join(d, "__0_0.distcp"), "wb") as f:
            f.write(b"x")
        if s in complete:
            open(os.path.join(d, "COMMITTED"), "w").close()


@pytest.mark.parametrize("shared", [False, True])
def test_shared_root_retention_spares_the_save_another_group_may_still_write(tmp_path, shared):
    """Saves every 2 steps: step 5 is incomplete while step 7 is committed. In one group's root
    that is a dead save (deleted); in a shared root step 5's writer (another group) may still be
    writing it, so it stays; the incomplete step 1 (older than the previous interval) goes."""
    from hyperpod_lab.runtime.checkpoint.persistent import Checkpointer

    ctx = _ctx(str(tmp_path / "job"), "retain")
    ckpt = Checkpointer(ctx, every_steps=2, keep_last=2, root=str(tmp_path / "root"), shared=shared)
    _dirs(ckpt.root, complete=[3, 7], incomplete=[1, 5])
    ckpt._retain()
    left = sorted(os.listdir(ckpt.root))
    assert left == (["step-00000003", "step-00000005", "step-00000007"] if shared
                    else ["step-00000003", "step-00000007"]), left


@pytest.mark.parametrize("shared", [False, True])
def test_shared_s3_retention_spares_uploads_inside_the_kept_window(tmp_path, monkeypatch, shared):
    """S3 holds complete steps 3 and 7 (keep_last 2) and partial uploads of steps 1 and 5. One
    uploader: 5 is a dead upload (deleted). Shared prefix: step 5 may be another group's upload
    still running, so only the partial step below the oldest kept one (1) goes."""
    from moto_server import CREDENTIALS, MotoServer

    from hyperpod_lab.runtime.checkpoint.s3 import S3Tier

    srv = MotoServer(str(tmp_path / "moto.log")).start()
    try:
        srv.create_bucket("ckpt")
        client = srv.client()
        for s in (1, 3, 5, 7):
            client.put_object(Bucket="ckpt", Key=f"runs/retain/step-{s:08d}/__0_0.distcp", Body=b"x")
            if s in (3, 7):
                client.put_object(Bucket="ckpt", Key=f"runs/retain/step-{s:08d}/COMMITTED", Body=b"{}")
        for k, v in CREDENTIALS.items():
            monkeypatch.setenv(k, v)
        tier = S3Tier(_ctx(str(tmp_path / "job"), "retain"), "s3://ckpt/runs", 2, keep_last=2,
                      endpoint_url=srv.url, shared=shared)
        tier._retain()
        steps = sorted({k.split("/")[2] for k in (o["Key"] for o in client.list_objects_v2(
            Bucket="ckpt", Prefix="runs/").get("Contents", []))})
    finally:
        srv.kill()
    assert steps == (["step-00000003", "step-00000005", "step-00000007"] if shared
                     else ["step-00000003", "step-00000007"]), steps
