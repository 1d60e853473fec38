"""The queue view's server side (issue 29 item 4) on the real dev cluster: one ``squeue`` and one
``sinfo`` per cluster per interval whatever the number of requests, through the real SSH route;
every user's jobs with positions and reasons, the DOWN node with its reason; a cluster without a
queue view answers a labelled, empty view.

The scene (``tests/queue_scene.py``): a held job of user ``hplother`` named
``a|b c <img src=x onerror=alert(1)>``, a held job of ours, node n3 DOWN with a reason.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
from queue_scene import DOWN_NODE, OTHER_NAME, OTHER_USER, OUR_NAME, queue_scene

CLUSTER = "local-slurm"
OPENAPI = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                       "openapi.yaml")


def _documented(body: dict, status: int) -> None:
    """``body`` is what docs/openapi.yaml says GET clusters/{name}/queue answers with ``status``."""
    import yaml
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    with open(OPENAPI) as f:
        doc = yaml.safe_load(f)
    resp = doc["paths"]["/hyperpod/clusters/{name}/queue"]["get"]["responses"][str(status)]
    if "$ref" in resp:
        resp = doc["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
    schema = resp["content"]["application/json"]["schema"]
    registry = Registry().with_resource("urn:api", Resource.from_contents(doc, default_specification=DRAFT202012))
    ref = schema["$ref"].replace("#", "urn:api#") if "$ref" in schema else None
    Draft202012Validator({"$ref": ref} if ref else schema, registry=registry).validate(body)


@pytest.fixture(scope="module")
def scene(dev_cluster):
    with queue_scene(reason="hpl queue|test") as s:
        yield s


def _check_view(view: dict, scene: dict) -> None:
    assert view["cluster"] == CLUSTER and view["supported"] is True and view["user"] == "root"
    jobs = {j["id"]: j for j in view["jobs"]}
    other, ours = jobs[scene["other"]], jobs[scene["ours"]]
    assert (other["user"], other["name"], other["status"], other["reason"], other["mine"]) == (
        OTHER_USER, OTHER_NAME, "pending", "JobHeldUser", False)
    assert (ours["name"], ours["mine"], ours["job_id"]) == (OUR_NAME, True, None)
    # positions: 1, 2, ... over the pending rows of each partition, in squeue's order
    pending = [j for j in view["jobs"] if j["status"] == "pending" and j["partition"] == "dev"]
    assert [j["position"] for j in pending] == list(range(1, len(pending) + 1))
    node = {n["name"]: n for n in view["nodes"]}[DOWN_NODE]
    assert (node["group"], node["reason"]) == ("down", scene["reason"]), node
    assert view["counts"].get("down", 0) >= 1 and [p["name"] for p in view["partitions"]] == ["dev"]


def test_concurrent_requests_share_one_squeue_and_one_sinfo(scene, tmp_path):
    from hyperpod_lab.server.queue import QueueCache
    from hyperpod_lab.server.watch.watcher import Watcher
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobStore

    client = Client(JobStore(str(tmp_path / "jobs")))
    watcher = Watcher(client)
    cache = QueueCache(watcher, interval_s=2.0)
    remote = client.scheduler(CLUSTER).remote  # the real SSH route to the dev cluster's login node
    calls: list[str] = []
    real_run = remote.run

    def counted(argv, *args, **kwargs):  # counts, then runs the real command over SSH
        calls.append(argv[0])
        return real_run(argv, *args, **kwargs)

    remote.run = counted

    async def rounds():
        first = await asyncio.gather(*[cache.get(CLUSTER) for _ in range(25)])
        later = await cache.get(CLUSTER)  # within the interval: the same snapshot
        await asyncio.sleep(2.1)
        second = await asyncio.gather(*[cache.get(CLUSTER) for _ in range(5)])
        return first, later, second

    try:
        first, later, second = asyncio.run(rounds())
    finally:
        watcher.executor.shutdown(wait=False)
        for ex in watcher._executors.values():
            ex.shutdown(wait=False)
    assert calls == ["squeue", "sinfo", "squeue", "sinfo"], calls
    assert len({v["fetched_at"] for v in first + [later]}) == 1
    assert len({v["fetched_at"] for v in second}) == 1 and second[0]["fetched_at"] > first[0]["fetched_at"]
    assert cache.snapshots == {CLUSTER: 2}
    _check_view(first[0], scene)


@pytest.fixture(scope="module")
def queue_server(scene, tmp_path_factory):
    from jupyter_server_proc import JupyterServer

    srv = JupyterServer(str(tmp_path_factory.mktemp("root")), str(tmp_path_factory.mktemp("server")))
    srv.start(60.0, "--HyperPodLab.queue_interval_s=30")
    yield srv
    srv.stop()
    assert not srv.auth_warnings(), srv.auth_warnings()


def test_rest_answers_every_tab_from_one_snapshot(queue_server, scene):
    answers: list[tuple[int, dict]] = []

    def get():
        answers.append(queue_server.call("GET", f"/hyperpod/clusters/{CLUSTER}/queue"))

    threads = [threading.Thread(target=get) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [s for s, _ in answers] == [200] * 12, answers[:1]
    assert len({b["fetched_at"] for _, b in answers}) == 1  # one snapshot served all twelve
    view = answers[0][1]
    _documented(view, 200)
    assert view["interval_s"] == 30.0 and 0 <= view["age_s"] < 30
    _check_view(view, scene)
    time.sleep(0.2)
    status, again = queue_server.call("GET", f"/hyperpod/clusters/{CLUSTER}/queue")
    assert status == 200 and again["fetched_at"] == view["fetched_at"] and again["age_s"] > view["age_s"]


def test_a_cluster_without_a_queue_view_and_an_unknown_one(queue_server):
    status, body = queue_server.call("GET", "/hyperpod/clusters/local/queue")
    assert status == 200, body
    assert body["supported"] is False and "Slurm-only" in body["message"] and body["jobs"] == body["nodes"] == []
    _documented(body, 200)
    status, body = queue_server.call("GET", "/hyperpod/clusters/no-such-cluster/queue")
    assert status == 404 and body["error"]["type"] == "UnknownCluster"
    _documented(body, 404)
    assert queue_server.call("GET", f"/hyperpod/clusters/{CLUSTER}/queue", token=False)[0] == 403
