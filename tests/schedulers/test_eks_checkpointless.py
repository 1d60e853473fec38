"""A checkpointless job rendered for EKS, RUN on the Kubernetes stand-in (tests/k8s_standin.py: no
real API server, kubelet or operator can be installed here; the stand-in executes every pod its
Kubeflow training-operator stand-in creates from our rendered ``PyTorchJob`` as local processes in
their own network, PID, UTS and mount namespaces, the FSx claim bind-mounted at /fsx).

What ran in the pods is what the manifest says: the Lighthouse pod (the ``Master``) runs
``python -m hyperpod_lab.node.lighthouse`` on its pod address, each ``Worker`` pod is one replica
group running our launch agent on ``examples/train_lm.py``, unchanged, reaching the Lighthouse by
the Master's name. One shared job (CI budget) shows, in order:

1. a group's pod is deleted mid-run (``inject-fault --kind node``: the EKS backend deletes the
   rank's pod); the operator stand-in recreates it, its rank heals from the live group (tier
   ``replica``; nothing is ever restored from storage), and the surviving group never restarts
   (same pod, container and rank process);
2. a hang injected in a pod (``inject-fault --kind hang``: the EKS backend's request file on the
   shared volume; the rank stops itself) is caught by our agent's watchdog within its timeout;
3. the job completes (the Lighthouse pod exits once training finished, so the PyTorchJob succeeds)
   and the same events are served by a real jupyter-server's REST events route, the sidebar's
   source.

Needs root (namespaces), as CI runs.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from hyperpod_lab.events import EventReader
from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.spec import ElasticPolicy, JobSpec, ResiliencyPolicy
from hyperpod_lab.submit.clusters import ClusterProfile, save_profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the helpers
import k8s_standin
from k8s_standin import standin_in

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")
KF = "apis/kubeflow.org/v1/pytorchjobs"
HANG_TIMEOUT_S = 5.0
STEPS = 150


@pytest.fixture
def standin(tmp_path):
    with standin_in(tmp_path) as k:
        yield k


def wait_for(what, fn, timeout=120.0, every=0.1, diagnose=lambda why: why):
    return k8s_standin.wait_for(what, fn, timeout, every, diagnose)


def test_checkpointless_job_on_the_eks_standin(standin, tmp_path, server):
    from hyperpod_lab.submit.client import Client

    client = Client()  # the job store of the session's data dir, which the jupyter-server reads too
    save_profile(ClusterProfile(name="eks-ft", orchestrator="eks", operator="kubeflow",
                                kubeconfig=standin.kubeconfig(str(tmp_path / "kubeconfig")), kube_context="fake",
                                namespace="ml", image="img:1", pvc="fsx-claim", shared_root=standin.kubelet.shared_root))
    spec = JobSpec(script=EXAMPLE, name="eks-ft", cluster="eks-ft", nodes=2, procs_per_node=1,
                   resiliency=ResiliencyPolicy(recovery="checkpointless", hang_timeout_s=HANG_TIMEOUT_S),
                   elastic=ElasticPolicy(min_nodes=1, max_nodes=2, global_batch_size=8),
                   env={"HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.001", "RUST_LOG": "warn"},
                   args=["--steps", str(STEPS), "--step-sleep", "0.2", "--d-model", "32", "--n-layers", "1",
                         "--n-heads", "2", "--seq-len", "32", "--batch-size", "4"])
    rec = client.submit(spec)
    ns, name = rec.native_id.split("/")
    reader, events = EventReader(rec.job_dir), []

    def kinds(kind, after=0.0, **match):
        events.extend(reader.poll())
        return [e for e in events if e.kind == kind and e.time > after
                and all(e.data.get(k) == v for k, v in match.items())]

    def pod(pod_name):
        return next((p for p in standin.pods(ns) if p["metadata"]["name"] == pod_name), None)

    def step():  # the job's committed steps (rank 0 reports them)
        return max([e.data["step"] for e in kinds("step")] or [-1])

    def diagnose(why):  # the pods' logs and the last events, for a failure message
        logs = {}
        for p in standin.pods(ns):
            try:
                with open(standin.log_path(ns, p["metadata"]["name"]), errors="replace") as f:
                    logs[p["metadata"]["name"]] = f.read()[-1500:]
            except OSError as e:
                logs[p["metadata"]["name"]] = str(e)
        last = [(round(e.time, 1), e.writer, e.kind, str(e.data)[:150]) for e in events[-25:]]
        return f"{why}\n" + "\n".join(f"==> {n} <==\n{t}" for n, t in logs.items()) + f"\nlast events: {last}"

    def wait(what, fn, timeout=120.0):
        return wait_for(what, fn, timeout, diagnose=diagnose)

    # the pods the operator made from the manifest: the Lighthouse (Master) and one per replica group
    assert sorted(p["metadata"]["name"] for p in standin.pods(ns)) == [f"{name}-master-0", f"{name}-worker-0",
                                                                       f"{name}-worker-1"]
    wait("step 5", lambda: step() >= 5, timeout=240)
    paths = JobPaths(rec.job_dir, join=os.path.join)
    with open(paths.lighthouse) as f:  # published by the Lighthouse pod, on its own pod address
        assert json.load(f)["address"].startswith("http://10.244.")

    # 1. group 1's pod is deleted: the operator recreates it, it heals from group 0; group 0 goes on
    survivor = f"{name}-worker-0"
    before = pod(survivor)
    container0 = standin.kubelet.runs[(ns, survivor)].container_pid()
    with open(paths.rank_file(0)) as f:
        rank0 = json.load(f)
    lost_uid = pod(f"{name}-worker-1")["metadata"]["uid"]
    t1 = time.time()
    info = client.inject_fault(rec.job_id, 1, kind="node")
    assert info["pod"] == f"{name}-worker-1", info
    healed = wait("rank 1 healing from group 0",
                  lambda: kinds("checkpoint.restored", after=t1, tier="replica", replica_group=1), timeout=180)
    assert healed[0].data["step"] > 0
    after = pod(survivor)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    assert standin.kubelet.runs[(ns, survivor)].container_pid() == container0
    with open(paths.rank_file(0)) as f:
        assert json.load(f) == rank0  # the same rank process (pid, start time)
    assert not [e for e in kinds("recovery.started", after=t1) if e.data.get("level") == "process"
                and e.writer.startswith("agent-") and rank0["host"] in e.writer], "the survivor's workers restarted"
    replaced = pod(f"{name}-worker-1")
    assert replaced is not None and replaced["metadata"]["uid"] != lost_uid  # a new pod, same name: group 1

    # 2. a hang in a pod: the rank stops itself on the request file; our agent's watchdog catches it
    wait("progress after healing", lambda: step() >= healed[0].data["step"] + 3, timeout=120)
    t2 = time.time()
    client.inject_fault(rec.job_id, 1, kind="hang")
    hang = wait("the watchdog's hang report", lambda: kinds("fault.detected", after=t2, reason="hang"), timeout=60)
    assert hang[0].time - t2 <= HANG_TIMEOUT_S + 5.0, (hang[0].time - t2, hang[0].data)
    # the watchdog killed it and torchrun restarted it (the process level of the ladder)
    wait("the hung rank's restart", lambda: kinds("recovery.started", after=hang[0].time - 0.5, level="process"),
         timeout=60)

    # 3. completion: the Lighthouse pod exits after the finished event, the PyTorchJob succeeds
    wait("finished", lambda: kinds("finished"), timeout=240)
    assert client.wait(rec.job_id, timeout_s=120).status == "completed"
    assert step() == STEPS - 1 and kinds("finished")[-1].data["status"] == "succeeded"
    assert not [e for e in kinds("checkpoint.restored") if e.data["tier"] != "replica"], "read from storage"
    job = standin.find(KF, ns, name)
    assert [c["type"] for c in job["status"]["conditions"]][-1] == "Succeeded", job["status"]

    # the sidebar's source: the server's REST events of the same job
    served, cursor = [], None
    while True:
        status, body = server.call("GET", f"/hyperpod/jobs/{rec.job_id}/events" + (f"?cursor={cursor}" if cursor else ""))
        assert status == 200, body
        if not body["events"]:
            break
        served += body["events"]
        cursor = body["cursor"]
    on_disk = {(e.writer, e.seq) for e in EventReader(rec.job_dir).poll()}
    got = {(e["writer"], e["seq"]) for e in served}
    assert on_disk <= got, sorted(on_disk - got)[:10]
    assert {"checkpoint.restored", "fault.detected", "finished"} <= {e["kind"] for e in served}


def test_restart_mode_hyperpod_pods_run_our_agent_which_catches_a_hang(standin, tmp_path):
    """Issue 28 item 3: a restart-mode HyperPodPyTorchJob's pods run ``hyperpodrun`` (the operator's
    agent, stand-in here) starting our launch agent, which runs the pod's ranks. A hang injected in
    rank 1 (``inject-fault --kind hang``) is reported by OUR agent's watchdog (``fault.detected``
    {reason: hang} from an ``agent-`` writer) within the hang timeout; the rank is killed, the agent
    exits, hyperpodrun reports the fault and the operator stand-in restarts the job's workers
    (``restartCount`` 1), which resume from the checkpoint and complete. The operator's own
    log-monitoring rules stay in the resource."""
    from hyperpod_lab.submit.client import Client

    client = Client()
    save_profile(ClusterProfile(name="eks-hp-agent", orchestrator="eks",
                                kubeconfig=standin.kubeconfig(str(tmp_path / "kubeconfig")), kube_context="fake",
                                namespace="ml", image="img:1", pvc="fsx-claim", shared_root=standin.kubelet.shared_root))
    spec = JobSpec(script=os.path.join(REPO, "tests", "scripts", "standin_ddp.py"), name="hp-agent",
                   cluster="eks-hp-agent", nodes=2, procs_per_node=1,
                   resiliency=ResiliencyPolicy(hang_timeout_s=HANG_TIMEOUT_S, max_retries=2),
                   env={"HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.001"}, args=["--steps", "24", "--sleep", "0.2"])
    rec = client.submit(spec)
    ns, name = rec.native_id.split("/")
    job = standin.find("apis/sagemaker.amazonaws.com/v1/hyperpodpytorchjobs", ns, name)
    assert job["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]["command"][0] == "hyperpodrun"
    assert {r["name"] for r in job["spec"]["runPolicy"]["logMonitoringConfiguration"]} == {"JobStart",
                                                                                           "JobHangingDetection"}
    reader, events = EventReader(rec.job_dir), []

    def kinds(kind, after=0.0, **match):
        events.extend(reader.poll())
        return [e for e in events if e.kind == kind and e.time > after
                and all(e.data.get(k) == v for k, v in match.items())]

    wait_for("step 3", lambda: max([e.data["step"] for e in kinds("step")] or [-1]) >= 3, timeout=180)
    t = time.time()
    client.inject_fault(rec.job_id, 1, kind="hang")
    hang = wait_for("our agent's hang report", lambda: kinds("fault.detected", after=t, reason="hang"), timeout=60)
    assert hang[0].writer.startswith("agent-") and hang[0].time - t <= HANG_TIMEOUT_S + 5.0, hang[0]
    assert client.wait(rec.job_id, timeout_s=240).status == "completed"
    status = standin.find("apis/sagemaker.amazonaws.com/v1/hyperpodpytorchjobs", ns, name)["status"]
    assert status["restartCount"] >= 1 and [c["type"] for c in status["conditions"]][-1] == "Completed", status
    assert max(e.data["step"] for e in kinds("step")) == 23


def test_the_operators_faulty_rank_of_an_agent_pod_names_the_pods_ranks():
    """With our agent as hyperpodrun's one process a pod (``nprocPerNode: "1"``), the operator's
    ``faultyRankList`` counts pods (the SDK model's ``latestFaultyPodInstanceList``): its rank 1 of a
    job of 4 ranks a pod is the job's ranks 4-7. A resource whose ``nprocPerNode`` is the ranks a
    pod (checkpointless, or rendered before) keeps the operator's ranks."""
    from hyperpod_lab.events import EventKind
    from hyperpod_lab.schedulers.eks.status import status_events

    def fault(nproc):
        obj = {"spec": {"nprocPerNode": nproc}, "status": {
            "conditions": [{"type": "Running", "status": "True"}], "restartCount": 1,
            "latestFaultyPodInstanceList": {"restartType": "PLR", "faultyRankList": ["1"], "faultyPodList": ["p-1"]}}}
        events, _ = status_events({"started": True, "nodes": 2}, obj, 4, time.time())
        return next(d for k, d in events if k == EventKind.FAULT_DETECTED)

    agent = fault("1")
    assert agent["ranks"] == [4, 5, 6, 7] and agent["rank"] == 4 and agent["pods"] == ["p-1"]
    assert fault("4")["ranks"] == [1]
