"""Fewer round trips (issue 16, item 5): a Slurm submit over SSH is one command on the login node.

``Client.submit`` to the dev cluster (real sshd, real Slurm) stages the job directory, runs
sbatch and appends the ``submitted`` event in one exec (``envexec --stage``: the files and the
secrets travel on its standard input), with no SFTP call at all. Counted on the connection
(``SSHRemote.ops``). What the files look like (0700/0600, the checkpoint key), what a refused
sbatch leaves (nothing), what a connection lost while sbatch runs leaves (the record, found
again through ``find_native_id``), and the server's submit route running on the cluster's own
worker (a hung cluster's submit never holds another cluster's).
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time

import pytest
import tomli_w

from hyperpod_lab import envexec
from hyperpod_lab.errors import RemoteCommandError
from hyperpod_lab.events import EventReader
from hyperpod_lab.jobdir import CHECKPOINT_KEY_BYTES, JobPaths
from hyperpod_lab.schedulers.remote import CommandOutcomeUnknown
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit import envparity

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = os.path.join(HERE, "scripts", "steps.py")
PROBE = os.path.join(HERE, "scripts", "secret_probe.py")
SECRET = "hf_" + "round-trip-S3cret-0123456789"


def _mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _submitted(rec) -> list:
    return [e for e in EventReader(rec.job_dir).poll() if e.kind == "submitted"]


def _warm(client, cluster):
    """The cluster's scheduler, connected, with the environment check's probe cached (60 s): what
    a submit finds after the first one (that first submit is one exec more, the probe;
    tests/submit/test_env_parity.py counts it)."""
    sched = client.scheduler(cluster)
    envparity.check_submission(sched.profile, remote=sched.remote)
    return sched


def test_a_slurm_submit_is_one_exec_and_no_sftp(dev_cluster, client):
    sched = _warm(client, dev_cluster.name)  # connected and probed once, before counting
    sched.remote.ops.clear()
    t0 = time.perf_counter()
    rec = client.submit(JobSpec.from_dict({"script": STEPS, "cluster": dev_cluster.name, "name": "one-exec",
                                           "nodes": 1, "args": ["--steps", "2", "--sleep", "0.1"]}))
    took = time.perf_counter() - t0
    ops = dict(sched.remote.ops)
    print(f"\nsubmit over SSH: {ops} in {took * 1000:.0f} ms")
    assert ops == {"exec": 1}, ops  # staging + sbatch + job id + event: one command, no SFTP
    assert rec.native_id.isdigit()
    paths = JobPaths(rec.job_dir)
    # private files and directories, the batch script executable by its owner only
    assert _mode(rec.job_dir) == 0o700
    for sub in JobPaths.SUBDIRS:
        assert _mode(paths.path(sub)) == 0o700, sub
    assert _mode(paths.sbatch) == 0o700
    for f in (paths.spec, paths.checkpoint_key, paths.script(STEPS)):
        assert _mode(f) == 0o600, f
    with open(paths.checkpoint_key, "rb") as f:
        assert len(f.read()) == CHECKPOINT_KEY_BYTES
    with open(paths.script(STEPS), "rb") as f, open(STEPS, "rb") as g:
        assert f.read() == g.read()
    with open(paths.sbatch) as f:
        assert f.read() == sched._render(JobSpec.from_dict(rec.spec), rec.job_id)
    ev = _submitted(rec)
    assert len(ev) == 1 and ev[0].writer == "client" and ev[0].seq == 0, ev
    assert ev[0].data == {"cluster": dev_cluster.name, "native_id": rec.native_id, "name": "one-exec", "nodes": 1,
                          "procs_per_node": 1, "world_size": 1}
    with open(os.path.join(rec.job_dir, "events", "changes.log"), "rb") as f:  # named, as every writer does
        assert b"client.jsonl" in f.read().split()
    final = client.wait(rec.job_id, timeout_s=180)
    assert final.status == "completed", client.logs(rec.job_id)[-2000:]
    kinds = [e.kind for e in EventReader(rec.job_dir).poll()]
    assert kinds.count("submitted") == 1 and "finished" in kinds


def test_a_secret_still_travels_only_on_standard_input(dev_cluster, client, monkeypatch):
    """With a secret the submit is still one exec; the job sees the value, no file holds it."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    sched = _warm(client, dev_cluster.name)
    sched.remote.ops.clear()
    rec = client.submit(JobSpec.from_dict({"script": PROBE, "cluster": dev_cluster.name, "name": "rt-secret",
                                           "nodes": 1, "secret_env": ["HF_TOKEN"], "args": ["HF_TOKEN"]}))
    assert dict(sched.remote.ops) == {"exec": 1}, sched.remote.ops
    final = client.wait(rec.job_id, timeout_s=180)
    assert final.status == "completed", client.logs(rec.job_id)[-2000:]
    steps = [e.data for e in EventReader(rec.job_dir).poll() if e.kind == "step"]
    assert steps and steps[0]["sha256_HF_TOKEN"] == hashlib.sha256(SECRET.encode()).hexdigest()
    for d, _, files in os.walk(rec.job_dir):
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                assert SECRET.encode() not in f.read(), name


