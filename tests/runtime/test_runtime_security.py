"""Issue 13, findings 1 and 2: nothing others could write is unpickled, private directories,
authenticated checkpoints, and torchft's listeners bound to one interface.

The training side runs in real processes (this file is also the training script: ``python
test_runtime_security.py memory|persist ...``, one rank, ``hp.init()`` outside torchrun); the
memory tier lives in a shared-memory root of the test's own (``$HYPERPOD_LAB_SHM_DIR``). Every
forged file is a pickle whose loading would create a marker file: the tests assert that the file
never appears, i.e. no code ran. Tests run as root, so "another user" is uid 65534 (chown).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the helpers
from agents import kinds, read_events

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.abspath(__file__)
BUCKET = "ckpt"


# ---- the training script ------------------------------------------------------------------------
def _state():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return {"model": model, "optim": opt, "extra": {"pos": 0, "blob": torch.zeros(16)}}


def _set_step(state, step: int) -> None:
    """The state after ``step``: every value a function of the step (restores compare bits)."""
    import torch

    with torch.no_grad():
        for i, p in enumerate(state["model"].parameters()):
            p.fill_(step + 0.25 * i)
    state["extra"]["pos"] = step
    state["extra"]["blob"].fill_(step * 3.0)


def _values(state) -> dict:
    return {"params": [p.detach().flatten().tolist() for p in state["model"].parameters()],
            "pos": state["extra"]["pos"], "blob": state["extra"]["blob"].tolist()}


def train_main(argv: list[str] | None = None) -> None:
    import hyperpod_lab.runtime as hp
    from hyperpod_lab.runtime.checkpoint.persistent import Checkpointer
    from hyperpod_lab.runtime.checkpoint.tiered import TieredCheckpointer
    from hyperpod_lab.spec import CheckpointPolicy

    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["memory", "persist"])
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--restore", action="store_true")
    ap.add_argument("--s3-uri")
    ap.add_argument("--endpoint")
    a = ap.parse_args(argv)
    with hp.init() as ctx:
        state = _state()
        if a.mode == "memory":
            ckpt = TieredCheckpointer(ctx, state, CheckpointPolicy(every_steps=1000, keep_last=2,
                                                                    memory_every_steps=1), replicas=0)
        else:
            s3 = None
            if a.s3_uri:
                from hyperpod_lab.runtime.checkpoint.s3 import S3Tier

                s3 = S3Tier(ctx, a.s3_uri, every_steps=2, keep_last=3, endpoint_url=a.endpoint)
            ckpt = Checkpointer(ctx, every_steps=2, keep_last=3, async_save=False, s3=s3)
        if a.restore:
            start = ckpt.restore(state) if a.mode == "persist" else ckpt.restore()
            with open(os.path.join(ctx.job_dir, "result.json"), "w") as f:
                json.dump({"start": start, "values": _values(state)}, f)
        for step in range(a.steps):
            _set_step(state, step)
            if a.mode == "memory":
                ckpt.maybe_save(step)
            else:
                ckpt.maybe_save(step, state)
                if ckpt.s3 is not None:
                    ckpt.s3.wait(timeout_s=60)  # every S3 step uploaded, none superseded
        ckpt.wait()
        if a.mode == "memory":
            ckpt.close(keep=True)  # the snapshots stay in shared memory for the next process


# ---- helpers ------------------------------------------------------------------------------------
class _Evil:
    """Pickles to "run ``touch <path>``": the proof that something was unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _evil(path: str) -> bytes:
    return pickle.dumps(_Evil(path), protocol=2)


