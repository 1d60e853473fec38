"""The S3 checkpoint tier against a real moto S3 server on loopback (``tests/moto_server.py``),
with real training processes (two workers, gloo on CPU; the training script is
``tests/runtime/test_checkpoint_integrity.py``). No mocks: a missing ``moto_server`` fails the tests with
an install hint.

Launches (module fixtures):

* ``killed_upload``: persistent checkpoints every 5 steps, each uploaded to S3 (``keep_last`` 1).
  A TCP proxy in front of moto holds the upload of step 9's marker, the one request that makes a
  step complete; at that moment every shard of step 9 must already be in S3 (the marker goes
  last). The local checkpoints are then deleted (lost shared storage) and rank 0, the uploader,
  is SIGKILLed. The agent restarts the workers; they must restore S3 step 4, the newest complete
  step (step 9 has every shard but no marker and is never used), train on, upload step 9 whole
  and let retention delete step 4.
* ``endpoint_down`` (one process, a one-rank job): the S3 endpoint is SIGKILLed after the first
  upload; training goes on, each failed attempt of the next upload emits ``checkpoint.failed``,
  and once the endpoint is back on the same port the upload is retried and succeeds.

Fast in-process tests (a ``JobContext`` of one rank, no process group) cover the round trip with
multipart and checksums, a tampered object, retention and bad URIs/credentials/buckets.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from agents import kinds, read_events, stop_launchers, tail_logs
from moto_server import CREDENTIALS, HoldingProxy, MotoServer, serving_bucket, without_aws_credentials
from test_checkpoint_integrity import ROOT, SCRIPT, assert_restored_exactly, launch, launch_env

BUCKET = "ckpt"
URI = f"s3://{BUCKET}/runs"
BLOB_MB = 6.0  # each rank's shard is > 5 MiB: uploaded in parts


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    with serving_bucket(tmp_path_factory.mktemp("moto"), BUCKET) as srv:
        yield srv


@pytest.fixture(autouse=True)
def aws_env(monkeypatch):
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    for k in ("HYPERPOD_LAB_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)


def _ctx(job_dir: str, job_id: str):
    """A one-rank JobContext without a process group (the S3 tier needs none)."""
    from hyperpod_lab.runtime.context import JobContext

    return JobContext(rank=0, world_size=1, local_rank=0, local_world_size=1, group_rank=0, nodes=1, node="test",
                      job_id=job_id, job_dir=job_dir, spec=None, restart_count=0, is_restart=False,
                      owns_default_group=False, cpu_group=None, step_interval_s=1.0)


def _committed_dir(path: str, step: int, files: dict[str, bytes]) -> str:
    """A directory with ``files`` and a commit marker listing them, as the persistent tier writes."""
    from hyperpod_lab.runtime.checkpoint.format import file_checksum

    os.makedirs(path, exist_ok=True)
    table = {}
    for name, data in files.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
        size, checksum = file_checksum(os.path.join(path, name))
        table[name] = {"bytes": size, "checksum": checksum}
    with open(os.path.join(path, "COMMITTED"), "w") as f:
        json.dump({"step": step, "world_size": 1, "bytes": sum(t["bytes"] for t in table.values()),
                   "checksum": "crc32", "files": table}, f)
    return path


def _keys(client, prefix: str) -> list[str]:
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return sorted(out)


def _wait_for(cond, timeout_s: float, what: str, procs=(), log_paths=()):
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        for p in procs:
            assert p.poll() is None, f"the launcher exited early waiting for {what}" + tail_logs(list(log_paths))
        assert time.monotonic() < deadline, f"timed out waiting for {what}" + tail_logs(list(log_paths))
        time.sleep(0.05)


# ---- launches -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def killed_upload(moto, tmp_path_factory):
    base = tmp_path_factory.mktemp("killed-upload")
    job_dir, job_id = str(base / "job"), "killed-upload"
    # hold the marker's upload (the DELETE of a stale marker that starts each upload passes)
    proxy = HoldingProxy(moto.port, hold=f"PUT /{BUCKET}/runs/{job_id}/step-00000009/COMMITTED ".encode())
    log = str(base / "agent.log")
    env = launch_env(job_dir, job_id, HYPERPOD_LAB_S3_ENDPOINT_URL=proxy.url, **CREDENTIALS)
    proc = launch(job_dir, log, ["--steps", "10", "--every", "5", "--keep", "2", "--blob-mb", str(BLOB_MB),
                                 "--s3-uri", URI, "--s3-every", "5", "--s3-keep", "1", "--dump"], env)
    client = moto.client()
    try:
        _wait_for(proxy.held.is_set, 90, "the upload of step 9's marker", [proc], [log])
        # the marker's request is on the wire: what is in S3 now?
        at_hold = _keys(client, f"runs/{job_id}/step-00000009/")
        ck = os.path.join(job_dir, "checkpoints")
        with open(os.path.join(ck, "step-00000009", "COMMITTED")) as f:
            local_marker = json.load(f)
        step4 = str(base / "step4-copy")  # a real committed checkpoint, for the round-trip test
        shutil.copytree(os.path.join(ck, "step-00000004"), step4)
        shutil.rmtree(ck)  # the shared storage lost the local checkpoints
        with open(os.path.join(job_dir, "ranks", "rank-0.json")) as f:
            victim = json.load(f)
        os.kill(victim["pid"], signal.SIGKILL)  # rank 0, the uploader, dies during the upload
        t_kill = time.time()
        proxy.release()
        rc = proc.wait(timeout=90)
    except BaseException:
        stop_launchers([proc], job_dir, SCRIPT)
        raise
    finally:
        proxy.stop()
    return {"job_dir": job_dir, "job_id": job_id, "rc": rc, "logs": [log], "events": read_events(job_dir),
            "at_hold": at_hold, "local_marker": local_marker, "victim": victim, "t_kill": t_kill,
            "after": _keys(client, f"runs/{job_id}/"), "step4": step4}


@pytest.fixture(scope="module")
def endpoint_down(tmp_path_factory):
    base = tmp_path_factory.mktemp("endpoint-down")
    srv = MotoServer(str(base / "moto.log")).start()
    srv.create_bucket(BUCKET)
    job_dir, job_id = str(base / "job"), "endpoint-down"
    go1, go2 = str(base / "go-1"), str(base / "go-2")
    log = str(base / "agent.log")
    env = launch_env(job_dir, job_id, HYPERPOD_LAB_S3_ENDPOINT_URL=srv.url, **CREDENTIALS)
    # one process (plain python: a one-rank job) is enough here and spares the 2 cores
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, SCRIPT, "--steps", "27", "--every", "5", "--keep", "2", "--blob-mb", str(BLOB_MB),
             "--s3-uri", URI, "--s3-every", "10", "--s3-keep", "2", "--s3-attempts", "2", "--s3-backoff", "0.1",
             "--s3-requeue", "0.5", "--sleep", "0.02", "--hold", f"12:{go1}", "--hold", f"25:{go2}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        ev = lambda: read_events(job_dir)  # noqa: E731
        _wait_for(lambda: kinds(ev(), "checkpoint.saved", tier="s3", step=9), 90, "the S3 upload of step 9",
                  [proc], [log])
        t_down = time.time()
        srv.kill()  # training waits before step 12 until now: the upload of step 19 will find no endpoint
        open(go1, "w").close()
        # a whole round of attempts at step 19 failed, and training got to step 24's checkpoint
        _wait_for(lambda: kinds(ev(), "checkpoint.failed", tier="s3", step=19, attempt=2)
                  and kinds(ev(), "checkpoint.saved", tier="persistent", step=24), 60,
                  "a failed round of step 19's upload", [proc], [log])
        t_restart = time.time()
        srv.start()
        srv.create_bucket(BUCKET)  # moto keeps state in memory: the restarted endpoint is empty
        t_up = time.time()
        _wait_for(lambda: kinds(ev(), "checkpoint.saved", tier="s3", step=19), 60,
                  "the retried upload of step 19", [proc], [log])
        open(go2, "w").close()
        rc = proc.wait(timeout=90)
        keys = _keys(srv.client(), f"runs/{job_id}/")
    except BaseException:
        stop_launchers([proc], job_dir, SCRIPT)
        raise
    finally:
        srv.kill()
    return {"job_dir": job_dir, "rc": rc, "logs": [log], "events": read_events(job_dir), "t_down": t_down,
            "t_restart": t_restart, "t_up": t_up, "keys": keys, "job_id": job_id}


# ---- kill -9 during an upload, local checkpoints lost: restore from S3 ------------------------------
def test_kill_rank0_during_s3_upload_restores_newest_complete_s3_step(killed_upload):
    ev, job_dir, job_id = killed_upload["events"], killed_upload["job_dir"], killed_upload["job_id"]
    assert killed_upload["rc"] == 0, tail_logs(killed_upload["logs"])
    fault = kinds(ev, "fault.detected", rank=0)
    assert fault and fault[0]["data"]["signal"] == "SIGKILL"
    assert fault[0]["data"]["pid"] == killed_upload["victim"]["pid"]
    # the marker goes last: when its upload started every file of step 9 was already in S3
    prefix = f"runs/{job_id}/step-00000009/"
    assert killed_upload["at_hold"] == sorted(prefix + rel for rel in killed_upload["local_marker"]["files"])
    # on restart: no local checkpoint; S3 step 9 has every shard but no marker, so it is never
    # used: the newest complete step is S3 step 4
    restored = kinds(ev, "checkpoint.restored")
    assert [(e["data"]["tier"], e["data"]["step"]) for e in restored] == [("s3", 4)]
    d = restored[0]["data"]
    assert restored[0]["time"] > killed_upload["t_kill"]
    assert d["path"] == f"{URI}/{job_id}/step-00000004/" and d["bytes"] > 2 * BLOB_MB * 1e6 and d["seconds"] > 0
    assert d["local_path"] == os.path.join(job_dir, "checkpoints", "step-00000004")
    assert not kinds(ev, "checkpoint.corrupt")
    assert_restored_exactly(job_dir, "restored-1", job_dir, 4)
    assert kinds(ev, "recovery.completed")[0]["data"]["restored_from"] == "s3"
    assert kinds(ev, "finished")[0]["data"]["steps"] == 10
    # both incarnations uploaded; step 9 went up whole the second time
    s3_saved = kinds(ev, "checkpoint.saved", tier="s3")
    assert [e["data"]["step"] for e in s3_saved] == [4, 9]
    for e in s3_saved:
        d = e["data"]
        assert d["path"] == f"{URI}/{job_id}/step-{d['step']:08d}/" and d["bytes"] > 2 * BLOB_MB * 1e6
        assert 0 <= d["blocked_s"] < 0.05 and d["total_s"] > d["blocked_s"]
    # retention (keep_last 1) removed step 4 and kept the newest complete step
    after = killed_upload["after"]
    assert {k[len(f"runs/{job_id}/"):].split("/")[0] for k in after} == {"step-00000009"}
    assert prefix + "COMMITTED" in after


def test_round_trip_multipart_and_checksums(moto, killed_upload, tmp_path):
    from hyperpod_lab.runtime.checkpoint.s3 import S3CheckpointCorrupt, S3Tier

    client = moto.client()
    local = killed_upload["step4"]  # a checkpoint written by two ranks through the persistent tier
    ctx = _ctx(str(tmp_path / "job"), "round-trip")
    up = S3Tier(ctx, URI, every_steps=1, endpoint_url=moto.url, multipart_threshold=5 << 20,
                multipart_chunksize=5 << 20)
    assert up.maybe_upload(4, local) is True
    up.wait(timeout_s=30)
    assert up.complete_steps() == [4]
    prefix = "runs/round-trip/step-00000004/"
    big = 0
    for name in os.listdir(local):  # big shards went up in parts (multipart ETag "<md5>-<parts>")
        head = client.head_object(Bucket=BUCKET, Key=prefix + name)
        assert head["ContentLength"] == os.path.getsize(os.path.join(local, name))
        if head["ContentLength"] > 5 << 20:
            assert head["ETag"].strip('"').endswith("-2"), head["ETag"]
            big += 1
    assert big == 2
    dest = up.download(4, str(tmp_path / "down"))
    assert sorted(os.listdir(dest)) == sorted(os.listdir(local))
    for name in os.listdir(local):
        with open(os.path.join(local, name), "rb") as a, open(os.path.join(dest, name), "rb") as b:
            assert a.read() == b.read(), name
    # a tampered shard: the download names the object and never writes the marker
    key = prefix + "__1_0.distcp"
    body = bytearray(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    with pytest.raises(S3CheckpointCorrupt) as e:
        up.download(4, str(tmp_path / "down-bad"))
    assert e.value.key == f"s3://{BUCKET}/{key}" and "checksum mismatch" in e.value.reason
    assert not os.path.exists(str(tmp_path / "down-bad" / "COMMITTED"))
    # without its marker the step is not complete and cannot be downloaded
    client.delete_object(Bucket=BUCKET, Key=prefix + "COMMITTED")
    assert up.complete_steps() == []
    with pytest.raises(S3CheckpointCorrupt) as e:
        up.download(4, str(tmp_path / "down-nomarker"))
    assert e.value.key == f"s3://{BUCKET}/{prefix}COMMITTED" and "no commit marker" in e.value.reason
    up.close()
    saved = [e for e in read_events(str(tmp_path / "job")) if e["kind"] == "checkpoint.saved"]
    assert [(e["data"]["tier"], e["data"]["step"]) for e in saved] == [("s3", 4)]


# ---- the endpoint goes away and comes back ----------------------------------------------------------
def test_s3_endpoint_down_training_goes_on_and_upload_is_retried(endpoint_down):
    ev = endpoint_down["events"]
    assert endpoint_down["rc"] == 0, tail_logs(endpoint_down["logs"])
    assert kinds(ev, "finished")[0]["data"]["steps"] == 27
    failed = kinds(ev, "checkpoint.failed", tier="s3", step=19)
    assert len(failed) >= 2
    for e in failed:
        d = e["data"]
        assert d["will_retry"] is True and endpoint_down["t_down"] < e["time"] < endpoint_down["t_up"] + 5, d
        if e["time"] < endpoint_down["t_restart"]:
            assert "cannot reach the S3 endpoint" in d["reason"], d
        else:  # a retry between the restart and the test re-creating the bucket
            assert "cannot reach the S3 endpoint" in d["reason"] or "NoSuchBucket" in d["reason"], d
    assert [e["data"]["attempt"] for e in failed][:2] == [1, 2]
    assert failed[0]["data"]["retry_in_s"] == pytest.approx(0.1) and failed[1]["data"]["retry_in_s"] == 0.5
    # training went on while S3 was down: step 24 was checkpointed before S3 came back
    persistent = {e["data"]["step"]: e["time"] for e in kinds(ev, "checkpoint.saved", tier="persistent")}
    assert sorted(persistent) == [4, 9, 14, 19, 24]
    assert failed[0]["time"] < persistent[24] < endpoint_down["t_up"]
    saved = kinds(ev, "checkpoint.saved", tier="s3")
    assert [e["data"]["step"] for e in saved] == [9, 19]
    assert saved[1]["time"] > endpoint_down["t_up"] and saved[1]["data"]["attempts"] > 2
    assert f"runs/{endpoint_down['job_id']}/step-00000019/COMMITTED" in endpoint_down["keys"]


# ---- in-process: retention, bad URI / bucket / credentials ---------------------------------------------
def test_retention_keeps_the_newest_complete_steps(moto, tmp_path):
    from hyperpod_lab.runtime.checkpoint.s3 import S3Tier

    client = moto.client()
    client.put_object(Bucket=BUCKET, Key="runs/retention/step-00000000/__0_0.distcp", Body=b"partial, old")
    client.put_object(Bucket=BUCKET, Key="runs/retention/step-00000050/__0_0.distcp", Body=b"partial, newer")
    tier = S3Tier(_ctx(str(tmp_path / "job"), "retention"), URI, every_steps=2, keep_last=2, endpoint_url=moto.url)
    for step in (1, 3, 5):
        d = _committed_dir(str(tmp_path / f"step-{step}"), step, {".metadata": b"m" * 10, "__0_0.distcp": b"x" * 100})
        assert tier.maybe_upload(step, d)
        tier.wait(timeout_s=30)
    assert tier.complete_steps() == [5, 3]
    steps = {k.split("/")[2] for k in _keys(client, "runs/retention/")}
    assert steps == {"step-00000003", "step-00000005", "step-00000050"}  # the newer partial one stays
    one = S3Tier(_ctx(str(tmp_path / "job"), "retention"), URI, every_steps=2, keep_last=1, endpoint_url=moto.url)
    d = _committed_dir(str(tmp_path / "step-7"), 7, {".metadata": b"m", "__0_0.distcp": b"y" * 10})
    assert one.maybe_upload(7, d) and not one.maybe_upload(8, d)  # off-interval: not queued
    one.wait(timeout_s=30)
    assert one.complete_steps() == [7]
    tier.close()
    one.close()


def test_bad_uri_bucket_and_credentials_are_events_not_crashes(moto, tmp_path, monkeypatch):
    from hyperpod_lab.runtime.checkpoint.s3 import S3Tier, S3TierError

    job_dir = str(tmp_path / "job")
    d = _committed_dir(str(tmp_path / "step-0"), 0, {".metadata": b"m", "__0_0.distcp": b"x"})

    bad = S3Tier(_ctx(job_dir, "bad"), "s3:/not a uri", every_steps=1, endpoint_url=moto.url)
    assert bad.error and bad.maybe_upload(0, d) is False and bad.complete_steps() == []

    nobucket = S3Tier(_ctx(job_dir, "bad"), "s3://no-such-bucket/x", every_steps=1, endpoint_url=moto.url,
                      max_attempts=2, backoff_s=0.05, requeue_after_s=60)
    assert nobucket.maybe_upload(0, d) is True
    nobucket.wait(timeout_s=30)  # returns once a round failed: the upload stays queued for later
    nobucket.close()

    without_aws_credentials(monkeypatch, tmp_path)
    nocreds = S3Tier(_ctx(job_dir, "bad"), URI, every_steps=1, endpoint_url=moto.url, max_attempts=1,
                     requeue_after_s=60)
    assert nocreds.maybe_upload(0, d) is True
    nocreds.wait(timeout_s=30)
    with pytest.raises(S3TierError, match="no usable AWS credentials"):
        nocreds.complete_steps()
    nocreds.close()

    failed = [e["data"] for e in read_events(job_dir) if e["kind"] == "checkpoint.failed"]
    assert failed[0]["step"] is None and failed[0]["will_retry"] is False
    assert "S3 tier disabled" in failed[0]["reason"] and "s3://bucket/prefix" in failed[0]["reason"]
    nb = [f for f in failed if "NoSuchBucket" in f["reason"]]
    assert [(f["attempt"], f["will_retry"]) for f in nb] == [(1, True), (2, True)]
    assert "'no-such-bucket' does not exist" in nb[0]["reason"] and nb[1]["retry_in_s"] == 60
    nc = [f for f in failed if "no usable AWS credentials" in f["reason"]]
    assert len(nc) == 1 and nc[0]["step"] == 0
    closed = [f for f in failed if "closed before" in f["reason"]]  # queued retries abandoned at close
    assert [f["will_retry"] for f in closed] == [False, False]