def test_a_refused_sbatch_leaves_no_record_and_no_directory(dev_cluster, client):
    sched = _warm(client, dev_cluster.name)
    jobs_root = os.path.dirname(sched.job_dir("x"))
    before = set(os.listdir(jobs_root)) if os.path.isdir(jobs_root) else set()
    sched.remote.ops.clear()
    with pytest.raises(RemoteCommandError, match="sbatch") as e:
        client.submit(JobSpec.from_dict({"script": STEPS, "cluster": dev_cluster.name, "name": "refused-rt",
                                         "nodes": 1, "partition": "no-such-partition"}))
    assert "partition" in str(e.value).lower(), e.value
    assert sched.remote.ops["sftp"] == 0 and sched.remote.ops["exec"] == 2, sched.remote.ops  # submit, rm -rf
    assert [r for r in client.store.list() if r.name == "refused-rt"] == []
    assert not [d for d in set(os.listdir(jobs_root)) - before if d.startswith("refused-rt")]


def _slow_program(monkeypatch, before_s: float = 0.0, after_s: float = 0.0):
    """envexec as sent to the login node, sleeping ``before_s`` before it stages and runs sbatch,
    or ``after_s`` after (the window in which the test cuts the connection)."""
    real = envexec.program_argv

    def slow(python, stage=False):
        argv = real(python, stage)
        i = argv.index("-c") + 1
        argv[i] = argv[i].replace("    sys.exit(main())",
                                  f"    import time\n    time.sleep({before_s})\n    rc = main()\n"
                                  f"    time.sleep({after_s})\n    sys.exit(rc)")
        return argv

    monkeypatch.setattr(envexec, "program_argv", slow)


def _cut_when(remote, ready, out: list) -> threading.Thread:
    from test_remote_resilience import kill_server_side

    def cut():
        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        out.append(kill_server_side(remote))

    th = threading.Thread(target=cut)
    th.start()
    return th


def test_a_connection_lost_after_sbatch_keeps_the_job_and_finds_it(dev_cluster, client, monkeypatch):
    """The connection dies after sbatch queued the job (and the event was written), before the
    answer came back: the submit is not repeated, nothing is deleted, and the job is found at
    once through ``find_native_id`` (squeue, by the job's --comment); one 'submitted' event."""
    sched = client.scheduler(dev_cluster.name)
    jobs_root = os.path.dirname(sched.job_dir("x"))
    _slow_program(monkeypatch, after_s=20)

    before = set(os.listdir(jobs_root)) if os.path.isdir(jobs_root) else set()  # an earlier run's jobs

    def event_written():
        for d in os.listdir(jobs_root) if os.path.isdir(jobs_root) else []:
            if (d.startswith("lost-after-") and d not in before
                    and os.path.exists(os.path.join(jobs_root, d, "events", "client.jsonl"))):
                return True
        return False

    killed: list = []
    th = _cut_when(sched.remote, event_written, killed)
    rec = client.submit(JobSpec.from_dict({"script": STEPS, "cluster": dev_cluster.name, "name": "lost-after",
                                           "nodes": 1, "args": ["--steps", "2"]}))
    th.join()
    assert killed and sched.remote.reconnects >= 1, (killed, sched.remote.reconnects)
    assert rec.native_id.isdigit() and os.path.isdir(rec.job_dir)
    ev = _submitted(rec)
    assert len(ev) == 1 and ev[0].data["native_id"] == rec.native_id, ev
    assert client.wait(rec.job_id, timeout_s=180).status == "completed"


