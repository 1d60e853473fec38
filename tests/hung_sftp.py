"""Test helper: an SSH server (paramiko) that lets you in and then never answers.

It listens on 127.0.0.1 (a free port), checks the host key the client knows and one public key
for any user, opens session channels, accepts the ``sftp`` subsystem and then reads and answers
nothing on it (not even SFTP's version exchange); an ``exec`` request is never answered either
(the server's transport thread waits, as a hung sshd would, so keepalives go unanswered from
then on). Everything ends at :meth:`HungSSHServer.stop`.

Stands in for a login node whose file system or sshd hangs: the client's calls must fail within
their timeouts. Not product code.
"""

from __future__ import annotations

import os
import socket
import threading

import paramiko


def new_key_pair(directory: str) -> tuple[str, paramiko.PKey]:
    """A fresh ECDSA key: (private key file written 0600 in ``directory``, the key)."""
    key = paramiko.ECDSAKey.generate()
    path = os.path.join(directory, "hung_id_ecdsa")
    key.write_private_key_file(path)
    os.chmod(path, 0o600)
    return path, key


class _Silent(paramiko.SubsystemHandler):
    """The ``sftp`` subsystem: accepted, then silent until the server stops."""

    def __init__(self, channel, name, server, stop: threading.Event):
        super().__init__(channel, name, server)
        self._stop_event = stop

    def start_subsystem(self, name, transport, channel):
        self.get_server().log.append(name)
        self._stop_event.wait()


class _Server(paramiko.ServerInterface):
    def __init__(self, key: paramiko.PKey, stop: threading.Event, log: list[str]):
        self.key, self.stop, self.log = key, stop, log

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        ok = key.get_name() == self.key.get_name() and key.asbytes() == self.key.asbytes()
        self.log.append(f"auth {username} {'ok' if ok else 'refused'}")
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        self.log.append(f"exec {command.decode(errors='replace') if isinstance(command, bytes) else command}")
        self.stop.wait()  # never answered: this connection's transport thread waits here
        return False


class HungSSHServer:
    """The server. ``start()`` returns it; ``port``, ``host_key`` and ``known_hosts_line`` say how
    to reach it; ``log`` lists what clients asked (``auth``, ``exec ...``, ``sftp``).

    Args:
        client_key: the one public key accepted (any user name).
    """

    def __init__(self, client_key: paramiko.PKey):
        self.client_key = client_key
        self.host_key = paramiko.ECDSAKey.generate()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._transports: list[paramiko.Transport] = []
        self.log: list[str] = []
        self.connections = 0

    @property
    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}\n"

    def start(self) -> "HungSSHServer":
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        threading.Thread(target=self._accept, name="hung-sftp-accept", daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (socket.timeout, OSError):
                continue
            self.connections += 1
            t = paramiko.Transport(conn)
            t.add_server_key(self.host_key)
            t.set_subsystem_handler("sftp", _Silent, self._stop)
            self._transports.append(t)
            threading.Thread(target=self._serve, args=(t,), name="hung-sftp-conn", daemon=True).start()

    def _serve(self, t: paramiko.Transport) -> None:
        try:
            t.start_server(server=_Server(self.client_key, self._stop, self.log))
        except (paramiko.SSHException, EOFError, OSError):
            return

    def stop(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        for t in self._transports:
            try:
                t.close()
            except Exception:
                pass
