"""A remote seam that never hangs (issue 16, item 4).

* A login node that lets us in and then never answers (``tests/hung_sftp.py``, a paramiko
  server): SFTP stat / read / list / mkdir and exec fail within ``op_timeout_s`` (+ 3 s), naming
  the cluster, the host (alias and address), the operation and the path; and a jupyter server
  asked about that cluster keeps answering requests about the others meanwhile.
* The dev cluster's real sshd: the server-side process of our connection killed while a job's
  events stream -> the reader reconnects and its cursors resume with no gap and no duplicate.
* A link that goes silent (a TCP relay that stops forwarding): keepalives find it dead well
  before the operation's timeout, and the call in flight completes over a new connection.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import socket
import threading
import time

import pytest
import tomli_w

from hung_sftp import HungSSHServer, new_key_pair
from hyperpod_lab.errors import ClusterUnreachable, RemoteCommandError
from hyperpod_lab.events import EventKind, EventReader, EventWriter
from hyperpod_lab.schedulers.remote import SSHRemote

OP_TIMEOUT_S = 2.0
SLACK_S = 3.0  # the brief's bound: a hung call fails within its timeout + 3 s


@pytest.fixture
def hung(tmp_path):
    """A HungSSHServer and a slurm profile for it (op_timeout_s = OP_TIMEOUT_S)."""
    from hyperpod_lab.clusters import ClusterProfile

    key_file, key = new_key_pair(str(tmp_path))
    srv = HungSSHServer(key).start()
    kh = tmp_path / "hung_known_hosts"
    kh.write_text(srv.known_hosts_line)
    cfg = tmp_path / "ssh_config"  # an alias, so errors show alias and address; keeps ~/.ssh/config out
    cfg.write_text(f"Host hung-login\n  HostName 127.0.0.1\n  Port {srv.port}\n")
    prof = ClusterProfile(name="hung", orchestrator="slurm", host="hung-login", user="root", key_file=key_file,
                          known_hosts=str(kh), ssh_config=str(cfg), shared_root="/shared", connect_timeout_s=5,
                          op_timeout_s=OP_TIMEOUT_S).validate()
    yield srv, prof
    srv.stop()


def _fails_in_time(fn, *words):
    t0 = time.monotonic()
    with pytest.raises(ClusterUnreachable) as e:
        fn()
    took = time.monotonic() - t0
    msg = str(e.value)
    assert took < OP_TIMEOUT_S + SLACK_S, (took, msg)
    for w in words:
        assert w in msg, (w, msg)
    return took, msg


def test_hung_login_node_fails_each_operation_within_its_timeout(hung):
    srv, prof = hung
    remote = SSHRemote(prof)  # connecting and authenticating work: only the answers never come
    try:
        host = ["cluster 'hung'", "hung-login", f"127.0.0.1:{srv.port}", "op_timeout_s"]
        took, msg = _fails_in_time(lambda: remote.stat("/shared/job/spec.json"), "stat", "/shared/job/spec.json",
                                   *host)
        assert took >= OP_TIMEOUT_S - 0.1  # it did wait for the answer, then gave up
        assert "SFTP version exchange" in msg and "dropped" in msg
        assert not remote.alive  # the broken connection is dropped...
        # ...and the next call reconnects (a new connection to the server), then fails in time too
        before = srv.connections
        _fails_in_time(lambda: remote.read_from("/shared/job/events/rank-0.jsonl", 128),
                       "read", "/shared/job/events/rank-0.jsonl", *host)
        assert srv.connections == before + 1 and remote.reconnects == 1
        _fails_in_time(lambda: remote.list_files("/shared/job/events"), "list", "/shared/job/events", *host)
        _fails_in_time(lambda: remote.makedirs("/shared/job/ranks"), "mkdir", "/shared/job/ranks", *host)
        _fails_in_time(lambda: remote.write_bytes("/shared/job/x", b"x"), "/shared/job", *host)
        # a command: the exec request itself is never answered
        _fails_in_time(lambda: remote.run(["sinfo", "-N"], timeout_s=60), "exec", "`sinfo`", "exec request", *host)
        assert "exec sinfo -N" in srv.log, srv.log
    finally:
        remote.close()


def test_hung_cluster_never_delays_another_clusters_requests(hung, dev_cluster, tmp_path, monkeypatch):
    """A jupyter server with the dev cluster and the hung one: while ``GET clusters/hung`` waits
    on its login node, ``GET clusters/local-slurm`` (sinfo over the dev cluster's sshd),
    ``GET clusters/local`` and ``GET jobs`` answer within 2 s; the hung request then ends within
    its timeout (+ 3 s), naming the host and the operation."""
    from jupyter_server_proc import JupyterServer

    _, prof = hung
    prof = dataclasses.replace(prof, op_timeout_s=6.0)  # long enough to ask the others meanwhile
    config = tmp_path / "clusters.toml"
    with open(config, "wb") as f:
        tomli_w.dump({"clusters": {dev_cluster.name: dev_cluster.to_toml_table(),
                                   prof.name: prof.to_toml_table()}}, f)
    monkeypatch.setenv("HYPERPOD_LAB_CONFIG", str(config))
    root = tmp_path / "root"
    root.mkdir()
    work = tmp_path / "server"
    work.mkdir()
    srv = JupyterServer(str(root), str(work)).start()
    try:
        status, body = srv.call("GET", f"/hyperpod/clusters/{dev_cluster.name}")  # warm: connected once
        assert status == 200 and body["state"] == "up", body
        pending: dict = {}

        def ask_hung():
            t0 = time.monotonic()
            pending["answer"] = srv.call("GET", "/hyperpod/clusters/hung")
            pending["took"] = time.monotonic() - t0

        asker = threading.Thread(target=ask_hung)
        asker.start()
        time.sleep(0.5)  # the hung cluster's worker is now waiting on its login node
        took = {}
        for path in (f"/hyperpod/clusters/{dev_cluster.name}", "/hyperpod/clusters/local", "/hyperpod/jobs",
                     "/hyperpod/clusters"):
            t0 = time.monotonic()
            status, body = srv.call("GET", path, timeout_s=10)
            took[path] = time.monotonic() - t0
            assert status == 200, (path, status, body)
            assert took[path] < 2.0, (path, took)
            if path.endswith(dev_cluster.name):
                assert body["state"] == "up", body
        assert "answer" not in pending, ("the hung request was expected to be pending still", took)
        asker.join(timeout=60)
        status, body = pending["answer"]
        print(f"\nother clusters' GETs while one hung (s): {took}; the hung GET: {pending['took']:.2f} s")
        assert prof.op_timeout_s - 0.5 < pending["took"] < prof.op_timeout_s + SLACK_S, pending["took"]
        assert status == 200 and body["state"] == "unreachable", body
        for word in ("exec", "`sinfo`", "hung-login", "127.0.0.1:", "op_timeout_s"):
            assert word in body["error"], (word, body["error"])
    finally:
        srv.stop()
