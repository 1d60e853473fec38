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
    from hyperpod_lab.submit.clusters import ClusterProfile

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
    print(f"\n{words[0]}: failed after {took:.2f} s (op_timeout_s {OP_TIMEOUT_S:g})")
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


# ---- the dev cluster's sshd: our connection killed mid-stream ------------------------------------
def _socket_inode(local_port: int, remote_port: int) -> str | None:
    """The inode of the established TCP socket 127.0.0.1:local_port <-> 127.0.0.1:remote_port."""
    want_local, want_remote = f"0100007F:{local_port:04X}", f"0100007F:{remote_port:04X}"
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1] == want_local and fields[2] == want_remote and fields[3] == "01":  # ESTABLISHED
                return fields[9]
    return None


def _holders(inode: str) -> list[int]:
    """Pids that hold socket ``inode`` open."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    pids.append(int(pid))
                    break
        except OSError:  # gone, or not ours to read
            continue
    return pids


def _listener_pids(port: int) -> set[int]:
    with open("/proc/net/tcp") as f:
        inodes = [ln.split()[9] for ln in f.readlines()[1:]
                  if ln.split()[1] == f"0100007F:{port:04X}" and ln.split()[3] == "0A"]  # LISTEN
    return {p for i in inodes for p in _holders(i)}


def kill_server_side(remote: SSHRemote) -> list[int]:
    """SIGKILL the sshd process(es) serving ``remote``'s connection (found by our client's source
    port); never the listening daemon."""
    sock = remote.client.get_transport().sock
    local_port = sock.getsockname()[1]
    server_port = sock.getpeername()[1]
    inode = _socket_inode(server_port, local_port)  # the server's end: local = sshd's port
    assert inode, f"no established socket 127.0.0.1:{server_port} <- :{local_port}"
    pids = _holders(inode)
    listeners = _listener_pids(server_port)
    assert pids and not set(pids) & listeners, (pids, listeners)
    for pid in pids:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"sshd" in f.read(), pid
        os.kill(pid, signal.SIGKILL)
    return pids


def test_killed_sshd_connection_stream_resumes_without_gap_or_duplicate(dev_cluster, tmp_path):
    """A job's events are written (locally, the way a rank writes them on shared storage) while an
    EventReader streams them through the dev cluster's sshd; the sshd process of that connection is
    SIGKILLed mid-stream, twice, and writing goes on: the reader reconnects by itself and collects
    exactly the events written, in order, each once."""
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    n_steps = 300
    writer = EventWriter(job_dir, "rank-0", "resume-1")
    written: list[int] = []

    def write():
        for i in range(n_steps):
            writer.emit(EventKind.STEP, step=i, loss=1.0 / (i + 1))
            written.append(i)
            time.sleep(0.01)
        writer.emit(EventKind.FINISHED, exit_code=0)

    remote = SSHRemote(dev_cluster)
    reader = EventReader(job_dir, files=remote)
    got, killed = [], []

    def kill_mid_stream():
        """From another thread, so the kill lands while the reader is inside a list or a read."""
        for at in (60, 180):
            while len(got) < at and th.is_alive():
                time.sleep(0.001)
            killed.append((kill_server_side(remote), len(written)))

    th = threading.Thread(target=write)
    killer = threading.Thread(target=kill_mid_stream)
    th.start()
    killer.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got.extend(reader.poll())
            if got and got[-1].kind == EventKind.FINISHED.value:
                break
            time.sleep(0.005)
    finally:
        th.join()
        killer.join()
        remote.close()
    print(f"\nkilled sshd pids (events written by then): {killed}; reconnects: {remote.reconnects}; "
          f"last drop: {remote.last_drop}")
    assert len(killed) == 2, killed
    assert all(at < n_steps for _, at in killed), ("the writer had finished before a kill", killed)
    assert remote.reconnects >= 2, remote.reconnects
    steps = [ev.data["step"] for ev in got if ev.kind == EventKind.STEP.value]
    assert steps == list(range(n_steps)), ("gap or duplicate", steps[:5], len(steps))
    assert [ev.seq for ev in got] == list(range(n_steps + 1))
    assert got[-1].kind == EventKind.FINISHED.value and not reader.skipped


# ---- a link that goes silent: keepalives find it dead ---------------------------------------------
class FreezingRelay:
    """A TCP relay 127.0.0.1:port -> target; :meth:`freeze` makes every connection open now stop
    forwarding (nothing closed, nothing reset: a dead link), while new connections still flow."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop_event = threading.Event()
        self.conns: list[dict] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop_event.is_set():
            try:
                a, _ = self.sock.accept()
            except OSError:
                continue
            b = socket.create_connection(("127.0.0.1", self.target_port))
            conn = {"socks": (a, b), "frozen": False}
            self.conns.append(conn)
            threading.Thread(target=self._pump, args=(conn,), daemon=True).start()

    def _pump(self, conn):
        a, b = conn["socks"]
        peer = {a: b, b: a}
        while not self.stop_event.is_set():
            if conn["frozen"]:
                time.sleep(0.05)
                continue
            try:
                r, _, _ = select.select([a, b], [], [], 0.05)
            except (OSError, ValueError):  # dropped by the test (closed under us): this pump is done
                return
            for s in r:
                try:
                    data = s.recv(65536)
                    if not data:
                        raise OSError("closed")
                    peer[s].sendall(data)
                except OSError:
                    a.close()
                    b.close()
                    return

    def freeze(self):
        for c in self.conns:
            c["frozen"] = True

    def close(self):
        self.stop_event.set()
        self.sock.close()
        for c in self.conns:
            for s in c["socks"]:
                s.close()


