"""The jupyter-server extension, run for real: a jupyter-server subprocess with
``allow_unauthenticated_access=False`` and a token, jobs on the real dev cluster (Slurm over SSH),
HTTP and WebSocket clients on loopback. Also the server killed with SIGKILL mid-job and restarted,
and the OpenAPI document walked against the running server."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections import Counter

import pytest
import yaml
from jupyter_server_proc import JupyterServer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")
OPENAPI = os.path.join(REPO, "docs", "openapi.yaml")


@pytest.fixture(scope="module")
def server(dev_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    shutil.copy(EXAMPLE, root / "train_lm.py")
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": "%load_ext hyperpod_lab\nimport sys\n!echo hi\nprint('from a notebook', sys.argv)"}]}
    (root / "nb.ipynb").write_text(json.dumps(nb))
    srv = JupyterServer(str(root), str(tmp_path_factory.mktemp("server"))).start()
    yield srv
    srv.stop()
    assert not srv.auth_warnings(), srv.auth_warnings()


def spec(**over):
    s = {"script": "train_lm.py", "cluster": "local-slurm", "nodes": 1, "procs_per_node": 1,
         "args": ["--steps", "40", "--step-sleep", "0.1"], "checkpoint": {"every_steps": 10}}
    s.update(over)
    return s


def stream(srv, job_id, cursor=None, on_message=None, timeout_s=240.0):
    """All messages of the job's WebSocket until ``end`` (or the server closes)."""
    import websocket

    path = f"/hyperpod/jobs/{job_id}/stream" + (f"?cursor={cursor}" if cursor else "")
    ws = srv.ws(path, timeout_s=timeout_s)
    msgs, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                m = json.loads(ws.recv())
            except websocket.WebSocketConnectionClosedException:
                break
            msgs.append(m)
            if on_message is not None and on_message(m, msgs) is False:
                break
            if m["type"] == "end":
                break
    finally:
        ws.close()
    return msgs


def keys(events):
    return [(e["writer"], e["seq"]) for e in events]


def no_gaps(events):
    by_writer = {}
    for w, s in keys(events):
        by_writer.setdefault(w, []).append(s)
    return all(sorted(v) == list(range(len(v))) for v in by_writer.values())


# ---- auth and bad input ----------------------------------------------------------------
def route_paths():
    from hyperpod_lab.server.handlers import handlers

    return [(re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: "{" + m.group(1) + "}", p), cls) for p, cls in handlers()]


def test_every_route_refuses_unauthenticated_requests(server):
    import websocket

    sample = {"name": "local-slurm", "job_id": "nope-1"}
    checked = 0
    for path, cls in route_paths():
        url = "/" + path.format(**sample)
        if path.endswith("/stream"):
            with pytest.raises(websocket.WebSocketBadStatusException) as e:
                server.ws(url, token=False)
            assert e.value.status_code == 403, url
            checked += 1
            continue
        for method in ("GET", "POST", "DELETE"):
            if method.lower() in vars(cls):
                status, _ = server.call(method, url, body={}, token=False)
                assert status == 403, (method, url, status)
                checked += 1
    assert checked >= 10
    # with a token but a wrong one: still 403
    server_token, server.token = server.token, "wrong"
    try:
        assert server.call("GET", "/hyperpod/jobs")[0] == 403
    finally:
        server.token = server_token
    assert not server.auth_warnings(), server.auth_warnings()


def test_every_route_asks_the_authorizer(dev_cluster, tmp_path):
    """A server whose authorizer denies the 'hyperpod' resource: an authenticated user gets 403
    on every route (REST and WebSocket) while Jupyter's own API still answers."""
    import websocket

    srv = JupyterServer(str(tmp_path), str(tmp_path)).start(
        60.0, "--ServerApp.authorizer_class=jupyter_server_proc.DenyHyperPod")
    try:
        assert srv.call("GET", "/api/status")[0] == 200
        for path, cls in route_paths():
            url = "/" + path.format(name="local-slurm", job_id="nope-1")
            if path.endswith("/stream"):
                with pytest.raises(websocket.WebSocketBadStatusException) as e:
                    srv.ws(url)
                assert e.value.status_code == 403, url
                continue
            for method in ("GET", "POST"):
                if method.lower() in vars(cls):
                    assert srv.call(method, url, body={})[0] == 403, (method, url)
    finally:
        srv.stop()
    assert not srv.auth_warnings(), srv.auth_warnings()


