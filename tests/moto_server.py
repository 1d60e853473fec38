"""Test helpers: a real moto S3 server on a free loopback port, and a TCP proxy in front of it that
can hold one request (to catch an upload in flight); AWS credentials for it, or none at all. Tests only.

``MotoServer`` runs the ``moto_server`` command (``pip install 'moto[server]'``) as a separate
process: ``start()``, ``kill()`` (SIGKILL, as a crashed endpoint), ``start()`` again on the same
port (moto keeps its state in memory, so a restarted server is empty: create the bucket again).

``HoldingProxy`` forwards bytes both ways between its own loopback port and the server; when the
client-to-server stream contains ``hold`` (e.g. the request line of a marker upload,
``b"/step-00000009/COMMITTED "``) it stops forwarding that connection, sets ``held`` and keeps the
sockets open until ``release()``, so the client blocks exactly there. It holds once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from ports import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def without_aws_credentials(monkeypatch, tmp_path) -> None:
    """Make boto3 find no AWS credentials at all: no key, profile, web-identity or container
    variables, empty shared credentials and config files, no EC2 instance metadata."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
              "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
              "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def require_moto_server() -> str:
    """Path of the ``moto_server`` command; fails the test (never skips) with an install hint."""
    path = shutil.which("moto_server")
    if not path:
        venv_bin = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "moto_server")
        if os.path.exists(venv_bin):
            return venv_bin
        pytest.fail("moto_server is not installed; pip install 'moto[server]' (or pip install -e '.[test]')",
                    pytrace=False)
    return path


def _wait_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")
            time.sleep(0.05)


class MotoServer:
    """A ``moto_server -H 127.0.0.1 -p PORT`` process.

    Args:
        log_path: file for the server's output.
        port: loopback port; default a free one.
    """

    def __init__(self, log_path: str, port: int | None = None):
        self.exe = require_moto_server()
        self.port = port or free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "MotoServer":
        """Start it (again, on the same port) and wait until it accepts connections."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = dict(os.environ, **CREDENTIALS)
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen([self.exe, "-H", "127.0.0.1", "-p", str(self.port)], stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        _wait_port(self.port, timeout_s, self.proc)
        return self

    def kill(self) -> None:
        """SIGKILL it (a crashed endpoint) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def __enter__(self) -> "MotoServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()


class HoldingProxy:
    """A loopback TCP proxy to ``127.0.0.1:target_port`` that can hold one request.

    Args:
        target_port: the server's port.
        hold: bytes whose appearance in a client's stream makes the proxy stop forwarding that
            connection (once); None forwards everything.
    """

    def __init__(self, target_port: int, hold: bytes | None = None):
        self.target_port = target_port
        self.hold = hold
        self.held = threading.Event()
        self._release = threading.Event()
        self._lsock = socket.socket()
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(64)
        self.port = self._lsock.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._lsock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), 5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        tail = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if upstream and self.hold is not None and not self.held.is_set():
                    window = tail + data
                    if self.hold in window:
                        self.held.set()
                        self._release.wait()
                        break
                    tail = window[-len(self.hold):]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def release(self) -> None:
        """Drop the held connection (the client sees it reset) and forward everything after."""
        self._release.set()

    def stop(self) -> None:
        self._stopped = True
        self._release.set()
        try:
            self._lsock.close()
        except OSError:
            pass
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass


@contextlib.contextmanager
def serving_bucket(log_dir, bucket: str):
    """A moto server on loopback (its log in ``log_dir``) holding the empty bucket ``bucket``;
    killed on exit. For module-scoped S3 fixtures."""
    srv = MotoServer(os.path.join(str(log_dir), "moto.log")).start()
    srv.create_bucket(bucket)
    try:
        yield srv
    finally:
        srv.kill()
