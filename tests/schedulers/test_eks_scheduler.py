"""The EKS backend through the real ``kubernetes`` client against ``tests/k8s_standin.py``, a STAND-IN
Kubernetes API server (real HTTP on loopback, a real kubeconfig; no real API server can be
installed here) whose scripted operator starts pods, fails one, restarts the job and scales it. The
operator's status reaches our ``EventReader`` as events of the writer ``operator``. The EKS-token
path makes a real presigned STS URL with boto3 and reads the cluster from a moto EKS server."""

from __future__ import annotations

import base64
import os
import sys
import time
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from hyperpod_lab.errors import ClusterUnreachable, ConfigError, HyperPodLabError
from hyperpod_lab.schedulers.eks.scheduler import EksScheduler, eks_token
from hyperpod_lab.spec import ElasticPolicy, JobSpec
from hyperpod_lab.submit.clusters import ClusterProfile, save_profile
from hyperpod_lab.submit.jobs import JobStatus

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the helpers
from k8s_standin import K8sStandIn as FakeKube
from moto_server import CREDENTIALS, MotoServer, without_aws_credentials
from ports import free_port
from test_eks_render import sdk_validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "train_lm.py")
HP = "apis/sagemaker.amazonaws.com/v1/hyperpodpytorchjobs"


@pytest.fixture
def fake():
    k = FakeKube()
    yield k
    k.close()


def eks_profile(fake, tmp_path, name="eks-fake", **kw) -> ClusterProfile:
    prof = ClusterProfile(name=name, orchestrator="eks", kubeconfig=fake.kubeconfig(str(tmp_path / "kubeconfig")),
                          kube_context="fake", namespace="ml", image="img:1", pvc="fsx-claim", **kw)
    save_profile(prof)
    return prof


def spec(cluster, **kw) -> JobSpec:
    base = dict(script=SCRIPT, name="train lm", cluster=cluster, nodes=2, procs_per_node=2,
                elastic=ElasticPolicy(1, 3), args=["--steps", "40"])
    base.update(kw)
    return JobSpec(**base)


def new_events(reader):
    return [(e.writer, e.kind, e.data) for e in reader.poll()]


