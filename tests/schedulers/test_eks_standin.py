"""EKS jobs whose pods RUN, on the Kubernetes stand-in of tests/k8s_standin.py (no real API server,
kubelet or operator can be installed here; the stand-in executes each pod the operator stand-in
creates from our rendered HyperPodPyTorchJob as local processes in their own network, PID and mount
namespaces, with the FSx claim bind-mounted at /fsx). Our backend talks to it through the real
``kubernetes`` client; what ran in the pods is our runtime and tests/scripts/standin_ddp.py under
torchrun (started by the stand-in ``hyperpodrun``). Needs root (namespaces), as CI runs."""

from __future__ import annotations

import hashlib
import os
import sys
import time

import pytest

from hyperpod_lab.events import EventReader
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit.clusters import ClusterProfile, save_profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the helpers
from k8s_standin import start_standin

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "scripts", "standin_ddp.py")
HP = "apis/sagemaker.amazonaws.com/v1/hyperpodpytorchjobs"
SECRET = "s3cr3t-standin-value"


@pytest.fixture
def standin(tmp_path):
    shared = tmp_path / "fsx"
    shared.mkdir()
    k = start_standin(str(shared))
    yield k
    k.stop()


def profile(k, tmp_path, name="eks-standin") -> ClusterProfile:
    prof = ClusterProfile(name=name, orchestrator="eks", kubeconfig=k.kubeconfig(str(tmp_path / "kubeconfig")),
                          kube_context="fake", namespace="ml", image="img:1", pvc="fsx-claim",
                          shared_root=k.kubelet.shared_root)
    save_profile(prof)
    return prof


def wait_for(what, fn, timeout=60.0, every=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def job_status(k, name):
    return (k.find(HP, "ml", name) or {}).get("status") or {}


def conditions(k, name):
    return [c["type"] for c in job_status(k, name).get("conditions", [])]


def events(rec):
    return [e for e in EventReader(rec.job_dir).poll()]


def test_hyperpod_job_runs_to_completed_with_a_secret(standin, tmp_path, client, monkeypatch):
    """A rendered restart-mode HyperPodPyTorchJob of 2 replicas completes: both pods ran torchrun
    with the operator's rendezvous, our runtime wrote its events to the shared dir (seen at /fsx
    in the pods), and the Secret's value reached the ranks without being in any manifest."""
    profile(standin, tmp_path)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    spec = JobSpec(script=SCRIPT, name="standin", cluster="eks-standin", nodes=2, procs_per_node=1,
                   args=["--steps", "4", "--sleep", "0.05", "--secret", "HF_TOKEN", "--secret", "PRICE"], secret_env=["HF_TOKEN"],
                   env={"PRICE": "$5"})
    rec = client.submit(spec)
    name = rec.native_id.split("/")[1]
    job = standin.find(HP, "ml", name)
    assert SECRET not in str(job) and SECRET not in str(standin.find("api/v1/configmaps", "ml", name + "-job"))
    wait_for("Completed", lambda: "Completed" in conditions(standin, name), timeout=90)
    st = job_status(standin, name)
    assert st["restartCount"] == 0 and conditions(standin, name)[-1] == "Completed"
    rec = client.get(rec.job_id)
    evs = events(rec)
    started = [e.data for e in evs if e.kind == "started" and e.writer == "rank-0"]
    assert started and started[0]["world_size"] == 2, [(e.writer, e.kind, e.data) for e in evs]
    first = [e.data for e in evs if e.kind == "step" and e.writer == "rank-0"]
    assert first and first[0]["sha256_HF_TOKEN"] == hashlib.sha256(SECRET.encode()).hexdigest()
    assert first[0]["sha256_PRICE"] == hashlib.sha256(b"$5").hexdigest()  # rendered "$$5", expanded by the kubelet
    assert [e.data["status"] for e in evs if e.kind == "finished" and e.writer == "rank-0"] == ["succeeded"]
    # each pod's torchrun wrote its rank's output below the job dir on the FSx claim (--tee=3 --log-dir)
    outs = {}
    for root, _, files in os.walk(os.path.join(rec.job_dir, "logs")):
        for f in files:
            if f == "stdout.log":
                with open(os.path.join(root, f)) as fh:
                    outs[root] = fh.read()
    text = "\n".join(outs.values())
    for r in (0, 1):  # hostname = the pod's name, as the kubelet sets it
        assert f"rank {r}/2 host {name}-workers-{r} start 0" in text, outs
    assert "step 3 loss" in text
