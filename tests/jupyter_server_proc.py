"""A real jupyter-server in a subprocess, for the server-extension tests (test helper, not product code).

Started with ``allow_unauthenticated_access=False``, a token, only the hyperpod_lab server
extension enabled (so any auth warning in the log is about our routes), and the test session's
HYPERPOD_LAB_CONFIG / HYPERPOD_LAB_DATA_DIR inherited from tests/conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from jupyter_server.auth.authorizer import Authorizer
from ports import free_port

AUTH_WARNING = re.compile(r"JupyterServerAuthWarning|without @allow_unauthenticated|"
                          r"Attempting to authorize request without authentication")


class JupyterServer:
    """One server process; ``start`` / ``kill`` / ``stop`` may be repeated on the same port."""

    def __init__(self, root_dir: str, work_dir: str, token: str = "hyperpod-test-token"):
        self.root_dir, self.work_dir, self.token = root_dir, work_dir, token
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.logs: list[str] = []
        self.config = os.path.join(work_dir, "jupyter_server_config.json")
        exts = {"jupyterlab": False, "jupyter_lsp": False, "jupyter_server_terminals": False,
                "notebook_shim": False, "hyperpod_lab": True}
        with open(self.config, "w") as f:
            json.dump({"ServerApp": {"jpserver_extensions": exts}}, f)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0, *extra_args: str) -> "JupyterServer":
        log_path = os.path.join(self.work_dir, f"server-{len(self.logs)}.log")
        self.logs.append(log_path)
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=os.path.join(self.work_dir, "runtime"), PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--config={self.config}", "--no-browser", "--allow-root",
             "--ip=127.0.0.1", f"--port={self.port}", "--port-retries=0",
             f"--IdentityProvider.token={self.token}", "--ServerApp.allow_unauthenticated_access=False",
             f"--ServerApp.root_dir={self.root_dir}", *extra_args],
            stdout=open(log_path, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter server exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                if self.call("GET", "/api/status")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"jupyter server not up within {timeout_s} s:\n{self.log_text()[-3000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def log_text(self) -> str:
        out = []
        for p in self.logs:
            with open(p, errors="replace") as f:
                out.append(f.read())
        return "\n".join(out)

    def auth_warnings(self) -> list[str]:
        return [ln for ln in self.log_text().splitlines() if AUTH_WARNING.search(ln)]

    def call(self, method: str, path: str, body=None, token: bool = True, raw: bytes | None = None,
             timeout_s: float = 60.0) -> tuple[int, object]:
        """One HTTP request; returns (status, decoded JSON body or text)."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        if data is None and method in ("POST", "PUT", "PATCH"):
            data = b""
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if token:
            req.add_header("Authorization", f"token {self.token}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def ws(self, path: str, token: bool = True, timeout_s: float = 60.0):
        """A websocket-client connection to ``path`` (raises WebSocketBadStatusException on refusal)."""
        import websocket

        headers = [f"Authorization: token {self.token}"] if token else []
        return websocket.create_connection("ws://127.0.0.1:%d%s" % (self.port, path), header=headers,
                                           timeout=timeout_s)



class DenyHyperPod(Authorizer):
    """An Authorizer (``--ServerApp.authorizer_class=jupyter_server_proc.DenyHyperPod``) that allows
    everything except the ``hyperpod`` resource: shows that every route asks the authorizer."""

    def is_authorized(self, handler, user, action, resource):
        return resource != "hyperpod"


class ReadOnly(Authorizer):
    """``--ServerApp.authorizer_class=jupyter_server_proc.ReadOnly``: every resource, 'read' only."""

    def is_authorized(self, handler, user, action, resource):
        return action == "read"


class NoKernels(Authorizer):
    """``--ServerApp.authorizer_class=jupyter_server_proc.NoKernels``: everything but running kernels."""

    def is_authorized(self, handler, user, action, resource):
        return resource != "kernels"
