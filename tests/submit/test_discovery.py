"""Cluster discovery through the SageMaker API against a real moto server on loopback
(``tests/moto_server.py``): list/describe clusters, nodes and health, profiles written with
placeholders, missing credentials, wrong region, and throttling retried with backoff (a small
HTTP proxy in front of moto answers the first requests with the API's real ThrottlingException
response, which botocore's retry handler parses).

moto 5.2.5 limits, stated rather than faked: it drops ``Orchestrator`` (every moto cluster reads
as Slurm), so the EKS profile is built from a ``DiscoveredCluster`` as the real API describes
one; it lacks ``list_cluster_events`` (a 500), which discovery reports as unavailable."""

from __future__ import annotations

import http.client
import io
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hyperpod_lab import cli
from hyperpod_lab.errors import ClusterUnreachable, ConfigError
from hyperpod_lab.schedulers import for_profile
from hyperpod_lab.submit.clusters import ClusterProfile, get_profile
from hyperpod_lab.submit.discovery import DiscoveredCluster, discover_clusters, profile_for, ssm_target_for, write_profiles

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the helpers
from moto_server import CREDENTIALS, MotoServer, without_aws_credentials

IG = [{"InstanceGroupName": "workers", "InstanceType": "ml.c5.xlarge", "InstanceCount": 2, "ThreadsPerCore": 1,
       "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle-bkt/lc/", "OnCreate": "on_create.sh"},
       "ExecutionRole": "arn:aws:iam::123456789012:role/SageMakerRole"}]


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    srv = MotoServer(str(tmp_path_factory.mktemp("moto") / "moto.log")).start()
    import boto3

    sm = boto3.client("sagemaker", endpoint_url=srv.url, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    sm.create_cluster(ClusterName="disc-slurm", InstanceGroups=IG)
    sm.create_cluster(ClusterName="disc-two", InstanceGroups=IG,
                      Orchestrator={"Eks": {"ClusterArn": "arn:aws:eks:us-east-1:123456789012:cluster/ml-eks"}})
    yield srv
    srv.kill()


@pytest.fixture
def creds(monkeypatch):
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)


def test_discover_describes_clusters_nodes_and_health(moto, creds):
    found = {c.name: c for c in discover_clusters(region="us-east-1", endpoint_url=moto.url)}
    assert set(found) == {"disc-slurm", "disc-two"}
    c = found["disc-slurm"]
    assert (c.status, c.region, c.orchestrator) == ("InService", "us-east-1", "slurm")
    assert c.arn.endswith(":cluster/disc-slurm")
    assert c.instance_groups == [{"name": "workers", "instance_type": "ml.c5.xlarge", "current_count": 2,
                                  "target_count": 2}]
    assert [n["instance_id"] for n in c.nodes] == ["workers-0", "workers-1"] and c.node_health == {"Running": 2}
    assert c.events is None and "list_cluster_events unavailable" in c.events_note


def test_write_profiles_with_placeholders_and_the_cli(moto, creds):
    out = io.StringIO()
    cli.run(["clusters", "discover", "--region", "us-east-1", "--endpoint-url", moto.url, "--write"], out=out)
    text = out.getvalue()
    assert "disc-slurm" in text and "workers:ml.c5.xlarge 2/2" in text and "Running 2" in text
    assert "profile 'disc-slurm': written; fill in host, user, key_file, known_hosts" in text
    prof = get_profile("disc-slurm")
    assert prof.orchestrator == "slurm" and prof.shared_root == "/fsx" and prof.cluster_arn.endswith("disc-slurm")
    with pytest.raises(ConfigError, match="fill in host, user, key_file, known_hosts"):
        for_profile(prof)  # before any SSH attempt
    again = write_profiles(discover_clusters(region="us-east-1", endpoint_url=moto.url))
    assert dict(again)["disc-slurm"] == "kept"  # what the user filled in is never overwritten


