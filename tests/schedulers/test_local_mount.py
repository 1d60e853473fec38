"""Shared storage mounted locally (issue 16, item 3), on the real dev cluster.

The dev cluster's nodes are this host, so this machine sees the cluster's shared directory at
the same path: a profile with ``local_mount`` = its ``shared_root`` is the real local-mount mode
(as a SageMaker Studio space with the cluster's FSx attached). Staging, event reading and log
reading then use the local file system; SSH carries only scheduler commands. Asserted by making
SFTP unusable on the connection (any SFTP call fails the test) and counting its calls, and by
recording every command sent. ``local_mount = "auto"`` finds the mount with a probe file.

Event delivery: the server's watcher learns of new events from file-system notifications
(watchdog/inotify) in this mode, with timed reads as the fallback; both paths deliver, and a
job whose notifications miss events (a network file system's other hosts write them) goes back
to timed reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import pytest
import tomli_w

from hyperpod_lab.events import EventWriter
from hyperpod_lab.schedulers.remote import MountedRemote, SSHRemote, connect, detect_local_mount
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit import envparity
from hyperpod_lab.submit.jobs import JobRecord

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = os.path.join(HERE, "scripts", "steps.py")
SCHEDULER_COMMANDS = {"sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo"}


def _use_profile(dev_cluster, tmp_path, monkeypatch, name: str, local_mount: str | None):
    prof = dataclasses.replace(dev_cluster, name=name, local_mount=local_mount).validate()
    config = tmp_path / "clusters.toml"
    with open(config, "wb") as f:
        tomli_w.dump({"clusters": {dev_cluster.name: dev_cluster.to_toml_table(), name: prof.to_toml_table()}}, f)
    monkeypatch.setenv("HYPERPOD_LAB_CONFIG", str(config))
    return prof


def _no_sftp(remote: MountedRemote, monkeypatch) -> list[list[str]]:
    """Make SFTP unusable on ``remote``'s connection (a call fails the test) and record every
    command sent over it (the list returned)."""
    ssh = remote.ssh
    assert isinstance(ssh, SSHRemote)

    def refuse(*a, **k):
        raise AssertionError("SFTP was used in local-mount mode")

    monkeypatch.setattr(ssh, "_sftp_of", refuse)
    sent: list[list[str]] = []
    real_run = ssh.run

    def run(argv, *a, **k):
        sent.append(list(argv))
        return real_run(argv, *a, **k)

    monkeypatch.setattr(ssh, "run", run)
    ssh.ops.clear()
    return sent


def _command(argv: list[str]) -> str:
    """The program a command runs: for envexec (``python -I -S -c <source> [--stage] -- ARGV``), ARGV's."""
    if "-c" in argv and "--" in argv:
        argv = argv[argv.index("--") + 1:]
    return os.path.basename(argv[0])


def test_submit_events_and_logs_use_the_local_mount_and_ssh_only_for_scheduler_commands(
        dev_cluster, client, tmp_path, monkeypatch):
    prof = _use_profile(dev_cluster, tmp_path, monkeypatch, "mounted", dev_cluster.shared_root)
    sched = client.scheduler(prof.name)
    assert isinstance(sched.remote, MountedRemote) and sched.remote.how == "profile"
    envparity.check_submission(sched.profile, remote=sched.remote)  # the probe cached, as after a first submit
    sent = _no_sftp(sched.remote, monkeypatch)
    rec = client.submit(JobSpec.from_dict({"script": STEPS, "cluster": prof.name, "name": "mounted-steps",
                                           "nodes": 1, "args": ["--steps", "5", "--sleep", "0.2"]}))
    assert dict(sched.remote.ssh.ops) == {"exec": 1}, sched.remote.ssh.ops  # sbatch alone
    assert [_command(a) for a in sent] == ["sbatch"], sent
    assert os.path.isfile(os.path.join(rec.job_dir, "events", "client.jsonl"))  # appended here, locally
    events = list(client.follow(rec.job_id, interval_s=0.2, timeout_s=180))
    kinds = [e.kind for e in events]
    assert kinds[0] == "submitted" and "step" in kinds and kinds[-1] == "finished", kinds  # steps: rate-limited
    assert events[0].data["native_id"] == rec.native_id
    assert client.wait(rec.job_id, timeout_s=120).status == "completed"
    job_log = client.logs(rec.job_id)
    assert f"slurm {rec.native_id}" in job_log, job_log[-2000:]
    rank_log = client.logs(rec.job_id, rank=0)
    assert rank_log.strip(), "rank 0's log is empty"
    # over SSH: scheduler commands only, never SFTP
    assert sched.remote.ssh.ops["sftp"] == 0, sched.remote.ssh.ops
    commands = {_command(a) for a in sent}
    assert commands <= SCHEDULER_COMMANDS, commands
    print(f"\nlocal-mount mode: {len(sent)} commands over SSH ({sorted(commands)}), "
          f"{sched.remote.ssh.ops['sftp']} SFTP calls; {len(events)} events, logs {len(job_log)} + {len(rank_log)} bytes")