def test_cookie_authenticated_writes_need_the_xsrf_token(server):
    import urllib.error
    import urllib.request

    with urllib.request.urlopen(f"{server.url}/api/status?token={server.token}") as r:  # the login cookie
        cookies = [c.split(";", 1)[0] for c in r.headers.get_all("Set-Cookie")]
    assert cookies

    def post(extra_cookie: str = "", xsrf: str | None = None) -> tuple[int, str]:
        req = urllib.request.Request(f"{server.url}/hyperpod/jobs", data=b"{}", method="POST")
        req.add_header("Cookie", "; ".join(cookies + ([extra_cookie] if extra_cookie else [])))
        if xsrf:
            req.add_header("X-XSRFToken", xsrf)
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    assert post()[0] == 403 and "_xsrf" in post()[1]
    assert post("_xsrf=abc123", "other")[0] == 403
    status, body = post("_xsrf=abc123", "abc123")  # past the XSRF check: the (empty) request is judged
    assert status == 400 and json.loads(body)["error"]["field"] == "spec"


def test_bad_input_names_the_problem(server):
    status, body = server.call("POST", "/hyperpod/jobs", {"spec": spec(nodes=0)})
    assert status == 400 and body["error"]["type"] == "SpecError" and body["error"]["field"] == "nodes", body
    status, body = server.call("POST", "/hyperpod/jobs", {"spec": spec(checkpoint={"every_step": 5})})
    assert status == 400 and body["error"]["field"] == "checkpoint.every_step", body
    status, body = server.call("POST", "/hyperpod/jobs", raw=b"{not json")
    assert status == 400 and body["error"]["field"] == "body", body
    status, body = server.call("POST", "/hyperpod/jobs", {"spec": spec(script="../../etc/passwd")})
    assert status == 400 and body["error"]["field"] == "script" and "outside" in body["error"]["message"], body
    status, body = server.call("POST", "/hyperpod/jobs", {"spec": spec(cluster="nowhere")})
    assert status == 404 and body["error"]["type"] == "UnknownCluster", body
    status, body = server.call("GET", "/hyperpod/jobs/nope-1")
    assert status == 404 and body["error"]["type"] == "UnknownJob", body
    status, body = server.call("GET", "/hyperpod/clusters/nowhere")
    assert status == 404 and "local-slurm" in body["error"]["message"], body
    status, body = server.call("GET", "/hyperpod/jobs/nope-1/events?cursor=!!")
    assert status == 400 and body["error"]["field"] == "cursor", body
    assert server.call("GET", "/hyperpod/jobs")[0] == 200  # nothing half-recorded
    assert all(j["spec"]["nodes"] != 0 for j in server.call("GET", "/hyperpod/jobs")[1]["jobs"])


def test_clusters_and_node_health(dev_cluster, server):
    status, body = server.call("GET", "/hyperpod/clusters")
    assert status == 200 and {"local", "local-slurm"} <= {c["name"] for c in body["clusters"]}
    status, body = server.call("GET", "/hyperpod/clusters/local-slurm")
    assert status == 200 and body["state"] == "up" and body["error"] is None
    assert {n["name"] for n in body["nodes"]} == {"n1", "n2", "n3"} and all("dev" in n["partitions"] for n in body["nodes"])


# ---- a job through the API ---------------------------------------------------------------
@pytest.fixture(scope="module")
def faulted_job(server):
    """A job submitted through POST jobs, followed on the WebSocket; rank 0 is killed through
    POST faults after the first checkpoint. Returns the responses and messages."""
    status, submitted = server.call("POST", "/hyperpod/jobs", {"spec": spec()})
    assert status == 201, submitted
    job_id = submitted["job"]["job_id"]
    fault = {}

    def on_message(m, msgs):
        if m["type"] == "event" and m["event"]["kind"] == "checkpoint.saved" and not fault:
            fault["status"], fault["body"] = server.call("POST", f"/hyperpod/jobs/{job_id}/faults", {"rank": 0})

    msgs = stream(server, job_id, on_message=on_message)
    return {"job_id": job_id, "submitted": submitted, "fault": fault, "msgs": msgs}