def test_dead_link_found_by_keepalives_and_the_call_completes_over_a_new_connection(dev_cluster, tmp_path):
    """ServerAliveInterval 1, ServerAliveCountMax 2 (from the OpenSSH config): the link goes silent
    while a read waits; the keepalive monitor declares it dead after ~2 s (the read's own timeout
    is 30 s), and the read completes over a new connection."""
    relay = FreezingRelay(dev_cluster.port)
    kh = tmp_path / "known_hosts"  # the dev sshd's key, under the relay's address
    with open(dev_cluster.known_hosts) as f:
        kh.write_text(f.read().replace(f"[127.0.0.1]:{dev_cluster.port}", f"[127.0.0.1]:{relay.port}"))
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host relayed\n  HostName 127.0.0.1\n  Port {relay.port}\n"
                   f"  ServerAliveInterval 1\n  ServerAliveCountMax 2\n")
    prof = dataclasses.replace(dev_cluster, name="relayed", host="relayed", port=22, ssh_config=str(cfg),
                               known_hosts=str(kh), op_timeout_s=30.0)
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(1 << 16))
    remote = SSHRemote(prof)
    try:
        assert remote.route.target.keepalive_s == 1 and remote.route.target.keepalive_count == 2
        assert remote.read_from(str(path)) == path.read_bytes()
        relay.freeze()
        t0 = time.monotonic()
        assert remote.read_from(str(path), 100) == path.read_bytes()[100:]
        took = time.monotonic() - t0
        print(f"\nread across a dead link: {took:.2f} s; dropped because: {remote.last_drop}")
        assert took < 1 * 2 + 1 + 4, took  # interval x count, the probe's round, a reconnect: far below 30 s
        assert remote.reconnects == 1
        assert "keepalive" in (remote.last_drop or ""), remote.last_drop
        assert "relayed" in remote.last_drop and f"127.0.0.1:{relay.port}" in remote.last_drop
    finally:
        remote.close()
        relay.close()


def test_default_keepalive_is_15_s_and_0_turns_it_off(tmp_path):
    from hyperpod_lab.schedulers.remote.route import resolve_route
    from hyperpod_lab.submit.clusters import ClusterProfile

    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host quiet\n  ServerAliveInterval 0\n")
    base = ClusterProfile(name="k", orchestrator="slurm", host="plain", shared_root="/s", ssh_config=str(cfg))
    hop = resolve_route(base).target
    assert (hop.keepalive_s, hop.keepalive_count) == (15, 3)
    assert resolve_route(dataclasses.replace(base, host="quiet")).target.keepalive_s == 0


def test_op_timeout_is_validated():
    from hyperpod_lab.errors import ConfigError
    from hyperpod_lab.submit.clusters import ClusterProfile

    assert ClusterProfile(name="k", orchestrator="slurm", host="h", shared_root="/s").op_timeout_s == 30.0
    for bad in (0, -1, "30", True, 10_000):
        with pytest.raises(ConfigError, match="op_timeout_s"):
            ClusterProfile(name="k", orchestrator="slurm", host="h", shared_root="/s", op_timeout_s=bad).validate()


def test_commands_rerun_after_a_drop_only_when_safe(dev_cluster, tmp_path):
    """A connection found dead before a command goes out: reconnect and run it (once). Lost while
    a command runs: an ``idempotent`` one (a query) runs again; any other (sbatch, scancel) is not
    repeated and the error says it may or may not have run."""
    remote = SSHRemote(dev_cluster)
    try:
        # dead before sending: the server side killed, the transport has noticed
        kill_server_side(remote)
        deadline = time.monotonic() + 10
        while remote.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not remote.alive
        marker = tmp_path / "ran"
        res = remote.run(["sh", "-c", f"echo x >> {marker}; echo ok"])
        assert res.stdout == "ok\n" and marker.read_text() == "x\n" and remote.reconnects == 1

        def kill_soon():
            time.sleep(0.7)
            kill_server_side(remote)

        # lost mid-command, not idempotent: not repeated
        k = threading.Thread(target=kill_soon)
        k.start()
        with pytest.raises(ClusterUnreachable, match="not repeated: it may or may not have taken effect") as e:
            remote.run(["sh", "-c", f"echo y >> {marker}; sleep 3; echo done"])
        k.join()
        assert "exec `sh`" in str(e.value)
        time.sleep(3)
        assert marker.read_text() == "x\ny\n"  # it ran once; nothing ran it again
        # lost mid-command, idempotent: run again over a new connection
        k = threading.Thread(target=kill_soon)
        k.start()
        res = remote.run(["sh", "-c", f"echo z >> {marker}; sleep 2; echo done"], idempotent=True)
        k.join()
        assert res.stdout == "done\n" and remote.reconnects == 3
        assert marker.read_text().count("z") == 2  # the query ran twice, as it may
    finally:
        remote.close()


def test_a_slow_command_times_out_and_keeps_the_connection(dev_cluster):
    remote = SSHRemote(dev_cluster)
    try:
        t0 = time.monotonic()
        with pytest.raises(RemoteCommandError) as e:
            remote.run(["sleep", "10"], timeout_s=1.5)
        took = time.monotonic() - t0
        assert e.value.exit_status == -1, e.value
        assert took < 1.5 + SLACK_S, took
        assert "no output and no exit within 1.5 s" in str(e.value) and "127.0.0.1:" in str(e.value)
        assert remote.alive and remote.run(["true"]).exit_status == 0 and remote.reconnects == 0
    finally:
        remote.close()