def _env(job_dir: str, job_id: str, shm: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k in [k for k in env if k.startswith(("HYPERPOD_LAB_", "TORCHELASTIC_")) or k in (
            "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURMD_NODENAME")]:
        env.pop(k)
    env.update({"HYPERPOD_LAB_JOB_DIR": job_dir, "HYPERPOD_LAB_JOB_ID": job_id, "HYPERPOD_LAB_SHM_DIR": shm,
                "OMP_NUM_THREADS": "1", **extra})
    return env


def _run(env: dict[str, str], *args: str, expect_rc: int | None = 0) -> subprocess.CompletedProcess:
    """Run this file as the training script; check its exit status unless ``expect_rc`` is None."""
    p = subprocess.run([sys.executable, SCRIPT, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=180)
    assert expect_rc is None or p.returncode == expect_rc, f"rc {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return p


def _result(job_dir: str) -> dict:
    with open(os.path.join(job_dir, "result.json")) as f:
        return json.load(f)


def _expected(step: int) -> dict:
    st = _state()
    _set_step(st, step)
    return _values(st)


# ---- finding 1: the memory tier -----------------------------------------------------------------
def test_planted_memory_slot_runs_no_code_and_restore_falls_back(tmp_path):
    import xxhash

    from hyperpod_lab.runtime.state import FORMAT, load_meta

    shm, job_dir, job = str(tmp_path / "shm"), str(tmp_path / "job"), "planted"
    env = _env(job_dir, job, shm)
    _run(env, "memory", "--steps", "4")  # memory snapshots of steps 2 and 3 (keep_last=2)
    node = os.listdir(os.path.join(shm, job))[0]
    ring = os.path.join(shm, job, node, "rank-0")
    marker = tmp_path / "PWNED"

    def plant(index: int, step: int, fmt: int, hmac_hex: str | None) -> None:
        """What another user could write: a slot of a newer step whose layout is a pickle, its
        data and meta checksums valid (they are no secret); only the HMAC cannot be made."""
        meta = _evil(str(marker))
        with open(os.path.join(ring, f"slot-{index}.bin"), "rb") as f:
            data = f.read()
        rec = {"format": fmt, "step": step, "world_size": 1, "rank": 0, "nbytes": len(data),
               "data_checksum": xxhash.xxh3_64_intdigest(data) & ((1 << 63) - 1),
               "meta_checksum": xxhash.xxh3_64_intdigest(meta) & ((1 << 63) - 1),
               "meta_sha256": __import__("hashlib").sha256(meta).hexdigest(), "job_id": job, "time": time.time()}
        if hmac_hex is not None:
            rec["hmac"] = hmac_hex
        with open(os.path.join(ring, f"slot-{index}.meta"), "wb") as f:
            f.write(meta)
        with open(os.path.join(ring, f"slot-{index}.json"), "w") as f:
            json.dump(rec, f)

    records = {}
    for i in (0, 1):
        with open(os.path.join(ring, f"slot-{i}.json")) as f:
            records[i] = json.load(f)
    newest = max(records, key=lambda i: records[i]["step"])
    assert records[newest]["step"] == 3
    plant(newest, 99, FORMAT, "00" * 32)       # the current format, forged HMAC, over step 3's slot
    # the format before the fix (pickled layout, no HMAC) is ignored, never misread
    os.makedirs(os.path.join(shm, job, node, "replica-of-rank-0"), mode=0o700)
    ring_old = ring
    ring = os.path.join(shm, job, node, "replica-of-rank-0")
    shutil.copy(os.path.join(ring_old, f"slot-{newest}.bin"), os.path.join(ring, "slot-0.bin"))
    plant(0, 98, 2, None)
    ring = ring_old

    p = _run(env, "memory", "--restore", expect_rc=None)
    assert not marker.exists(), "a planted slot's pickle was loaded: code ran"
    assert p.returncode == 0, p.stderr[-6000:]
    # the layout decoder itself never unpickles
    with pytest.raises(ValueError):
        load_meta(_evil(str(marker)))
    assert not marker.exists()
    got = _result(job_dir)
    assert got["start"] == 3  # step 2's snapshot, the older one: the forged step 99 was never used
    assert got["values"] == _expected(2)
    restored = kinds(read_events(job_dir), "checkpoint.restored")
    assert [(e["data"]["tier"], e["data"]["step"]) for e in restored] == [("memory", 2)]


# ---- finding 1: private directories -------------------------------------------------------------
def _chown_other(path) -> None:
    os.chown(path, 65534, 65534)


@pytest.mark.parametrize("case", ["other-owner", "mode-0777", "symlink"])
def test_shm_root_not_private_is_refused(tmp_path, case):
    from hyperpod_lab.private_dir import PrivateDirError

    # in the real /dev/shm, as another user would pre-create it
    root = f"/dev/shm/hp-sectest-{os.getpid()}-{case}"
    mine = str(tmp_path / "mine")
    try:
        if case == "symlink":
            os.mkdir(mine, 0o700)
            os.symlink(mine, root)
        else:
            os.mkdir(root, 0o700)
            if case == "other-owner":
                _chown_other(root)
            else:
                os.chmod(root, 0o777)
        shm, job_dir = root, str(tmp_path / "job")
        with pytest.raises(PrivateDirError) as e:
            _tier_under(root)
        assert root in str(e.value) and "HYPERPOD_LAB_SHM_DIR" in str(e.value)
        assert not os.path.exists(os.path.join(mine, "job"))  # nothing created through the link
        # the same through a real job process: it fails naming the path
        p = _run(_env(job_dir, "refused", shm), "memory", "--steps", "1", expect_rc=1)
        assert "PrivateDirError" in p.stderr and root in p.stderr
    finally:
        if os.path.islink(root):
            os.remove(root)
        else:
            shutil.rmtree(root, ignore_errors=True)


def _tier_under(root: str):
    from hyperpod_lab.runtime.checkpoint.memory import MemoryTier

    old = os.environ.get("HYPERPOD_LAB_SHM_DIR")
    os.environ["HYPERPOD_LAB_SHM_DIR"] = root
    try:
        return MemoryTier(os.path.join(root, "job", "node", "rank-0"), keep_last=1)
    finally:
        if old is None:
            del os.environ["HYPERPOD_LAB_SHM_DIR"]
        else:
            os.environ["HYPERPOD_LAB_SHM_DIR"] = old


def test_job_dir_under_shm_root_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    from hyperpod_lab.private_dir import PrivateDirError

    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    (root / "job").mkdir(mode=0o700)
    _chown_other(root / "job")  # planted inside a (once) shared root
    monkeypatch.setenv("HYPERPOD_LAB_SHM_DIR", str(root))
    with pytest.raises(PrivateDirError) as e:
        _tier_under(str(root))
    assert str(root / "job") in str(e.value) and "uid 65534" in str(e.value)
    # a fresh root is made 0700 and used
    fresh = tmp_path / "fresh"
    tier = _tier_under(str(fresh))
    assert oct(os.stat(fresh).st_mode & 0o777) == "0o700"
    assert all(oct(os.stat(fresh / p).st_mode & 0o777) == "0o700" for p in ("job", "job/node", "job/node/rank-0"))
    tier.close(remove=True)


@pytest.mark.parametrize("case", ["other-owner", "mode-0777", "symlink"])
def test_default_job_dir_not_private_is_refused(tmp_path, monkeypatch, case):
    import tempfile

    from hyperpod_lab.private_dir import PrivateDirError
    from hyperpod_lab.runtime.context import _default_job_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("HYPERPOD_LAB_JOB_DIR", raising=False)
    top = tmp_path / "hyperpod-lab"
    if case == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        os.symlink(tmp_path / "elsewhere", top)
    else:
        top.mkdir(mode=0o700)
        _chown_other(top) if case == "other-owner" else os.chmod(top, 0o777)
    with pytest.raises(PrivateDirError) as e:
        _default_job_dir("job-1", in_torchrun=True)
    assert str(top) in str(e.value) and "HYPERPOD_LAB_JOB_DIR" in str(e.value)
    assert not (tmp_path / "elsewhere" / "job-1").exists()


def test_default_job_dir_is_private(tmp_path, monkeypatch):
    import tempfile

    from hyperpod_lab.runtime.context import _default_job_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("HYPERPOD_LAB_JOB_DIR", raising=False)
    for torchrun in (True, False):
        d = _default_job_dir("job-2", in_torchrun=torchrun)
        assert os.stat(d).st_mode & 0o777 == 0o700 and os.stat(d).st_uid == os.geteuid()


def test_checkpoint_key_file_is_checked(tmp_path):
    from hyperpod_lab.runtime.checkpoint.auth import KeyFileError, create_key, read_key

    path = str(tmp_path / "checkpoint.key")
    assert create_key(path) is True and create_key(path) is False
    assert len(read_key(path)) == 32 and os.stat(path).st_mode & 0o777 == 0o600
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match="0644"):
        read_key(path)
    os.chmod(path, 0o600)
    _chown_other(path)
    with pytest.raises(KeyFileError, match="uid 65534"):
        read_key(path)
    os.remove(path)
    with open(path, "wb") as f:
        f.write(b"short")
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError, match="5 bytes"):
        read_key(path)
    os.remove(path)
    os.symlink(str(tmp_path / "elsewhere"), path)
    assert create_key(path) is False and not (tmp_path / "elsewhere").exists()  # never written through
    with pytest.raises(KeyFileError):
        read_key(path)