def test_submit_status_operator_events_logs_and_faults(fake, tmp_path, client):
    eks_profile(fake, tmp_path)
    rec = client.submit(spec("eks-fake"))
    ns, name = rec.native_id.split("/")
    assert ns == "ml" and rec.orchestrator == "eks"
    job = fake.find(HP, "ml", name)
    cm = fake.find("api/v1/configmaps", "ml", name + "-job")
    with open(SCRIPT) as f:
        assert cm["data"]["train_lm.py"] == f.read()
    assert cm["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]  # collected with the job
    assert all(r["auth"] == "Bearer t0ken" for r in fake.requests)  # the kubeconfig's user

    reader = client.event_reader(rec.job_id)
    assert client.status(rec.job_id).state == JobStatus.RUNNING
    got = new_events(reader)
    assert [(w, k) for w, k, _ in got] == [("client", "submitted"), ("operator", "started")]
    assert got[1][2]["world_size"] == 4

    # the operator: pod 1 (ranks 2, 3) fails, the job restarts it; then it scales to 3 nodes. The
    # operator counts hyperpodrun's processes, one a pod (nprocPerNode "1": our agent), so it names rank 1
    fake.operator.fail_pod(name, 1)
    fake.operator.scale(name, 3)
    client.status(rec.job_id)
    got = new_events(reader)
    assert [k for _, k, _ in got] == ["fault.detected", "recovery.started", "recovery.completed", "elastic.scaled"]
    assert {w for w, _, _ in got} == {"operator"}
    fault, started, done, scaled = (d for _, _, d in got)
    assert fault["ranks"] == [2, 3] and fault["rank"] == 2 and fault["pods"] == [f"{name}-pod-1"]
    assert fault["restart_type"] == "PLR" and started["restart_count"] == done["restart_count"] == 1
    assert 0 <= done["downtime_s"] < 5
    assert (scaled["old_nodes"], scaled["new_nodes"], scaled["new_world_size"]) == (2, 3, 6)
    assert new_events(reader) == []  # a second poll adds nothing

    # logs per rank: rank 3 runs in the second pod (2 ranks per pod)
    assert client.logs(rec.job_id, rank=3).startswith("pod 1 on ")
    assert f"==> pod {name}-pod-0 <==" in client.logs(rec.job_id)

    # inject a fault: the rank's pod is deleted; the watch sees the operator restart it
    info = client.inject_fault(rec.job_id, 1)
    assert info["pod"] == f"{name}-pod-0"
    sched = client.scheduler("eks-fake")
    kinds = [e.kind for e in sched.watch(client.get(rec.job_id), timeout_s=2)]
    assert kinds[:3] == ["fault.detected", "recovery.started", "recovery.completed"]
    assert [k for _, k, _ in new_events(reader)][:3] == kinds[:3]  # the same lines, through the reader

    fake.operator.complete(name)
    assert client.wait(rec.job_id, timeout_s=10).state == JobStatus.COMPLETED
    fins = [(w, d) for w, k, d in new_events(reader) if k == "finished"]
    assert fins == [("operator", {"status": "succeeded", "exit_code": 0, "reason": "job completed",
                                  "source": "operator"})]

    # the fake's statuses are the operator's shapes: every one validates against the SDK's model
    statuses = [o["status"] for _, _, key, o in fake._log if key[0] == HP and o.get("status")]
    assert len(statuses) >= 6 and sdk_validate(statuses=statuses) == []


def test_poll_is_one_list_call_per_namespace(fake, tmp_path, client):
    eks_profile(fake, tmp_path)
    recs = [client.submit(spec("eks-fake", name=f"j{i}")) for i in range(3)]
    before = fake.count("GET", "/" + HP.replace("hyperpodpytorchjobs", "namespaces/ml/hyperpodpytorchjobs"))
    client.refresh([client.get(r.job_id) for r in recs])
    after = fake.count("GET", "/" + HP.replace("hyperpodpytorchjobs", "namespaces/ml/hyperpodpytorchjobs"))
    assert after - before == 1
    assert {client.get(r.job_id).state for r in recs} == {JobStatus.RUNNING}


def test_cancel_deletes_the_job_and_its_configmap(fake, tmp_path, client):
    eks_profile(fake, tmp_path)
    rec = client.submit(spec("eks-fake"))
    name = rec.native_id.split("/")[1]
    client.cancel(rec.job_id)
    assert fake.find(HP, "ml", name) is None and fake.find("api/v1/configmaps", "ml", name + "-job") is None
    assert client.status(rec.job_id).state == JobStatus.CANCELLED
    fins = [e.data["status"] for e in client.event_reader(rec.job_id).poll() if e.kind == "finished"]
    assert fins == ["cancelled"]


def test_failed_job_and_refused_submission(fake, tmp_path, client):
    eks_profile(fake, tmp_path)
    rec = client.submit(spec("eks-fake"))
    fake.operator.fail(rec.native_id.split("/")[1], "pods failed 3 times")
    st = client.status(rec.job_id)
    assert (st.state, st.reason) == (JobStatus.FAILED, "pods failed 3 times")
    # an unauthorized API: a clear error, nothing recorded, no ConfigMap left behind
    fake.token_prefix = "someone-else"
    n_jobs = len(client.jobs(refresh=False))
    with pytest.raises(ConfigError, match="refused creating the job's ConfigMap"):
        client.submit(spec("eks-fake", name="denied"))
    assert len(client.jobs(refresh=False)) == n_jobs
    # no HyperPod operator (CRD) on the cluster: the error says so; the ConfigMap is removed again
    fake.token_prefix = None
    fake.missing_crds.add("hyperpodpytorchjobs")
    with pytest.raises(HyperPodLabError, match="hyperpodpytorchjobs CRD installed"):
        client.submit(spec("eks-fake", name="no-crd"))
    assert [k for k in fake.objects if k[0] == "api/v1/configmaps" and "no-crd" in k[2]] == []


def test_kubeflow_operator(fake, tmp_path, client):
    eks_profile(fake, tmp_path, name="eks-kubeflow", operator="kubeflow")
    rec = client.submit(spec("eks-kubeflow"))
    name = rec.native_id.split("/")[1]
    job = fake.find("apis/kubeflow.org/v1/pytorchjobs", "ml", name)
    assert job["kind"] == "PyTorchJob" and job["spec"]["elasticPolicy"]["rdzvBackend"] == "c10d"
    assert client.status(rec.job_id).state == JobStatus.RUNNING
    fake.operator.complete(name, condition="Succeeded")
    assert client.status(rec.job_id).state == JobStatus.COMPLETED


def test_dry_run_renders_yaml_and_contacts_nothing(fake, tmp_path, client):
    eks_profile(fake, tmp_path, operator="kubeflow")
    text = client.render(spec("eks-fake"))
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap", "PyTorchJob"]
    assert docs[1]["spec"]["elasticPolicy"]["rdzvBackend"] == "c10d"
    assert fake.requests == []


def test_kubeconfig_context_errors(fake, tmp_path, client):
    eks_profile(fake, tmp_path, name="eks-badctx")
    prof = ClusterProfile(name="eks-badctx", orchestrator="eks", kubeconfig=str(tmp_path / "kubeconfig"),
                          kube_context="no-such-context", image="img", pvc="c")
    save_profile(prof)
    with pytest.raises(ConfigError, match="no-such-context"):
        client.submit(spec("eks-badctx"))
    port = free_port()  # nothing listens there
    save_profile(ClusterProfile(name="eks-down", orchestrator="eks", kubeconfig=str(tmp_path / "kubeconfig"),
                                kube_context="fake", api_server=f"http://127.0.0.1:{port}", image="img", pvc="c"))
    t0 = time.monotonic()
    with pytest.raises(ClusterUnreachable, match=f"127.0.0.1:{port}"):
        client.submit(spec("eks-down"))
    assert time.monotonic() - t0 < 30


@pytest.fixture
def moto_eks(tmp_path, monkeypatch):
    srv = MotoServer(str(tmp_path / "moto.log")).start()
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL_EKS", srv.url)  # only EKS goes to moto; STS is only presigned
    import boto3

    boto3.client("eks", endpoint_url=srv.url, region_name="us-east-1").create_cluster(
        name="ml-eks", roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": ["subnet-1"]})
    yield srv
    srv.kill()


def test_eks_token_path(fake, tmp_path, client, moto_eks, monkeypatch):
    fake.token_prefix = "k8s-aws-v1."  # the fake API server accepts only EKS-style tokens
    save_profile(ClusterProfile(name="eks-token", orchestrator="eks", eks_cluster="ml-eks", region="us-east-1",
                                api_server=fake.url, namespace="ml", image="img:1", pvc="fsx-claim"))
    rec = client.submit(spec("eks-token"))
    assert client.status(rec.job_id).state == JobStatus.RUNNING
    token = fake.requests[0]["auth"].removeprefix("Bearer ")
    raw = token.removeprefix("k8s-aws-v1.")
    url = urlparse(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode())
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert url.scheme == "https" and url.hostname.startswith("sts.") and q["Action"] == "GetCallerIdentity"
    assert "x-k8s-aws-id" in q["X-Amz-SignedHeaders"].split(";") and q["X-Amz-Expires"] == "60"
    assert q["X-Amz-Credential"].startswith("testing/") and "/us-east-1/sts/" in q["X-Amz-Credential"]
    assert "=" not in raw and token == fake.requests[-1]["auth"].removeprefix("Bearer ")  # reused, not remade

    save_profile(ClusterProfile(name="eks-nosuch", orchestrator="eks", eks_cluster="nosuch", region="us-east-1",
                                image="img:1", pvc="fsx-claim"))
    with pytest.raises(ClusterUnreachable, match="check 'eks_cluster' and 'region'"):
        client.submit(spec("eks-nosuch"))


def test_eks_token_without_credentials(monkeypatch, tmp_path):
    without_aws_credentials(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match="aws configure"):
        eks_token("ml-eks", "us-east-1")


def test_status_mapping_without_a_server():
    """The pure mapping: conditions -> JobStatus, and a restart seen in one snapshot."""
    from hyperpod_lab.schedulers.eks.scheduler import job_status, status_events

    assert job_status({"status": {}})[0] == JobStatus.PENDING
    assert job_status(None, cancelled=True)[0] == JobStatus.CANCELLED
    assert job_status(None)[0] == JobStatus.FAILED
    obj = {"spec": {"replicaSpecs": [{"name": "w", "replicas": 2}]},
           "status": {"restartCount": 1, "latestFaultyPodInstanceList": {"restartType": "JLR", "faultyRankList": ["5"]},
                      "conditions": [{"type": "Restarting", "status": "False", "lastTransitionTime": "2026-11-23T01:00:00Z"},
                                     {"type": "Running", "status": "True", "lastTransitionTime": "2026-11-23T01:00:42Z"}]}}
    evs, state = status_events({"started": True, "nodes": 2}, obj, 4, now=0.0)
    assert [k.value for k, _ in evs] == ["fault.detected", "recovery.started", "recovery.completed"]
    assert evs[0][1]["rank"] == 5 and evs[0][1]["restart_type"] == "JLR" and evs[2][1]["downtime_s"] == 42.0
    assert status_events(state, obj, 4, now=1.0)[0] == []
    assert EksScheduler  # imported for the module's public surface