def test_submit_stream_fault_and_recovery(server, faulted_job):
    msgs, job_id = faulted_job["msgs"], faulted_job["job_id"]
    assert faulted_job["fault"]["status"] == 200, faulted_job["fault"]
    assert faulted_job["fault"]["body"]["rank"] == 0 and faulted_job["fault"]["body"]["pid"] > 0
    assert msgs[0]["type"] == "status" and msgs[-1]["type"] == "end", [m["type"] for m in msgs[-3:]]
    events = [m["event"] for m in msgs if m["type"] == "event"]
    kinds = [e["kind"] for e in events]
    order = ["submitted", "started", "checkpoint.saved", "fault.detected", "recovery.completed", "finished"]
    assert all(k in kinds for k in order), kinds
    idx = [kinds.index(k) for k in order]
    assert idx == sorted(idx), kinds
    assert not [k for k, n in Counter(keys(events)).items() if n > 1] and no_gaps(events)
    rec_done = events[kinds.index("recovery.completed")]
    assert rec_done["data"]["downtime_s"] > 0
    status, job = server.call("GET", f"/hyperpod/jobs/{job_id}")
    assert status == 200 and job["job"]["status"] == "completed", job
    prog = job["job"]["progress"]
    assert prog["faults"] >= 1 and prog["recoveries"] >= 1 and prog["step"] == 39 and prog["total_steps"] == 40
    # the fold's nodes: a worker killed once excludes no node; pre-flight results (if the job ran them) per node
    assert prog["excluded_nodes"] == [] and all(isinstance(h["ok"], bool) for h in prog["health"].values())
    listed = server.call("GET", "/hyperpod/jobs")[1]["jobs"]
    assert listed[0]["job_id"] == job_id or job_id in [j["job_id"] for j in listed]
    # a finished job cannot take a fault: 409 naming the state
    status, body = server.call("POST", f"/hyperpod/jobs/{job_id}/faults", {"rank": 0})
    assert status == 409 and body["error"]["type"] == "JobStateError" and "completed" in body["error"]["message"]
    status, body = server.call("POST", f"/hyperpod/jobs/{job_id}/faults", {"rank": "zero"})
    assert status == 400 and body["error"]["field"] == "rank"
    # per-rank logs
    status, body = server.call("GET", f"/hyperpod/jobs/{job_id}/logs?rank=0")
    assert status == 200 and body["rank"] == 0 and "step" in body["text"]


def test_events_with_cursor_pages_and_ws_resume(server, faulted_job):
    job_id = faulted_job["job_id"]
    ws_events = [m["event"] for m in faulted_job["msgs"] if m["type"] == "event"]
    pages, cursor = [], None
    while True:
        q = "?limit=7" + (f"&cursor={cursor}" if cursor else "")
        status, body = server.call("GET", f"/hyperpod/jobs/{job_id}/events{q}")
        assert status == 200
        if not body["events"]:
            break
        assert len(body["events"]) <= 7
        pages += body["events"]
        cursor = body["cursor"]
    assert sorted(keys(pages)) == sorted(keys(ws_events)) and len(set(keys(pages))) == len(pages)
    # the WebSocket resumes from any message's cursor with exactly the rest
    event_msgs = [m for m in faulted_job["msgs"] if m["type"] == "event"]
    mid = len(event_msgs) // 2
    rest = stream(server, job_id, cursor=event_msgs[mid]["cursor"], timeout_s=60)
    assert rest[-1]["type"] == "end"
    got = keys([m["event"] for m in rest if m["type"] == "event"])
    assert sorted(got) == sorted(keys([m["event"] for m in event_msgs[mid + 1:]]))


def test_submit_notebook_as_script(server):
    status, body = server.call("POST", "/hyperpod/jobs", {"spec": {"cluster": "local", "args": []},
                                                          "notebook": "nb.ipynb"})
    assert status == 201, body
    script = body["job"]["spec"]["script"]
    text = open(script).read()
    assert "print('from a notebook'" in text and "%load_ext" not in text and "!echo" not in text
    assert script.startswith(server.root_dir) and body["job"]["name"] == "nb"
    msgs = stream(server, body["job"]["job_id"], timeout_s=120)
    assert msgs[-1]["type"] == "end", msgs[-3:]
    status, logs = server.call("GET", f"/hyperpod/jobs/{body['job']['job_id']}/logs")
    assert "from a notebook" in logs["text"], logs


# ---- restart ----------------------------------------------------------------------------------
def test_server_killed_mid_job_resumes_from_cursor(server):
    status, body = server.call("POST", "/hyperpod/jobs", {"spec": spec(args=["--steps", "400", "--step-sleep", "0.1"])})
    assert status == 201, body
    job_id = body["job"]["job_id"]

    def three_steps(m, msgs):
        return sum(x["type"] == "event" and x["event"]["kind"] == "step" for x in msgs) < 3

    before = stream(server, job_id, on_message=three_steps, timeout_s=180)
    cursor = [m for m in before if m["type"] == "event"][-1]["cursor"]
    server.kill()  # SIGKILL: no shutdown hook runs
    server.start()
    status, listed = server.call("GET", "/hyperpod/jobs")
    assert status == 200 and job_id in [j["job_id"] for j in listed["jobs"]]
    assert [j for j in listed["jobs"] if j["job_id"] == job_id][0]["status"] in ("pending", "running")
    cancel = {}

    def cancel_after_three_more(m, msgs):
        n = sum(x["type"] == "event" and x["event"]["kind"] == "step" for x in msgs)
        if n >= 3 and not cancel:
            cancel["resp"] = server.call("POST", f"/hyperpod/jobs/{job_id}/cancel")

    after = stream(server, job_id, cursor=cursor, on_message=cancel_after_three_more, timeout_s=180)
    assert cancel["resp"][0] == 200, cancel
    assert after[-1]["type"] == "end"
    events = [m["event"] for m in before + after if m["type"] == "event"]
    dupes = [k for k, n in Counter(keys(events)).items() if n > 1]
    assert not dupes, dupes
    assert no_gaps(events), keys(events)
    assert events[-1]["kind"] == "finished" and events[-1]["data"]["status"] == "cancelled"
    assert server.call("GET", f"/hyperpod/jobs/{job_id}")[1]["job"]["status"] == "cancelled"