def test_eks_profile_from_a_described_eks_cluster(tmp_path):
    c = DiscoveredCluster(name="hp eks", arn="arn:aws:sagemaker:us-west-2:1:cluster/abc", status="InService",
                          region="us-west-2", orchestrator="eks",
                          eks_cluster_arn="arn:aws:eks:us-west-2:1:cluster/ml-eks")
    (name, what), = write_profiles([c])
    prof = get_profile(name)
    assert (name, what) == ("hp-eks", "written")
    assert (prof.orchestrator, prof.eks_cluster, prof.region, prof.operator) == ("eks", "ml-eks", "us-west-2", "hyperpod")
    with pytest.raises(ConfigError, match="fill in image, pvc"):
        for_profile(prof)
    assert profile_for(c, name="x").cluster_arn == c.arn


def test_missing_credentials(moto, monkeypatch, tmp_path):
    without_aws_credentials(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match="aws configure.*AWS_PROFILE"):
        discover_clusters(region="us-east-1", endpoint_url=moto.url)
    with pytest.raises(ConfigError, match="AWS profile 'nosuch' is not configured"):
        discover_clusters(region="us-east-1", profile="nosuch", endpoint_url=moto.url)


def test_wrong_region(moto, creds, monkeypatch):
    assert discover_clusters(region="us-west-2", endpoint_url=moto.url) == []  # clusters are regional
    out = io.StringIO()
    cli.run(["clusters", "discover", "--region", "eu-west-1", "--endpoint-url", moto.url], out=out)
    assert "no HyperPod clusters in region eu-west-1" in out.getvalue() and "try --region" in out.getvalue()
    with pytest.raises(ConfigError, match="not an AWS region name"):
        discover_clusters(region="us east 1", endpoint_url=moto.url)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(ConfigError, match="no AWS region; pass --region"):
        discover_clusters(endpoint_url=moto.url)


class ThrottlingProxy:
    """HTTP proxy to moto that answers the first ``throttle`` requests as the SageMaker API does
    when it throttles (HTTP 400, ``x-amz-json-1.1`` body with ``__type: ThrottlingException``)."""

    def __init__(self, target_port: int, throttle: int):
        self.throttle, self.throttled, self.forwarded = throttle, 0, 0
        self.times: list[float] = []
        proxy = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.times.append(time.monotonic())
                if proxy.throttled < proxy.throttle:
                    proxy.throttled += 1
                    data = json.dumps({"__type": "ThrottlingException", "message": "Rate exceeded"}).encode()
                    self.send_response(400)
                    self.send_header("Content-Type", "application/x-amz-json-1.1")
                    self.send_header("x-amzn-RequestId", f"throttle-{proxy.throttled}")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                proxy.forwarded += 1
                conn = http.client.HTTPConnection("127.0.0.1", target_port, timeout=30)
                conn.request("POST", self.path, body, {k: v for k, v in self.headers.items() if k.lower() != "host"})
                res = conn.getresponse()
                data = res.read()
                self.send_response(res.status)
                for k, v in res.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_throttling_is_retried_with_backoff(moto, creds):
    proxy = ThrottlingProxy(moto.port, throttle=2)
    try:
        found = discover_clusters(region="us-east-1", endpoint_url=proxy.url)
        assert {c.name for c in found} == {"disc-slurm", "disc-two"}
        assert proxy.throttled == 2 and proxy.forwarded >= 5
        gaps = [b - a for a, b in zip(proxy.times, proxy.times[1:3])]
        assert all(g > 0.0 for g in gaps)  # the retries waited (jittered exponential backoff)
        proxy.throttle, proxy.throttled = 10**6, 0
        with pytest.raises(ClusterUnreachable, match="throttled list_clusters in us-east-1 2 times"):
            discover_clusters(region="us-east-1", endpoint_url=proxy.url, max_attempts=2)
        assert proxy.throttled == 2  # max_attempts calls in all, then our error
    finally:
        proxy.close()


