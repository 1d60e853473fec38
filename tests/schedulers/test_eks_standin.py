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


def wait_for(what, fn, timeout=60.0, every=0.1, k=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(every)
    logs = "".join(f"\n--- {p['metadata']['name']} ---\n" + pod_log(k, p["metadata"]["name"]).decode()[-3000:]
                   for p in k.pods()) if k else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{logs}")


def job_status(k, name):
    return (k.find(HP, "ml", name) or {}).get("status") or {}


def conditions(k, name):
    return [c["type"] for c in job_status(k, name).get("conditions", [])]


def events(rec):
    return [e for e in EventReader(rec.job_dir).poll()]


def pod_log(k, pod) -> bytes:
    """The kubelet stand-in's file of the pod's current container (b"" before it starts)."""
    try:
        path = k.log_path("ml", pod)
    except KeyError:
        return b""
    with open(path, "rb") as f:
        return f.read()


def test_hyperpod_job_runs_survives_a_deleted_pod_and_a_lost_node(standin, tmp_path, client, monkeypatch):
    """A rendered restart-mode HyperPodPyTorchJob of 2 replicas runs on the stand-in: both pods run
    torchrun with the operator's rendezvous; the Secret's value (in no manifest) and the env value
    ``$5`` (rendered ``$$5``) reach the ranks; logs by range (limitBytes/tailLines requests only,
    the right bytes); ``inject-fault --kind kill`` deletes pod 1, whose processes die, and the
    operator replaces it (restartCount 1, PLR, faulty pod listed, our backend's fault.detected);
    pod 0's node goes NotReady: pod 0 is evicted (Failed, DisruptionTarget) and replaced on another
    node (restartCount 2); the ranks resume from their checkpoint and the job completes, our
    runtime's events in the shared dir (seen at /fsx in the pods)."""
    profile(standin, tmp_path)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    spec = JobSpec(script=SCRIPT, name="standin", cluster="eks-standin", nodes=2, procs_per_node=1,
                   args=["--steps", "6", "--sleep", "0.1", "--every", "2", "--stop-file", "stop-now",
                         "--secret", "HF_TOKEN", "--secret", "PRICE"], secret_env=["HF_TOKEN"], env={"PRICE": "$5"})
    rec = client.submit(spec)
    name = rec.native_id.split("/")[1]
    p0, p1 = f"{name}-workers-0", f"{name}-workers-1"
    job = standin.find(HP, "ml", name)
    assert SECRET not in str(job) and SECRET not in str(standin.find("api/v1/configmaps", "ml", name + "-job"))
    wait_for("step 2 in pod 0's log", lambda: b"step 2 loss" in pod_log(standin, p0), timeout=120)
    sched = client.scheduler("eks-standin")
    rec = client.get(rec.job_id)
    assert f"rank 0/2 host {p0} start 0".encode() in pod_log(standin, p0)  # hostname = pod name (kubelet)

    # logs by range: bytes 0-64 and 10-30 of rank 0's log, a 100-byte tail of rank 1's, every pod's
    mark = len(standin.requests)
    head = sched.log_range(rec, 0, 0, 64)
    assert head.raw == pod_log(standin, p0)[:64] and (head.offset, head.end, head.size) == (0, 64, None)
    mid = sched.log_range(rec, 0, 10, 20)
    assert mid.raw == pod_log(standin, p0)[10:30] and mid.offset == 10
    tail = sched.log_range(rec, 1, None, 100)
    assert len(tail.raw) == 100 and tail.raw in pod_log(standin, p1)
    every = sched.log_range(rec, None, 0, 1 << 20)  # both logs are shorter: the whole text, its size known
    assert every.size == len(every.raw) and every.raw.startswith(f"==> pod {p0} <==\n".encode())
    assert f"\n==> pod {p1} <==\n".encode() in every.raw
    logs = [r["query"] for r in standin.requests[mark:] if r["path"].endswith("/log")]
    assert logs and all(("limitBytes" in q) != ("tailLines" in q) for q in logs), logs

    # kill: pod 1 deleted with grace period 0; its container processes die; a new pod 1 runs
    pid, uid = standin.kubelet.runs[("ml", p1)].container_pid(), standin.find("api/v1/pods", "ml", p1)["metadata"]["uid"]
    assert pid
    assert client.inject_fault(rec.job_id, 1, kind="kill")["pod"] == p1
    wait_for("restartCount 1", lambda: job_status(standin, name).get("restartCount") == 1)
    client.status(rec.job_id)  # our backend records the operator's fault (it diffs what it polls)
    wait_for("pod 1's processes to end", lambda: not os.path.exists(f"/proc/{pid}"), timeout=20)
    fault = job_status(standin, name)["latestFaultyPodInstanceList"]
    assert fault["faultyPodList"] == [p1] and fault["restartType"] == "PLR" and fault["faultyRankList"] == ["1"]
    wait_for("a new pod 1", lambda: (standin.find("api/v1/pods", "ml", p1) or {}).get("metadata", {}).get("uid")
             not in (None, uid))
    wait_for("Running again", lambda: conditions(standin, name)[-1] == "Running", timeout=60)

    # node lost: pod 0's node goes NotReady; pod 0 is evicted and replaced on another node
    node = standin.find("api/v1/pods", "ml", p0)["spec"]["nodeName"]
    assert standin.node_not_ready(node) == [p0]
    wait_for("restartCount 2", lambda: job_status(standin, name).get("restartCount") == 2)
    client.status(rec.job_id)
    evicted = [o for _, _, key, o in list(standin._log) if key == ("api/v1/pods", "ml", p0)
               and o.get("status", {}).get("phase") == "Failed"]
    assert evicted and any(c["type"] == "DisruptionTarget" and c["reason"] == "DeletionByTaintManager"
                           for c in evicted[-1]["status"]["conditions"])
    assert job_status(standin, name)["latestFaultyPodInstanceList"]["faultyPodList"] == [p0]
    wait_for("pod 0 on another node", lambda: (standin.find("api/v1/pods", "ml", p0) or {}).get(
        "spec", {}).get("nodeName") not in (None, node))
    wait_for("Running again", lambda: conditions(standin, name)[-1] == "Running", timeout=60)
    wait_for("a step after the restart", lambda: b"step " in pod_log(standin, p0), timeout=120)

    open(os.path.join(rec.job_dir, "stop-now"), "w").close()  # the ranks finish (the job dir is on the claim)
    wait_for("Completed", lambda: "Completed" in conditions(standin, name), timeout=120)
    assert client.status(rec.job_id).status == "completed"
    evs = events(client.get(rec.job_id))
    assert [e.data["pods"] for e in evs if e.kind == "fault.detected" and e.writer == "operator"] == [[p1], [p0]]
    steps = [e.data for e in evs if e.kind == "step" and e.writer == "rank-0"]
    assert steps[0]["sha256_HF_TOKEN"] == hashlib.sha256(SECRET.encode()).hexdigest()
    assert steps[0]["sha256_PRICE"] == hashlib.sha256(b"$5").hexdigest()  # rendered "$$5", expanded by the kubelet
    restored = [e.data for e in evs if e.kind == "checkpoint.restored" and e.writer == "rank-0"]
    assert restored and restored[-1]["step"] > 0  # resumed from the persistent checkpoint after the restarts
    assert [e.data["status"] for e in evs if e.kind == "finished" and e.writer == "rank-0"][-1] == "succeeded"
    # each pod's torchrun wrote its ranks' output below the job dir on the claim (--tee=3 --log-dir)
    outs = []
    for root, _, files in os.walk(os.path.join(rec.job_dir, "logs")):
        outs += [open(os.path.join(root, f)).read() for f in files if f == "stdout.log"]
    assert any(f"rank 1/2 host {p1} start 0" in o for o in outs), outs