# ---- the OpenAPI document ---------------------------------------------------------------
def test_openapi_document_matches_server(server, faulted_job):
    import websocket
    from jsonschema import Draft202012Validator
    from openapi_spec_validator import validate as validate_spec
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    with open(OPENAPI) as f:
        doc = yaml.safe_load(f)
    validate_spec(doc)
    documented = {p for p in doc["paths"]}
    registered = {"/" + p for p, _ in route_paths()}
    assert registered == documented, (registered - documented, documented - registered)

    registry = Registry().with_resource("urn:api", Resource.from_contents(doc, default_specification=DRAFT202012))

    def check(pointer: str, instance):
        Draft202012Validator({"$ref": "urn:api#" + pointer}, registry=registry).validate(instance)

    def pointer(*parts):
        return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)

    job_id = faulted_job["job_id"]
    params = {"name": "local-slurm", "job_id": job_id}
    bodies = {("post", "/hyperpod/jobs"): {"spec": spec(nodes=0)},  # 400 here; the 201 comes from the fixture
              ("post", "/hyperpod/jobs/{job_id}/faults"): {"rank": 0},
              ("post", "/hyperpod/jobs/{job_id}/cancel"): {}}
    recorded = {("post", "/hyperpod/jobs"): (201, faulted_job["submitted"]),
                ("post", "/hyperpod/jobs/{job_id}/faults"): (200, faulted_job["fault"]["body"])}
    walked = 0
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            url = path.format(**params)
            if op.get("x-websocket"):
                msgs = stream(server, job_id, timeout_s=60)
                assert msgs[-1]["type"] == "end"
                for m in msgs:
                    check(pointer("paths", path, method, "responses", "101", "content", "application/json", "schema"), m)
                with pytest.raises(websocket.WebSocketBadStatusException) as e:
                    server.ws(path.format(name="x", job_id="nope-1"))
                assert str(e.value.status_code) in op["responses"]
                walked += 1
                continue
            answers = [server.call(method.upper(), url, bodies.get((method, path)))]
            if (method, path) in recorded:
                answers.append(recorded[(method, path)])
            answers.append(server.call(method.upper(), url, bodies.get((method, path)), token=False))
            for status, body in answers:
                assert str(status) in op["responses"], (method, path, status, body)
                resp = op["responses"][str(status)]
                where = pointer("paths", path, method, "responses", str(status))
                if "$ref" in resp:
                    where = resp["$ref"][1:]
                    resp = doc["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
                check(where + pointer("content", "application/json", "schema"), body)
            walked += 1
    assert walked == sum(1 for item in doc["paths"].values() for m in item if m != "parameters")


# ---- goodput for the submit form and the job view --------------------------------------
def test_goodput_advice_and_a_jobs_measured_goodput(server, faulted_job):
    q = "instances=512&failure_rate=0.04%25&checkpoint_cost_s=30&step_time_s=2"
    status, body = server.call("GET", "/hyperpod/goodput/advice?" + q)
    assert status == 200, body
    cr = body["advice"]["modes"]["checkpoint-restart"]
    assert cr["interval_steps"] == 504 and 0.85 < cr["goodput"] < 0.95
    assert body["advice"]["modes"]["checkpointless"]["goodput"] > cr["goodput"]
    status, body = server.call("GET", "/hyperpod/goodput/advice?instances=512&failure_rate=4&checkpoint_cost_s=30&step_time_s=2")
    assert status == 400 and "%" in body["error"]["message"], body
    assert server.call("GET", "/hyperpod/goodput/advice?" + q, token=False)[0] == 403

    status, body = server.call("GET", f"/hyperpod/jobs/{faulted_job['job_id']}/goodput")
    assert status == 200, body
    m = body["measured"]
    assert 0 < m["goodput"] <= 1 and m["step_time_s"] > 0 and len(m["recoveries"]) >= 1, m
