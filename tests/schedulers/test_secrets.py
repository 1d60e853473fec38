"""Secrets and private job files (issue 13, finding 5).

Reproduced on the code before the fix: a token passed with ``--env`` was written to
``spec.json`` (0644), ``job.sbatch`` (0755) and the SQLite store (0644) whatever the umask, and
on EKS into a ConfigMap and plain pod env. ``--secret-env KEY`` now takes the value from the
submitting process's environment and hands it to the ranks (local: the launcher's environment;
Slurm: sbatch's own environment through standard input; EKS: a Kubernetes Secret referenced by
``secretKeyRef``); the job's files and directories are 0600/0700.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import sys

import pytest

from hyperpod_lab import cli
from hyperpod_lab.errors import SpecError
from hyperpod_lab.events import EventReader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the helpers
from k8s_standin import K8sStandIn as FakeKube
from test_eks_render import sdk_validate
from test_eks_scheduler import HP, eks_profile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(HERE, "scripts", "secret_probe.py")
SECRET = "hf_" + "s3cr3t-Value-0123456789abcdef"


def _files_under(root: str):
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            yield os.path.join(d, name)


def _assert_nowhere(root: str, needle: bytes):
    hits = []
    for path in _files_under(root):
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                if needle in f.read():
                    hits.append(path)
    assert not hits, f"the secret was written to {hits}"


def _assert_private(root: str):
    loose = [(p, oct(stat.S_IMODE(os.lstat(p).st_mode))) for p in [root, *_files_under(root)]
             if not os.path.islink(p) and stat.S_IMODE(os.lstat(p).st_mode) & 0o077]
    assert not loose, f"readable by others: {loose[:10]}"


def _probe_data(rec) -> dict:
    steps = [e.data for e in EventReader(rec.job_dir).poll() if e.kind == "step"]
    assert steps, "the probe reported no step"
    return steps[0]


def _submit(client, cluster: str, extra: list[str] = ()) -> str:
    return cli.run(["submit", PROBE, "--cluster", cluster, "--name", "secret-probe", "--secret-env", "HF_TOKEN",
                    "--env", "VISIBLE=yes", *extra, "--", "HF_TOKEN", "VISIBLE"], client=client)


def test_a_secret_reaches_the_local_ranks_and_no_file(client, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    job_id = _submit(client, "local")
    rec = client.wait(job_id, timeout_s=120)
    assert rec.status == "completed", client.logs(job_id)[-2000:]
    data = _probe_data(rec)
    assert data["has_HF_TOKEN"] and data["sha256_HF_TOKEN"] == hashlib.sha256(SECRET.encode()).hexdigest()
    assert data["has_VISIBLE"]
    _assert_nowhere(rec.job_dir, SECRET.encode())
    _assert_nowhere(client.store.root, SECRET.encode())
    assert client.get(job_id).spec["secret_env"] == ["HF_TOKEN"]
    _assert_private(rec.job_dir)
    _assert_private(client.store.root)


def test_a_missing_secret_is_bad_input_and_nothing_is_staged(client, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(SpecError, match="HF_TOKEN is not set"):
        _submit(client, "local")
    assert [r for r in client.store.list() if r.name == "secret-probe"] == []


def test_secret_names_are_validated():
    from hyperpod_lab.spec import JobSpec

    with pytest.raises(SpecError, match="secret_env"):
        JobSpec.from_dict({"script": "x.py", "secret_env": ["BAD NAME"]})
    with pytest.raises(SpecError, match="also in env"):
        JobSpec.from_dict({"script": "x.py", "secret_env": ["A"], "env": {"A": "1"}})


def test_a_secret_reaches_the_slurm_ranks_through_sbatch_not_the_files(dev_cluster, client, monkeypatch):
    """Dev cluster over SSH: the value travels on sbatch's standard input (envexec), never in
    the batch script, spec.json, the store or the job's logs."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    job_id = _submit(client, "local-slurm", ["--nodes", "1"])
    rec = client.wait(job_id, timeout_s=180)
    assert rec.status == "completed", client.logs(job_id)[-2000:]
    data = _probe_data(rec)
    assert data["sha256_HF_TOKEN"] == hashlib.sha256(SECRET.encode()).hexdigest()
    _assert_nowhere(rec.job_dir, SECRET.encode())
    _assert_nowhere(client.store.root, SECRET.encode())
    _assert_private(rec.job_dir)


def test_a_secret_goes_to_a_kubernetes_secret_on_eks(tmp_path, client, monkeypatch):
    """EKS (against the stand-in API server of tests/k8s_standin.py, scripted operator): a Secret holds the value, the pods
    reference it; the CR, the ConfigMap and --dry-run carry only the name."""
    fake = FakeKube()
    try:
        monkeypatch.setenv("HF_TOKEN", SECRET)
        eks_profile(fake, tmp_path)
        job_id = _submit(client, "eks-fake")
        rec = client.get(job_id)
        name = rec.native_id.split("/")[1]
        secret = fake.find("api/v1/secrets", "ml", name + "-secrets")
        assert secret and base64.b64decode(secret["data"]["HF_TOKEN"]).decode() == SECRET
        job = fake.find(HP, "ml", name)
        env = job["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": name + "-secrets", "key": "HF_TOKEN"}}} in env
        assert SECRET not in str(job) and SECRET not in str(fake.find("api/v1/configmaps", "ml", name + "-job"))
        assert sdk_validate(jobs=[job["spec"]]) == []
        from hyperpod_lab.spec import JobSpec

        text = client.render(JobSpec.from_dict(rec.spec))
        assert "HF_TOKEN" in text and SECRET not in text
        client.cancel(job_id)
        assert fake.find("api/v1/secrets", "ml", name + "-secrets") is None
    finally:
        fake.close()
