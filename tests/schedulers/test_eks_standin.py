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

import pytest

from hyperpod_lab.events import EventReader
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit.clusters import ClusterProfile, save_profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the helpers
import k8s_standin
from k8s_standin import standin_in
from test_eks_render import sdk_validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "scripts", "standin_ddp.py")
HP = "apis/sagemaker.amazonaws.com/v1/hyperpodpytorchjobs"
SECRET = "s3cr3t-standin-value"


@pytest.fixture
def standin(tmp_path):
    with standin_in(tmp_path) as k:
        yield k


def profile(k, tmp_path, name="eks-standin") -> ClusterProfile:
    prof = ClusterProfile(name=name, orchestrator="eks", kubeconfig=k.kubeconfig(str(tmp_path / "kubeconfig")),
                          kube_context="fake", namespace="ml", image="img:1", pvc="fsx-claim",
                          shared_root=k.kubelet.shared_root)
    save_profile(prof)
    return prof


def wait_for(what, fn, timeout=60.0, every=0.1, k=None):
    def with_logs(why):
        return why + ("".join(f"\n--- {p['metadata']['name']} {p['status'].get('phase')} "
                              f"{[c.get('state') for c in p['status'].get('containerStatuses') or []]} ---\n"
                              + pod_log(k, p["metadata"]["name"]).decode()[-3000:] for p in k.pods()) if k else "")
    return k8s_standin.wait_for(what, fn, timeout, every, with_logs)


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
    node (restartCount 2); ``inject-fault --kind exception`` (a request file on the claim) makes
    rank 1 raise: the workers restart in their pods (restartCount 3, the pods kept); the ranks
    resume from their checkpoint and the job completes, our runtime's events in the shared dir
    (seen at /fsx in the pods)."""
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
    reader = EventReader(client.get(rec.job_id).job_dir)  # the runtime's events, on the claim
    wait_for("rank 0's step event", lambda: any(e.kind == "step" and e.writer == "rank-0" for e in reader.poll()),
             timeout=120)
    sched = client.scheduler("eks-standin")
    rec = client.get(rec.job_id)

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

    # a persistent checkpoint first: the restarts below must have one to resume from (stop 35's CI
    # killed pod 1 before the first save at load ~19, and no rank ever had one to restore)
    wait_for("a persistent checkpoint", lambda: any(
        e.kind == "checkpoint.saved" and e.data.get("tier") == "persistent" for e in events(rec)), timeout=120, k=standin)

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
    wait_for("a checkpoint restored after the restarts", lambda: any(
        e.kind == "checkpoint.restored" and e.writer == "rank-0" for e in reader.poll()), timeout=180, k=standin)

    # inject-fault --kind exception: the request file on the claim reaches rank 1 in its pod; its
    # worker raises, the agent reports the fault, the operator restarts the workers in place (PLR:
    # the pods stay)
    uids = {p: standin.find("api/v1/pods", "ml", p)["metadata"]["uid"] for p in (p0, p1)}
    restored = sum(e.kind == "checkpoint.restored" and e.writer == "rank-0" for e in events(rec))
    client.inject_fault(rec.job_id, 1, kind="exception")
    wait_for("restartCount 3", lambda: job_status(standin, name).get("restartCount") == 3, timeout=60)
    client.status(rec.job_id)
    fault = job_status(standin, name)["latestFaultyPodInstanceList"]
    assert fault["faultyPodList"] == [p1] and fault["restartType"] == "PLR"
    wait_for("a checkpoint restored after the exception", lambda: sum(
        e.kind == "checkpoint.restored" and e.writer == "rank-0" for e in events(rec)) > restored, timeout=120)
    assert {p: standin.find("api/v1/pods", "ml", p)["metadata"]["uid"] for p in (p0, p1)} == uids

    open(os.path.join(rec.job_dir, "stop-now"), "w").close()  # the ranks finish (the job dir is on the claim)
    wait_for("Completed", lambda: "Completed" in conditions(standin, name), timeout=120)
    assert client.status(rec.job_id).status == "completed"
    # the operator stand-in's statuses have the operator's shapes: each validates against the SDK's model
    statuses = [o["status"] for _, _, key, o in list(standin._log) if key[0] == HP and o.get("status")]
    assert len(statuses) >= 8 and sdk_validate(statuses=statuses) == []
    evs = events(client.get(rec.job_id))
    assert [e.data["pods"] for e in evs if e.kind == "fault.detected" and e.writer == "operator"] == [[p1], [p0], [p1]]
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
    for r, pod in ((0, p0), (1, p1)):  # hostname = the pod's name, as the kubelet sets it
        assert any(f"rank {r}/2 host {pod} start 0" in o for o in outs), outs


def test_log_ranges_use_limit_bytes_and_tail_lines_only(tmp_path, client):
    """EksScheduler.log_range against the stand-in's scripted pods (known log text): offset ranges
    ask ``limitBytes``, tails ask ``tailLines``, never a whole log; the bytes are the right ones;
    the stand-in refuses ``sinceBytes`` (no such PodLogOptions field) by name."""
    from urllib.error import HTTPError
    from urllib.request import Request, urlopen

    from k8s_standin import K8sStandIn

    k = K8sStandIn()
    try:
        save_profile(ClusterProfile(name="eks-scripted", orchestrator="eks", kube_context="fake", namespace="ml",
                                    kubeconfig=k.kubeconfig(str(tmp_path / "kubeconfig")), image="img:1",
                                    pvc="fsx-claim"))
        rec = client.submit(JobSpec(script=SCRIPT, name="logs", cluster="eks-scripted", nodes=2, procs_per_node=1))
        name = rec.native_id.split("/")[1]
        body0 = b"".join(b"line %03d of pod 0 %s\n" % (i, b"x" * (i % 7)) for i in range(400))
        k.pod_logs[f"{name}-pod-0"], k.pod_logs[f"{name}-pod-1"] = body0.decode(), "short log of pod 1\n"
        sched = client.scheduler("eks-scripted")
        mark = len(k.requests)
        c = sched.log_range(rec, 0, 1000, 50)
        assert c.raw == body0[1000:1050] and (c.offset, c.end, c.size) == (1000, 1050, None)
        c = sched.log_range(rec, 0, len(body0) - 10, 50)  # reaches the end: the size is known
        assert c.raw == body0[-10:] and c.size == len(body0)
        c = sched.log_range(rec, 0, None, 300)  # a tail of a longer log: offset unknown to the API
        assert c.raw == body0[-300:] and c.size is None
        c = sched.log_range(rec, 1, None, 300)  # the whole (short) log: exact
        assert c.raw == b"short log of pod 1\n" and (c.offset, c.size) == (0, 19)
        every = f"==> pod {name}-pod-0 <==\n".encode() + body0 + f"\n==> pod {name}-pod-1 <==\n".encode() + \
            b"short log of pod 1\n"
        c = sched.log_range(rec, None, None, 40)
        assert c.raw == every[-40:]
        c = sched.log_range(rec, None, 5, 100)
        assert c.raw == every[5:105]
        assert client.logs(rec.job_id, rank=0) == body0.decode()
        logs = [r["query"] for r in k.requests[mark:] if r["path"].endswith("/log")]
        assert logs and all(("limitBytes" in q) != ("tailLines" in q) for q in logs), logs
        url = f"{k.url}/api/v1/namespaces/ml/pods/{name}-pod-0/log?sinceBytes=10"
        with pytest.raises(HTTPError) as e:
            urlopen(Request(url, headers={"Authorization": "Bearer t0ken"}))
        assert e.value.code == 400 and "sinceBytes" in e.value.read().decode()
    finally:
        k.close()


MASTER = """
import os, socket
s = socket.socket(); s.bind(("0.0.0.0", int(os.environ["MASTER_PORT"]))); s.listen()
c, _ = s.accept(); c.sendall(socket.gethostname().encode()); c.recv(10)  # the worker's ack: then exit
"""
WORKER = """
import os, socket, time
port = int(os.environ["MASTER_PORT"])
mine = socket.socket(); mine.bind(("0.0.0.0", port))  # the same port as the master: its own network namespace
deadline = time.time() + 60
while True:
    try:
        c = socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=5); break
    except OSError:
        if time.time() > deadline: raise
        time.sleep(0.2)
