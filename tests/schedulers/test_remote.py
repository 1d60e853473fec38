"""The one remote-command seam, against a real sshd on loopback (the dev cluster's)."""

import dataclasses
import os
import socket
import threading
import time

import pytest
from ports import free_port

from hyperpod_lab.errors import ClusterUnreachable, HostKeyError, RemoteCommandError
from hyperpod_lab.schedulers.remote import LocalRemote, SSHRemote, quote_argv

NASTY = ["'; touch /tmp/hyperpod-x; '", "$(id)", "`id`", "a\nb", "*", "~", "&&", "x y", "", "\\", '"q"']


def test_quote_argv_rejects_non_argv():
    with pytest.raises(ValueError):
        quote_argv([])
    with pytest.raises(ValueError):
        quote_argv("ls -l")  # a string is not an argv list
    with pytest.raises(ValueError):
        quote_argv(["echo", "a\x00b"])


@pytest.mark.parametrize("remote_kind", ["local", "ssh"])
def test_argv_reaches_the_command_as_data(remote_kind, dev_cluster, tmp_path):
    remote = LocalRemote() if remote_kind == "local" else SSHRemote(dev_cluster)
    try:
        res = remote.run(["printf", "%s\\0", *NASTY])
        assert res.stdout.split("\0")[:-1] == NASTY
        assert not os.path.exists("/tmp/hyperpod-x")
        with pytest.raises(RemoteCommandError) as e:
            remote.run(["ls", "/definitely/not/here"])
        assert e.value.exit_status != 0 and "ls" in str(e.value)
        # files: atomic write, append, read from an offset, listdir
        p = str(tmp_path / "sub" / "f.txt")
        remote.makedirs(str(tmp_path / "sub"))
        remote.write_bytes(p, b"hello\n")
        remote.append_bytes(p, b"world\n")
        assert remote.read_from(p, 6) == b"world\n"
        assert remote.listdir(str(tmp_path / "sub")) == ["f.txt"]
        assert remote.listdir(str(tmp_path / "missing")) == []
        with pytest.raises(FileNotFoundError):
            remote.read_from(str(tmp_path / "missing"))
    finally:
        remote.close()


def test_unreachable_port_fails_fast_naming_host_and_port(dev_cluster):
    port = free_port()  # a port nobody listens on
    prof = dataclasses.replace(dev_cluster, port=port)
    t0 = time.monotonic()
    with pytest.raises(ClusterUnreachable) as e:
        SSHRemote(prof)
    assert time.monotonic() - t0 < 10
    assert f"127.0.0.1:{port}" in str(e.value)


def test_silent_login_node_times_out_within_10s(dev_cluster):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    conns = []
    threading.Thread(target=lambda: conns.append(srv.accept()), daemon=True).start()
    prof = dataclasses.replace(dev_cluster, port=port, connect_timeout_s=3)
    t0 = time.monotonic()
    try:
        with pytest.raises(ClusterUnreachable) as e:
            SSHRemote(prof)
    finally:
        srv.close()
    assert time.monotonic() - t0 < 10
    assert f"127.0.0.1:{port}" in str(e.value)


def test_unknown_and_changed_host_keys_are_refused(dev_cluster, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError, match="unknown"):
        SSHRemote(dataclasses.replace(dev_cluster, known_hosts=str(empty)))
    # a known_hosts naming a different key for the same host:port
    import paramiko

    other = paramiko.Ed25519Key.generate() if hasattr(paramiko.Ed25519Key, "generate") else None
    if other is None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519

        raw = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
        line = f"[127.0.0.1]:{dev_cluster.port} {raw}\n"
    else:
        line = f"[127.0.0.1]:{dev_cluster.port} {other.get_name()} {other.get_base64()}\n"
    wrong = tmp_path / "wrong_hosts"
    wrong.write_text(line)
    with pytest.raises(HostKeyError, match="does not match"):
        SSHRemote(dataclasses.replace(dev_cluster, known_hosts=str(wrong)))
    with pytest.raises(HostKeyError, match="missing"):
        SSHRemote(dataclasses.replace(dev_cluster, known_hosts=str(tmp_path / "nope")))
