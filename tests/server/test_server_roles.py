"""One permission per kind of act (issue 13, finding 10).

Reproduced on the code before the fix: the event WebSocket asked for ``execute`` while the REST
events route asks for ``read``; a ``read`` role could call discovery, which lists AWS resources
with the server's credentials; and on the local backend (which runs the job on the Jupyter
host) a ``hyperpod`` write permission could set LD_PRELOAD, PYTHON* or BROWSER and so run code
there without being allowed to run kernels.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import websocket
from jupyter_server_proc import JupyterServer

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _server(tmp_path_factory, authorizer: str) -> JupyterServer:
    root = tmp_path_factory.mktemp("root")
    shutil.copy(os.path.join(HERE, "scripts", "steps.py"), root / "steps.py")
    return JupyterServer(str(root), str(tmp_path_factory.mktemp("server"))).start(
        60.0, f"--ServerApp.authorizer_class=jupyter_server_proc.{authorizer}")


def _call(srv, method, path, body=None):
    return srv.call(method, path, body)


@pytest.fixture(scope="module")
def no_kernels(tmp_path_factory):
    srv = _server(tmp_path_factory, "NoKernels")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def read_only(tmp_path_factory, no_kernels):
    srv = _server(tmp_path_factory, "ReadOnly")
    yield srv
    srv.stop()


def _submit(srv, env=None):
    return _call(srv, "POST", "/hyperpod/jobs", {"spec": {"script": "steps.py", "cluster": "local", "env": env or {},
                                                          "args": ["--steps", "2"]}})


@pytest.mark.parametrize("env", [{"LD_PRELOAD": "/tmp/evil.so"}, {"PYTHONSTARTUP": "/tmp/evil.py"},
                                 {"BROWSER": "/tmp/evil"}, {"PATH": "/tmp/evil:/usr/bin"}])
def test_host_code_variables_need_the_right_to_run_kernels(no_kernels, env):
    before = len(_call(no_kernels, "GET", "/hyperpod/jobs")[1]["jobs"])
    status, body = _submit(no_kernels, env)
    assert status == 403 and body["error"]["type"] == "NotAllowed", body
    assert list(env)[0] in body["error"]["message"]
    assert len(_call(no_kernels, "GET", "/hyperpod/jobs")[1]["jobs"]) == before  # nothing submitted


def test_without_kernels_no_local_job_at_all(no_kernels):  # issue 24 #3 (tests/server/test_trust.py)
    status, body = _submit(no_kernels, {"OMP_NUM_THREADS": "1"})
    assert status == 403 and "'execute' on 'kernels'" in body["error"]["message"], body


def test_a_read_role_streams_events_as_it_reads_them(read_only, tmp_path_factory):
    root = tmp_path_factory.mktemp("root")  # jupyter-server's default authorizer: everything allowed
    shutil.copy(os.path.join(HERE, "scripts", "steps.py"), root / "steps.py")
    writer = JupyterServer(str(root), str(tmp_path_factory.mktemp("server"))).start()
    try:
        status, body = _submit(writer)  # a job in the shared store, made by a writer
    finally:
        writer.stop()
    assert status == 201, body
    job_id = body["job"]["job_id"]
    assert _call(read_only, "GET", f"/hyperpod/jobs/{job_id}/events")[0] == 200
    ws = websocket.create_connection(f"ws://127.0.0.1:{read_only.port}/hyperpod/jobs/{job_id}/stream",
                                     header=[f"Authorization: token {read_only.token}"], timeout=30)
    try:
        first = json.loads(ws.recv())
        assert first["type"] == "status" and first["job"]["job_id"] == job_id
    finally:
        ws.close()
    assert _submit(read_only)[0] == 403  # and may not write


def test_a_read_role_may_not_spend_the_servers_aws_credentials(read_only):
    status, body = _call(read_only, "GET", "/hyperpod/discover?region=us-east-1")
    assert status == 403, body
