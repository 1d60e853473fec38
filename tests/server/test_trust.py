"""Who may run code on the Jupyter host and spend its secrets over REST (issue 24, findings 3 and 4).

Reproduced on the code before the fix, with a real jupyter-server (tests/jupyter_server_proc.py)
whose authorizer grants ``read`` and ``write`` on everything but ``execute`` on nothing
(:class:`NoExecute`, defined here and loaded by the server from this module):

* ``POST hyperpod/jobs`` on the ``local`` cluster ran the caller's script as the server's user,
  with the server's whole environment: ``write`` on ``hyperpod`` was enough to run code where
  only ``execute`` on ``kernels`` should be;
* ``secret_env: ["AWS_SECRET_ACCESS_KEY"]`` copied the server's own credentials into any job
  (local, Slurm, EKS), and a local job saw every variable of the server even without it;
* ``POST hyperpod/discover`` (calls AWS with the server's credentials, rewrites clusters.toml)
  needed only ``write``, while its GET needs ``execute``.

Now: a local submission needs ``execute`` on ``kernels``; ``secret_env`` over REST takes only the
names of ``HyperPodLab.secret_env_allowlist`` (default none); a local job gets a minimal
environment; discovery POST needs ``execute``. The AWS side is moto (a real SageMaker API server
on loopback, tests/moto_server.py); the Slurm profile points at a closed port (a refused
submission never contacts it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

import pytest
from jupyter_server.auth.authorizer import Authorizer

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
PROBE = os.path.join(TESTS, "scripts", "secret_probe.py")
ALLOWED_SECRET = "allowed-" + "0123456789abcdef"
SERVER_ONLY = "server-only-" + "fedcba9876543210"
IG = [{"InstanceGroupName": "workers", "InstanceType": "ml.c5.xlarge", "InstanceCount": 1, "ThreadsPerCore": 1,
       "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle-bkt/lc/", "OnCreate": "on_create.sh"},
       "ExecutionRole": "arn:aws:iam::123456789012:role/SageMakerRole"}]
REGION = "eu-west-3"  # a region of its own in moto


class NoExecute(Authorizer):
    """``--ServerApp.authorizer_class=test_trust.NoExecute``: ``read`` and ``write`` on every
    resource, ``execute`` on none (no kernels, no discovery)."""

    def is_authorized(self, handler, user, action, resource):
        return action != "execute"


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    import boto3
    from moto_server import MotoServer

    srv = MotoServer(str(tmp_path_factory.mktemp("moto") / "moto.log")).start()
    sm = boto3.client("sagemaker", endpoint_url=srv.url, region_name=REGION, aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    sm.create_cluster(ClusterName="trust-disc", InstanceGroups=IG)
    yield srv
    srv.kill()


def _start(tmp_path_factory, moto, authorizer: str | None, allowlist: list[str] | None):
    """A server with its own clusters.toml (a Slurm profile at a closed port), the SageMaker API
    of ``moto``, and secrets in its environment that no job may see unless allowed."""
    from jupyter_server_proc import JupyterServer
    from moto_server import CREDENTIALS
    from ports import free_port

    root = tmp_path_factory.mktemp("root")
    shutil.copy(PROBE, root / "probe.py")
    work = tmp_path_factory.mktemp("server")
    config = work / "clusters.toml"
    config.write_text(f'[clusters.trust-slurm]\norchestrator = "slurm"\nhost = "127.0.0.1"\nport = {free_port()}\n'
                      'user = "nobody"\nshared_root = "/nonexistent/fsx"\n')
    srv = JupyterServer(str(root), str(work))
    if allowlist is not None:
        with open(srv.config) as f:
            cfg = json.load(f)
        cfg["HyperPodLab"] = {"secret_env_allowlist": allowlist}
        with open(srv.config, "w") as f:
            json.dump(cfg, f)
    args = [f"--ServerApp.authorizer_class=test_trust.{authorizer}"] if authorizer else []
    with pytest.MonkeyPatch.context() as mp:  # the server's environment (it inherits os.environ)
        for k, v in CREDENTIALS.items():
            mp.setenv(k, v)
        mp.setenv("AWS_ENDPOINT_URL_SAGEMAKER", moto.url)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp.setenv("HYPERPOD_LAB_CONFIG", str(config))
        mp.setenv("HYPERPOD_TRUST_OK", ALLOWED_SECRET)
        mp.setenv("HYPERPOD_TRUST_SERVER_ONLY", SERVER_ONLY)
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
        srv.start(60.0, *args)
    srv.clusters_toml = str(config)
    return srv


@pytest.fixture(scope="module")
def denied(tmp_path_factory, moto):
    srv = _start(tmp_path_factory, moto, "NoExecute", None)
    yield srv
    srv.stop()
    assert not srv.auth_warnings(), srv.auth_warnings()


@pytest.fixture(scope="module")
def allowed(tmp_path_factory, moto):
    srv = _start(tmp_path_factory, moto, None, ["HYPERPOD_TRUST_OK"])
    yield srv
    srv.stop()
    assert not srv.auth_warnings(), srv.auth_warnings()


def _submit(srv, cluster="local", secret_env=(), args=()):
    return srv.call("POST", "/hyperpod/jobs", {"spec": {"script": "probe.py", "cluster": cluster, "nodes": 1,
                                                        "procs_per_node": 1, "secret_env": list(secret_env),
                                                        "args": list(args)}})


def _job_ids(srv):
    status, body = srv.call("GET", "/hyperpod/jobs")
    assert status == 200, body
    return {j["job_id"] for j in body["jobs"]}


# ---- finding 3: a local job is code on the Jupyter host ---------------------------------------
def test_a_local_submission_needs_the_right_to_run_kernels(denied):
    before = _job_ids(denied)
    status, body = _submit(denied)
    assert status == 403 and body["error"]["type"] == "NotAllowed", body
    msg = body["error"]["message"]
    assert "'execute' on 'kernels'" in msg and "Jupyter host" in msg and "Slurm or EKS" in msg, msg
    assert _job_ids(denied) == before  # nothing submitted


def test_a_local_submission_is_fine_for_whoever_may_run_kernels(allowed):
    status, body = _submit(allowed, args=["HYPERPOD_TRUST_OK"])
    assert status == 201, body


def test_secret_env_over_rest_is_refused_by_default(denied):
    """No allowlist set: no name at all, on any backend (a Slurm cluster here: refused before any
    contact, so the closed port is never tried)."""
    status, body = _submit(denied, cluster="trust-slurm", secret_env=["HYPERPOD_TRUST_OK"])
    assert status == 403 and body["error"]["type"] == "NotAllowed", body
    msg = body["error"]["message"]
    assert "HYPERPOD_TRUST_OK" in msg and "HyperPodLab.secret_env_allowlist" in msg, msg


@pytest.mark.parametrize("cluster", ["local", "trust-slurm"])
def test_the_servers_own_credentials_are_not_for_a_rest_caller(allowed, cluster):
    before = _job_ids(allowed)
    status, body = _submit(allowed, cluster=cluster, secret_env=["HYPERPOD_TRUST_OK", "AWS_SECRET_ACCESS_KEY"])
    assert status == 403 and body["error"]["type"] == "NotAllowed", body
    msg = body["error"]["message"]
    assert "AWS_SECRET_ACCESS_KEY" in msg and "HYPERPOD_TRUST_OK" not in msg, msg
    assert "c.HyperPodLab.secret_env_allowlist" in msg, msg
    assert _job_ids(allowed) == before


def _wait(srv, job_id, timeout_s=180.0):
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = srv.call("GET", f"/hyperpod/jobs/{job_id}")
        assert status == 200, body
        if body["job"]["status"] in ("completed", "failed", "cancelled"):
            return body["job"]
        assert time.monotonic() < deadline, body
        time.sleep(0.5)


def test_a_local_job_gets_an_allowed_secret_and_nothing_else_of_the_server(allowed):
    """A real local job (torchrun, the runtime, CPU) reports which variables it sees: the allowed
    secret, PATH and HOME; not the server's AWS key nor its other variables."""
    names = ["HYPERPOD_TRUST_OK", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "HYPERPOD_TRUST_SERVER_ONLY",
             "JUPYTER_RUNTIME_DIR", "PATH", "HOME"]
    status, body = _submit(allowed, secret_env=["HYPERPOD_TRUST_OK"], args=names)
    assert status == 201, body
    job_id = body["job"]["job_id"]
    job = _wait(allowed, job_id)
    logs = allowed.call("GET", f"/hyperpod/jobs/{job_id}/logs")[1]
    assert job["status"] == "completed", logs
    status, events = allowed.call("GET", f"/hyperpod/jobs/{job_id}/events")
    assert status == 200, events
    (data,) = [e["data"] for e in events["events"] if e["kind"] == "step"]
    assert data["has_HYPERPOD_TRUST_OK"], data
    assert data["sha256_HYPERPOD_TRUST_OK"] == hashlib.sha256(ALLOWED_SECRET.encode()).hexdigest()
    assert data["has_PATH"] and data["has_HOME"], data
    seen = [n for n in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "HYPERPOD_TRUST_SERVER_ONLY",
                        "JUPYTER_RUNTIME_DIR") if data[f"has_{n}"]]
    assert seen == [], f"the local job saw the server's {seen}"