with open("/fsx/" + socket.gethostname() + ".said", "w") as f:
    f.write("master says " + c.recv(100).decode())
c.sendall(b"ok")
"""


def test_kubeflow_pods_env_volumes_network_and_refusals(standin, tmp_path):
    """A rendered Kubeflow PyTorchJob whose container command is swapped for small probes: the
    training operator's env (envvar.go), the downward API, $(VAR) expansion, the FSx claim at
    /fsx, the memory emptyDir at /dev/shm, the ConfigMap at the job mount; two pods bind the same
    port (one network namespace each) and the worker reaches the Master by its name; the Master
    succeeds -> Succeeded. A fieldRef the kubelet stand-in does not serve is refused by name."""
    import json as _json
    from urllib.request import Request, urlopen

    from hyperpod_lab.schedulers.eks import manifest as km

    prof = ClusterProfile(name="eks-kf", orchestrator="eks", namespace="ml", image="img:1", pvc="fsx-claim",
                          operator="kubeflow")
    spec = JobSpec(script=SCRIPT, name="kf", cluster="eks-kf", nodes=2, procs_per_node=1)
    job = km.render_kubeflow_pytorch_job(spec, "kf-probe-1", prof)
    cm = km.render_job_configmap(spec, "kf-probe-1", prof, b"print('hi')\n")
    probe = "env | sort > /fsx/$(HOSTNAME).env; cat /proc/mounts > /fsx/$(HOSTNAME).mounts; ls /opt/hyperpod-lab/job >> /fsx/$(HOSTNAME).mounts; "
    for rtype, code in (("Master", MASTER), ("Worker", WORKER)):
        c = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"][0]
        c["command"] = ["/bin/sh", "-c", probe + 'exec python -c "$0"', code]
        c["env"].append({"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})

    def post(path, body):
        req = Request(f"{standin.url}{path}", data=_json.dumps(body).encode(), method="POST",
                      headers={"Content-Type": "application/json"})
        with urlopen(req) as r:
            return _json.load(r)

    post("/api/v1/namespaces/ml/configmaps", cm)
    name = job["metadata"]["name"]
    post("/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs", job)
    kf = "apis/kubeflow.org/v1/pytorchjobs"
    wait_for("Succeeded", lambda: [c["type"] for c in (standin.find(kf, "ml", name) or {}).get("status", {}).get(
        "conditions", [])][-1:] == ["Succeeded"], timeout=90, k=standin)
    shared = standin.kubelet.shared_root
    master, worker = f"{name}-master-0", f"{name}-worker-0"
    envs = {}
    for pod in (master, worker):
        with open(os.path.join(shared, pod + ".env")) as f:
            envs[pod] = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    assert envs[master]["RANK"] == "0" and envs[worker]["RANK"] == "1" and envs[worker]["WORLD_SIZE"] == "2"
    assert envs[worker]["MASTER_ADDR"] == master and envs[worker]["PET_MASTER_ADDR"] == master
    assert envs[worker]["PET_NNODES"] == "2" and envs[worker]["PET_NODE_RANK"] == "1"
    assert envs[worker]["MASTER_PORT"] == "23456" and envs[worker]["PYTHONUNBUFFERED"] == "0"
    assert envs[worker]["MY_IP"] == standin.kubelet.ips[worker] != standin.kubelet.ips[master]
    assert envs[worker]["HYPERPOD_LAB_JOB_DIR"].startswith("/fsx/")
    with open(os.path.join(shared, worker + ".mounts")) as f:
        mounts = f.read()
    assert " /fsx " in mounts and "tmpfs /dev/shm tmpfs" in mounts and "/opt/hyperpod-lab/job" in mounts
    assert "\nstandin_ddp.py\n" in mounts and "\nspec.json\n" in mounts  # the ConfigMap's keys as files
    with open(os.path.join(shared, worker + ".said")) as f:
        assert f.read() == f"master says {master}"

    # deleting a running job: the operator's pods go (ownerReferences), their processes with them
    job2 = km.render_kubeflow_pytorch_job(spec, "kf-probe-2", prof)
    for rs in job2["spec"]["pytorchReplicaSpecs"].values():
        rs["template"]["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", "echo up; exec sleep 600"]
    post("/api/v1/namespaces/ml/configmaps", km.render_job_configmap(spec, "kf-probe-2", prof, b"print('hi')\n"))
    post("/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs", job2)
    name2 = job2["metadata"]["name"]
    wait_for("Running", lambda: "Running" in [c["type"] for c in (standin.find(kf, "ml", name2) or {}).get(
        "status", {}).get("conditions", [])], timeout=30, k=standin)
    pids = [standin.kubelet.runs[("ml", f"{name2}-{r}-0")].container_pid() for r in ("master", "worker")]
    assert all(pids)
    urlopen(Request(f"{standin.url}/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/{name2}", method="DELETE")).read()
    wait_for("the pods gone", lambda: not [p for p in standin.pods("ml") if p["metadata"]["name"].startswith(name2)])
    wait_for("their processes gone", lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids), timeout=10)

    # a downward-API field the stand-in does not serve: the container waits, the reason names it
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad-ref"},
           "spec": {"containers": [{"name": "c", "image": "img", "command": ["true"], "env": [
               {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}}]}]}}
    standin.kubelet.create_pod("ml", bad)
    st = wait_for("a waiting reason", lambda: (standin.find("api/v1/pods", "ml", "bad-ref")["status"].get(
        "containerStatuses") or [{}])[0].get("state", {}).get("waiting"))
    assert st["reason"] == "CreateContainerConfigError" and "spec.serviceAccountName" in st["message"]


def test_kubelet_restart_policy_and_graceful_delete(standin):
    """The kubelet stand-in: ``OnFailure`` restarts a failing container in place (restartCount,
    lastState.terminated.exitCode, the previous instance's log by ``previous``); ``Never`` leaves
    the pod Failed with the exit code; deleting a pod sends SIGTERM to its PID 1 (the container's
    trap answers with exit 7 within the grace period)."""
    def pod(name, script, policy):
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"restartPolicy": policy, "terminationGracePeriodSeconds": 20,
                         "containers": [{"name": "c", "image": "img", "command": ["/bin/sh", "-c", script]}]}}

    def status(name):
        return (standin.find("api/v1/pods", "ml", name) or {}).get("status", {})

    k = standin.kubelet
    k.create_pod("ml", pod("flaky", "echo run; exit 3", "OnFailure"))
    k.create_pod("ml", pod("once", "exit 4", "Never"))
    k.create_pod("ml", pod("polite", "trap 'echo bye; exit 7' TERM; echo up; while :; do sleep 0.1; done", "Never"))
    cs = wait_for("two restarts", lambda: (status("flaky").get("containerStatuses") or [{}])[0].get(
        "restartCount", 0) >= 2 and status("flaky")["containerStatuses"][0])
    assert cs["lastState"]["terminated"]["exitCode"] == 3
    with open(standin.log_path("ml", "flaky", previous=True)) as f:
        assert f.read() == "run\n"
    from urllib.request import urlopen

    with urlopen(f"{standin.url}/api/v1/namespaces/ml/pods/flaky/log?previous=true&tailLines=5") as r:
        assert r.read() == b"run\n"  # the API's view of the previous instance
    wait_for("Failed", lambda: status("once").get("phase") == "Failed")
    assert status("once")["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 4
    wait_for("up", lambda: b"up" in pod_log(standin, "polite"))
    uid = standin.find("api/v1/pods", "ml", "polite")["metadata"]["uid"]
    k.delete_pod("ml", "polite", None)  # terminationGracePeriodSeconds: 20
    k.wait_gone("ml", "polite", uid, timeout=20)
    last = [o for _, _, key, o in list(standin._log) if key == ("api/v1/pods", "ml", "polite")][-1]
    assert last["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 7