def test_a_refused_submit_is_discarded_locally(dev_cluster, client, tmp_path, monkeypatch):
    prof = _use_profile(dev_cluster, tmp_path, monkeypatch, "mounted", dev_cluster.shared_root)
    sched = client.scheduler(prof.name)
    sent = _no_sftp(sched.remote, monkeypatch)
    jobs_root = os.path.dirname(sched.job_dir("x"))
    before = set(os.listdir(jobs_root))
    with pytest.raises(Exception, match="partition"):
        client.submit(JobSpec.from_dict({"script": STEPS, "cluster": prof.name, "name": "mounted-refused",
                                         "nodes": 1, "partition": "no-such-partition"}))
    assert [_command(a) for a in sent] == ["sbatch"], sent  # the directory went locally, not by rm -rf
    assert not [d for d in set(os.listdir(jobs_root)) - before if d.startswith("mounted-refused")]


def test_auto_finds_the_mount_with_a_probe_file(dev_cluster, tmp_path, monkeypatch):
    prof = _use_profile(dev_cluster, tmp_path, monkeypatch, "mounted-auto", "auto")
    remote = connect(prof)
    try:
        assert isinstance(remote, MountedRemote), remote
        assert remote.how == "probe" and remote.local_mount == os.path.normpath(dev_cluster.shared_root)
        base = os.path.join(dev_cluster.shared_root, "hyperpod-lab")
        assert not [n for n in os.listdir(base) if n.startswith(".mount-probe-")]  # removed again
        ssh = remote.ssh
        # not mounted where we look: no local mount, and why
        found, why = detect_local_mount(ssh, dev_cluster.shared_root, candidates=[str(tmp_path)])
        assert found is None and "not found" in why and str(tmp_path) in why
        # mounted, but the files there would not be this user's: refused
        monkeypatch.setattr(os, "geteuid", lambda: 4242)
        found, why = detect_local_mount(ssh, dev_cluster.shared_root)
        assert found is None and "uid" in why and "4242" in why, why
    finally:
        remote.close()


def test_a_local_mount_that_is_not_a_directory_is_a_config_error(dev_cluster, tmp_path, monkeypatch):
    from hyperpod_lab.errors import ConfigError

    prof = _use_profile(dev_cluster, tmp_path, monkeypatch, "mounted-bad", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="local_mount"):
        connect(prof)
    with pytest.raises(ConfigError, match="local_mount"):
        dataclasses.replace(dev_cluster, local_mount="relative/path").validate()


# ---- event delivery: notifications, and timed reads as the fallback ---------------------------
def _watched_job(client, prof, name: str) -> JobRecord:
    """A running job's record on the mounted cluster, its directory on the shared storage (its
    Slurm id names no job: squeue/sacct find nothing and the record stays running)."""
    sched = client.scheduler(prof.name)
    job_id = f"{name}-{os.getpid()}-{int(time.time() * 1000)}"
    job_dir = sched.job_dir(job_id)
    os.makedirs(os.path.join(job_dir, "events"), mode=0o700)
    rec = JobRecord(job_id=job_id, name=name, cluster=prof.name, orchestrator="slurm", native_id="999999999",
                    job_dir=job_dir, spec={"args": []}, status="running")
    client.store.put(rec)
    return rec