def test_the_local_environment_is_minimal_in_process_too(tmp_path, monkeypatch):
    """The scheduler itself (as the magics and CLI use it, in the kernel's process): the job's
    environment is the minimal one plus the spec's env and the resolved secrets."""
    from hyperpod_lab.schedulers import for_profile
    from hyperpod_lab.spec import JobSpec
    from hyperpod_lab.submit.clusters import get_profile

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "kernel-secret")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("HYPERPOD_LAB_STEP_EVENT_INTERVAL_S", "0.5")
    spec = JobSpec.from_dict({"script": PROBE, "cluster": "local", "env": {"VISIBLE": "yes"},
                              "secret_env": ["HF_TOKEN"]})
    env = for_profile(get_profile("local"))._env(spec, "trust-env-1", {"HF_TOKEN": "hf_x"})
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["PATH"] == os.environ["PATH"] and env["LC_ALL"] == "C.UTF-8"
    assert env["HYPERPOD_LAB_STEP_EVENT_INTERVAL_S"] == "0.5" and env["HYPERPOD_LAB_JOB_ID"] == "trust-env-1"
    assert env["VISIBLE"] == "yes" and env["HF_TOKEN"] == "hf_x"


# ---- finding 4: discovery spends AWS credentials and rewrites clusters.toml ------------------
def test_discovery_post_needs_execute(denied):
    with open(denied.clusters_toml) as f:
        before = f.read()
    status, body = denied.call("POST", "/hyperpod/discover", {"region": REGION, "overwrite": True})
    assert status == 403, body
    with open(denied.clusters_toml) as f:
        assert f.read() == before  # no profile written
    assert denied.call("GET", f"/hyperpod/discover?region={REGION}")[0] == 403  # as before


def test_discovery_post_works_with_execute(allowed):
    status, body = allowed.call("POST", "/hyperpod/discover", {"region": REGION})
    assert status == 200, body
    assert [w["name"] for w in body["written"]] == ["trust-disc"], body
    with open(allowed.clusters_toml) as f:
        assert "trust-disc" in f.read()


@pytest.mark.parametrize("body, field", [({"region": ["eu-west-3"]}, "region"), ({"region": {"a": 1}}, "region"),
                                         ({"region": REGION, "profile": 5}, "profile"),
                                         ({"region": REGION, "overwrite": "no"}, "overwrite")])
def test_discovery_post_with_fields_of_the_wrong_type_is_400(allowed, body, field):
    """User JSON of the wrong shape is bad input (issue 24 #12's class): 400 naming the field."""
    status, out = allowed.call("POST", "/hyperpod/discover", body)
    assert status == 400 and out["error"]["field"] == field, (status, out)