def test_a_connection_lost_before_sbatch_ran_keeps_the_record_for_refresh(dev_cluster, client, monkeypatch):
    """The connection dies while the login node's command has not run sbatch yet (it still will):
    the submit fails with CommandOutcomeUnknown, but the record stays ('submitting') instead of
    being deleted with its directory; the next refresh finds the job it queued after all."""
    sched = client.scheduler(dev_cluster.name)
    _slow_program(monkeypatch, before_s=3)
    started = time.monotonic()
    killed: list = []
    th = _cut_when(sched.remote, lambda: time.monotonic() - started > 1.0, killed)
    with pytest.raises(CommandOutcomeUnknown, match="kept") as e:
        client.submit(JobSpec.from_dict({"script": STEPS, "cluster": dev_cluster.name, "name": "lost-before",
                                         "nodes": 1, "args": ["--steps", "2"]}))
    th.join()
    assert killed
    recs = [r for r in client.store.list() if r.name == "lost-before"]
    assert len(recs) == 1 and recs[0].native_id == "" and recs[0].reason == "submitting", recs
    job_id = recs[0].job_id
    assert job_id in str(e.value)
    final = client.wait(job_id, timeout_s=180)  # refresh -> find_native_id -> squeue / native_id file
    assert final.native_id.isdigit() and final.status == "completed", final


def test_the_submit_route_runs_on_the_clusters_own_worker(dev_cluster, tmp_path, monkeypatch):
    """A jupyter server with a login node that lets us in and never answers: while ``POST jobs``
    to that cluster waits (its submit is one exec that gets no answer), ``POST jobs`` to the dev
    cluster answers at once."""
    from hung_sftp import HungSSHServer, new_key_pair
    from jupyter_server_proc import JupyterServer

    from hyperpod_lab.submit.clusters import ClusterProfile

    key_file, key = new_key_pair(str(tmp_path))
    hung_srv = HungSSHServer(key).start()
    kh = tmp_path / "hung_known_hosts"
    kh.write_text(hung_srv.known_hosts_line)
    hung = ClusterProfile(name="hung", orchestrator="slurm", host="127.0.0.1", port=hung_srv.port, user="root",
                          key_file=key_file, known_hosts=str(kh), shared_root="/shared", connect_timeout_s=5,
                          op_timeout_s=8.0).validate()
    config = tmp_path / "clusters.toml"
    with open(config, "wb") as f:
        tomli_w.dump({"clusters": {dev_cluster.name: dev_cluster.to_toml_table(), "hung": hung.to_toml_table()}}, f)
    monkeypatch.setenv("HYPERPOD_LAB_CONFIG", str(config))
    root = tmp_path / "root"
    root.mkdir()
    (root / "steps.py").write_bytes(open(STEPS, "rb").read())
    work = tmp_path / "server"
    work.mkdir()
    srv = JupyterServer(str(root), str(work)).start()

    def post(cluster: str):
        spec = {"script": "steps.py", "name": f"route-{cluster}", "cluster": cluster, "nodes": 1,
                "args": ["--steps", "1"]}
        return srv.call("POST", "/hyperpod/jobs", {"spec": spec}, timeout_s=60)

    try:
        status, body = post(dev_cluster.name)  # warm: connected once
        assert status == 201, body
        pending: dict = {}

        def submit_hung():
            t0 = time.monotonic()
            pending["answer"] = post("hung")
            pending["took"] = time.monotonic() - t0

        asker = threading.Thread(target=submit_hung)
        asker.start()
        time.sleep(1.0)  # the hung cluster's worker now waits on its login node
        t0 = time.monotonic()
        status, body = post(dev_cluster.name)
        took = time.monotonic() - t0
        assert status == 201, body
        assert "answer" not in pending, ("the hung submit was expected to be pending still", took)
        asker.join(timeout=60)
        print(f"\nPOST jobs to the dev cluster while another cluster's submit hung: {took:.2f} s; "
              f"the hung submit: {pending['took']:.2f} s -> {pending['answer'][0]}")
        assert took < 3.0, took
        status, body = pending["answer"]
        assert status == 502 and body["error"]["type"] == "CommandOutcomeUnknown", body
        # the exec request went out unanswered: sbatch may have run there, so the record is kept
        status, body = srv.call("GET", "/hyperpod/jobs")
        hung_jobs = [j for j in body["jobs"] if j["cluster"] == "hung"]
        assert status == 200 and len(hung_jobs) == 1 and hung_jobs[0]["reason"] == "submitting", hung_jobs
    finally:
        srv.stop()
        hung_srv.stop()