def _deliver(client, rec, n: int, gap_s: float, drop_notifications: bool = False, **watcher_kw):
    """Subscribe to ``rec`` through a Watcher, write ``n`` step events ``gap_s`` apart on the
    shared storage (locally, as a rank on a node writes them) and return (latency of each in s,
    the watcher)."""
    from hyperpod_lab.server.watch.watcher import Watcher

    async def scenario():
        w = Watcher(client, min_interval_s=0.5, max_interval_s=2.0, **watcher_kw)
        w.start()
        if drop_notifications and w.notifier is not None:
            w.notifier._notify = lambda job_id: None  # what a network FS does with other hosts' writes
        got: dict[int, float] = {}

        def send(m):
            if m["type"] == "event" and m["event"]["kind"] == "step":
                got[m["event"]["data"]["step"]] = time.time()
            return True

        await w.subscribe(rec.job_id, {}, send)
        await asyncio.sleep(1.0)  # the first read, and the watch it sets
        writer = EventWriter(rec.job_dir, "rank-0", rec.job_id)
        sent = {}
        for i in range(n):
            sent[i] = writer.emit("step", step=i, loss=1.0).time
            await asyncio.sleep(gap_s)
        deadline = time.monotonic() + 10
        while len(got) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await w.stop()
        return [got[i] - sent[i] if i in got else None for i in range(n)], w

    return asyncio.run(scenario())


@pytest.fixture
def job_dirs(client):
    """Removes the job directories of the records a test made (they are on the shared storage)."""
    yield
    import shutil

    for rec in client.store.list():
        if rec.native_id == "999999999":
            shutil.rmtree(rec.job_dir, ignore_errors=True)


def test_notifications_and_timed_reads_both_deliver(dev_cluster, client, tmp_path, monkeypatch, job_dirs):
    prof = _use_profile(dev_cluster, tmp_path, monkeypatch, "mounted", dev_cluster.shared_root)
    sched = client.scheduler(prof.name)
    _no_sftp(sched.remote, monkeypatch)

    # 1. notifications: the timed read is 30 s away, every event arrives within a second
    lat, w = _deliver(client, _watched_job(client, prof, "notify"), 8, 0.3, stream_interval_s=30.0,
                      notify_fallback_s=30.0)
    print(f"\nnotifications: latency {[round(x * 1000) if x is not None else None for x in lat]} ms, "
          f"{w.notify_wakeups} wake-ups, {w.notify_misses} misses")
    assert None not in lat and max(lat) < 1.0, lat
    assert w.notify_wakeups >= 8 and w.notify_misses == 0

    # 2. no notifications (notify=False, as without watchdog): timed reads deliver
    lat, w = _deliver(client, _watched_job(client, prof, "poll"), 6, 0.3, notify=False, stream_interval_s=0.25)
    print(f"timed reads: latency {[round(x * 1000) for x in lat]} ms")
    assert None not in lat and max(lat) < 1.5, lat
    assert w.notifier is None and w.notify_wakeups == 0

    # 3. notifications that never come for these writes (a network file system, other hosts'
    # writes): the fallback read finds the first event, then the job is read on a timer again
    lat, w = _deliver(client, _watched_job(client, prof, "missed"), 8, 0.4, drop_notifications=True,
                      stream_interval_s=0.25, notify_fallback_s=1.5)
    print(f"missed notifications: latency {[round(x * 1000) for x in lat]} ms, {w.notify_misses} misses")
    assert None not in lat and w.notify_misses == 1 and w.notify_wakeups == 0
    assert max(lat[5:]) < 1.0, lat  # back to reads every 0.25 s
    assert sched.remote.ssh.ops["sftp"] == 0