# ---- finding 2: the persistent tier -------------------------------------------------------------
def _corrupts(job_dir: str, tier: str) -> list[dict]:
    return [e["data"] for e in kinds(read_events(job_dir), "checkpoint.corrupt", tier=tier)]


def test_forged_persistent_checkpoint_is_skipped_and_older_step_restored(tmp_path):
    job_dir, shm = str(tmp_path / "job"), str(tmp_path / "shm")
    env = _env(job_dir, "persist", shm)
    _run(env, "persist", "--steps", "6")  # committed steps 1, 3, 5
    ck = os.path.join(job_dir, "checkpoints")
    marker = tmp_path / "PWNED"
    evil = _evil(str(marker))
    # step 5: .metadata replaced by a pickle that would run code when DCP loads it, and the
    # marker's entry for it rewritten to match (size, CRC-32, SHA-256: no secret needed)
    import hashlib
    import zlib

    with open(os.path.join(ck, "step-00000005", ".metadata"), "wb") as f:
        f.write(evil)
    with open(os.path.join(ck, "step-00000005", "COMMITTED")) as f:
        m5 = json.load(f)
    m5["files"][".metadata"].update(bytes=len(evil), checksum=f"crc32:{zlib.crc32(evil):08x}",
                                    sha256=hashlib.sha256(evil).hexdigest())
    with open(os.path.join(ck, "step-00000005", "COMMITTED"), "w") as f:
        json.dump(m5, f)
    # step 3: a shard replaced (DCP unpickles its byte items with weights_only=False)
    shard = next(n for n in os.listdir(os.path.join(ck, "step-00000003")) if n.endswith(".distcp"))
    with open(os.path.join(ck, "step-00000003", shard), "r+b") as f:
        size = len(f.read())
        f.seek(0)
        f.write((evil * (size // len(evil) + 1))[:size])  # same size: only the hashes can tell
    p = _run(env, "persist", "--restore", expect_rc=None)
    assert not marker.exists(), "a forged checkpoint file was unpickled: code ran"
    assert p.returncode == 0, p.stderr[-6000:]
    got = _result(job_dir)
    assert got["start"] == 2 and got["values"] == _expected(1)  # step 1, bit-equal
    bad = _corrupts(job_dir, "persistent")
    assert [(d["step"], os.path.basename(d["path"])) for d in bad] == [(5, "COMMITTED"), (3, shard)], bad
    assert "HMAC does not match" in bad[0]["reason"]
    assert all("authentication failed" in d["reason"] for d in bad), bad


def test_checkpoint_of_another_key_or_unsigned_is_refused(tmp_path):
    src, shm = str(tmp_path / "src"), str(tmp_path / "shm")
    _run(_env(src, "src", shm), "persist", "--steps", "4")  # committed steps 1, 3
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    shutil.copytree(os.path.join(src, "checkpoints"), os.path.join(job_dir, "checkpoints"))
    # step 3 re-marked without the HMAC (as an older hyperpod-lab, or a forger, writes it)
    path = os.path.join(job_dir, "checkpoints", "step-00000003", "COMMITTED")
    with open(path) as f:
        m = json.load(f)
    del m["hmac"]
    with open(path, "w") as f:
        json.dump(m, f)
    _run(_env(job_dir, "other", shm), "persist", "--restore")  # a new job: a new key
    assert _result(job_dir)["start"] == 0
    bad = _corrupts(job_dir, "persistent")
    assert [d["step"] for d in bad] == [3, 1]
    assert "not signed" in bad[0]["reason"] and "another job's key" in bad[1]["reason"]
    assert all("authentication failed" in d["reason"] and d["path"].endswith("COMMITTED") for d in bad)
    # with the key the checkpoints were signed with, step 1 restores
    shutil.rmtree(job_dir)
    os.makedirs(job_dir)
    shutil.copytree(os.path.join(src, "checkpoints"), os.path.join(job_dir, "checkpoints"))
    shutil.copy2(os.path.join(src, "checkpoint.key"), os.path.join(job_dir, "checkpoint.key"))
    _run(_env(job_dir, "same-key", shm), "persist", "--restore")
    assert _result(job_dir)["start"] == 4 and _result(job_dir)["values"] == _expected(3)


# ---- finding 2: the S3 tier ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    from moto_server import serving_bucket

    with serving_bucket(tmp_path_factory.mktemp("moto"), BUCKET) as srv:
        yield srv


def test_forged_s3_checkpoint_is_skipped_and_older_step_restored(tmp_path, moto):
    from moto_server import CREDENTIALS

    job_dir, shm = str(tmp_path / "job"), str(tmp_path / "shm")
    uri = f"s3://{BUCKET}/sec"
    env = _env(job_dir, "s3sec", shm, **CREDENTIALS)
    for k in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        env.pop(k, None)
    _run(env, "persist", "--steps", "6", "--s3-uri", uri, "--endpoint", moto.url)  # S3 steps 1, 3, 5
    client = moto.client()
    prefix = "sec/s3sec/"
    marker = tmp_path / "PWNED"
    evil = _evil(str(marker))
    # step 5: .metadata replaced in S3; step 3: its marker replaced by an unsigned one listing
    # a forged .metadata with matching size/CRC-32/SHA-256 (all computable without the key)
    client.put_object(Bucket=BUCKET, Key=prefix + "step-00000005/.metadata", Body=evil)
    m3 = json.loads(client.get_object(Bucket=BUCKET, Key=prefix + "step-00000003/COMMITTED")["Body"].read())
    import hashlib
    import zlib

    m3["files"][".metadata"] = {"bytes": len(evil), "checksum": f"crc32:{zlib.crc32(evil):08x}",
                                "sha256": hashlib.sha256(evil).hexdigest()}
    m3["hmac"] = "ab" * 32
    client.put_object(Bucket=BUCKET, Key=prefix + "step-00000003/.metadata", Body=evil)
    client.put_object(Bucket=BUCKET, Key=prefix + "step-00000003/COMMITTED", Body=json.dumps(m3).encode())
    shutil.rmtree(os.path.join(job_dir, "checkpoints"))  # shared storage lost: S3 is the last link
    p = _run(env, "persist", "--restore", "--s3-uri", uri, "--endpoint", moto.url, expect_rc=None)
    assert not marker.exists(), "a forged S3 object was unpickled: code ran"
    assert p.returncode == 0, p.stderr[-6000:]
    got = _result(job_dir)
    assert got["start"] == 2 and got["values"] == _expected(1)
    bad = _corrupts(job_dir, "s3")
    assert [(d["step"], d["path"].rsplit("/", 1)[1]) for d in bad] == [(5, ".metadata"), (3, "COMMITTED")], bad
    assert all("authentication failed" in d["reason"] for d in bad), bad
    restored = kinds(read_events(job_dir), "checkpoint.restored")
    assert [(e["data"]["tier"], e["data"]["step"]) for e in restored] == [("s3", 1)]


# ---- finding 2: torchft's listeners -------------------------------------------------------------
def _refused_from(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_lighthouse_and_heal_transport_listen_on_the_given_interface_only(tmp_path):
    from datetime import timedelta

    import psutil

    from hyperpod_lab.node import lighthouse
    from hyperpod_lab.runtime.checkpointless.ft import bound_http_transport, heal_host

    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    proc = lighthouse.start(job_dir, 1, host="127.0.0.1")
    try:
        with open(os.path.join(job_dir, "lighthouse.json")) as f:
            port = int(json.load(f)["address"].rsplit(":", 1)[1])
        listening = [c.laddr for c in psutil.Process(proc.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(la.ip == "127.0.0.1" for la in listening), listening
        assert _refused_from("127.0.0.2", port)  # another local address: nothing listens there
    finally:
        proc.kill()
        proc.wait()
    assert heal_host("http://127.0.0.1:1234") == "127.0.0.1"
    t = bound_http_transport("127.0.0.1", timedelta(seconds=5))
    try:
        port = t._server.socket.getsockname()[1]
        assert t._server.socket.getsockname()[0] == "127.0.0.1"
        assert t.address() == f"http://127.0.0.1:{port}/checkpoint/"
        mine = [c.laddr for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN]
        assert not [la for la in mine if la.ip in ("0.0.0.0", "::")], mine  # the unbound server is gone
        assert _refused_from("127.0.0.2", port)
    finally:
        t.shutdown(wait=False)


if __name__ == "__main__":
    train_main()