def test_sidebar_refresh_discovers_through_the_server(moto, creds, tmp_path, monkeypatch):
    """The server's ``hyperpod/discover`` (what the sidebar's refresh calls) against the same moto
    endpoint: GET lists the region's clusters; POST writes their profiles, which
    ``GET hyperpod/clusters`` then lists."""
    from jupyter_server_proc import JupyterServer

    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER", moto.url)
    monkeypatch.setenv("HYPERPOD_LAB_CONFIG", str(tmp_path / "clusters.toml"))
    root = tmp_path / "root"
    root.mkdir()
    server = JupyterServer(str(root), str(tmp_path)).start()
    try:
        status, body = server.call("GET", "/hyperpod/discover?region=us-east-1")
        assert status == 200, body
        assert {c["name"] for c in body["clusters"]} == {"disc-slurm", "disc-two"}
        assert server.call("GET", "/hyperpod/discover?region=us-east-1", token=False)[0] == 403
        status, body = server.call("POST", "/hyperpod/discover", {"region": "us-east-1"})
        assert status == 200, body
        assert {w["name"] for w in body["written"]} == {"disc-slurm", "disc-two"}
        names = {c["name"] for c in server.call("GET", "/hyperpod/clusters")[1]["clusters"]}
        assert {"disc-slurm", "disc-two"} <= names
        status, body = server.call("GET", "/hyperpod/discover?region=not_a_region")
        assert status == 400 and "region" in body["error"]["message"], body
        assert not server.auth_warnings()
    finally:
        server.stop()


def test_discovery_writes_ssm_target_of_the_controller(moto, creds):
    """Issue 16: a Slurm cluster's profile reaches its controller node over SSM. The target is
    built as HyperPod documents it: sagemaker-cluster:<cluster-id>_<group>-<instance-id>, the
    cluster id being the last part of the ARN, group and instance id from list_cluster_nodes.
    (Its own region, so the other tests' cluster lists stay as they are.)"""
    import boto3

    from hyperpod_lab.schedulers.remote.route import resolve_route

    region = "ap-southeast-2"
    sm = boto3.client("sagemaker", endpoint_url=moto.url, region_name=region)
    groups = [dict(IG[0], InstanceGroupName="workers", InstanceCount=2),
              dict(IG[0], InstanceGroupName="controller-machine", InstanceCount=1, InstanceType="ml.m5.xlarge")]
    arn = sm.create_cluster(ClusterName="disc-ssm", InstanceGroups=groups)["ClusterArn"]
    try:
        (c,) = discover_clusters(region=region, endpoint_url=moto.url)
        ctl = [n for n in c.nodes if n["group"] == "controller-machine"]
        assert len(ctl) == 1 and c.arn == arn
        want = f"sagemaker-cluster:{arn.rsplit('/', 1)[-1]}_controller-machine-{ctl[0]['instance_id']}"
        assert c.ssm_target == want
        (name, what), = write_profiles([c])
        prof = get_profile(name)
        assert (name, what, prof.ssm_target, prof.region, prof.host) == ("disc-ssm", "written", want, region, None)
        assert prof.unfilled() == ["user", "key_file", "known_hosts"]  # no host to fill in
        with pytest.raises(ConfigError, match="fill in user, key_file, known_hosts"):
            for_profile(prof)
        filled = ClusterProfile(**{**prof.__dict__, "user": "ubuntu", "key_file": "/k", "known_hosts": "/kh"})
        (hop,) = resolve_route(filled.validate()).hops
        assert hop.proxy_argv == ["aws", "ssm", "start-session", "--target", want, "--document-name",
                                  "AWS-StartSSHSession", "--parameters", "portNumber=22", "--region", region]
    finally:
        sm.delete_cluster(ClusterName="disc-ssm")


def test_ssm_target_needs_a_controller_group():
    base = dict(name="c", arn="arn:aws:sagemaker:us-west-2:1:cluster/abc123", status="InService",
                region="us-west-2", orchestrator="slurm")
    nodes = [{"instance_id": "i-0down", "group": "head-group", "status": "Failure"},
             {"instance_id": "i-0up", "group": "head-group", "status": "Running"},
             {"instance_id": "i-0w", "group": "workers", "status": "Running"}]
    c = DiscoveredCluster(**base, instance_groups=[{"name": "workers"}, {"name": "head-group"}], nodes=nodes)
    assert ssm_target_for(c) == "sagemaker-cluster:abc123_head-group-i-0up"  # a Running node first
    assert ssm_target_for(c, controller_group="workers") == "sagemaker-cluster:abc123_workers-i-0w"
    lone = DiscoveredCluster(**base, instance_groups=[{"name": "workers"}], nodes=nodes[2:])
    assert ssm_target_for(lone) is None
    prof = profile_for(lone)
    assert prof.ssm_target is None and prof.unfilled() == ["host", "user", "key_file", "known_hosts"]
