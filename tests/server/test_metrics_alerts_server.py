"""/metrics and alerts through a real Jupyter server (issue 29 items 2 and 3): a jupyter-server
subprocess with the extension watches two real local-backend jobs (torchrun processes on this
machine): one with a fault injected (its rank SIGKILLed, the job recovers from its checkpoint)
and one that fails. Scraping ``/metrics`` shows the fault while the job runs and the recovery
after it; a webhook receiver on loopback (a real ``http.server``) that answers 500 twice gets
exactly one message per alert, without the webhook's token or the server's, also after the
server restarted."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import pytest
from jupyter_server_proc import JupyterServer
from prometheus_client.parser import text_string_to_metric_families
from webhook_receiver import TOKEN, Receiver

from hyperpod_lab.fold.facts import fold

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")
DASHBOARD = os.path.join(REPO, "docs", "grafana", "hyperpod-lab-server.json")


def scrape(srv) -> dict[tuple[str, tuple], float]:
    """``/metrics`` as ``{(sample name, sorted labels): value}``."""
    status, text = srv.call("GET", "/metrics")
    assert status == 200, (status, str(text)[:500])
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The receiver, a server with an alerts file and its own job store, and a client of that store."""
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobStore

    recv = Receiver(answers=[500, 500])
    root = tmp_path_factory.mktemp("root")
    shutil.copy(EXAMPLE, root / "train_lm.py")
    (root / "fail.py").write_text("import sys\nprint('failing on purpose', flush=True)\nsys.exit(3)\n")
    work = tmp_path_factory.mktemp("server")
    data = work / "data"
    alerts = work / "alerts.toml"
    alerts.write_text('[webhook]\nurl_env = "HYPERPOD_TEST_WEBHOOK"\nbackoff_s = 0.2\n\n'
                      '[[rules]]\non = "job_failed"\n\n[[rules]]\non = "fault"\n\n'
                      '[[rules]]\non = "low_goodput"\npercent = 99.9\n')
    srv = JupyterServer(str(root), str(work))
    with open(srv.config) as f:
        cfg = json.load(f)
    cfg["HyperPodLab"] = {"alerts_file": str(alerts), "min_interval_s": 0.5}
    with open(srv.config, "w") as f:
        json.dump(cfg, f)

    def start():
        with pytest.MonkeyPatch.context() as mp:  # the server's environment (Popen copies it)
            mp.setenv("HYPERPOD_LAB_DATA_DIR", str(data))
            mp.setenv("HYPERPOD_TEST_WEBHOOK", recv.url)
            srv.start()

    start()
    srv.restart = start
    client = Client(JobStore(str(data / "jobs")))
    yield srv, recv, client, str(data)
    srv.stop()
    recv.close()
    assert not srv.auth_warnings(), srv.auth_warnings()


def _submit(srv, **spec) -> str:
    status, body = srv.call("POST", "/hyperpod/jobs", {"spec": {"cluster": "local", "nodes": 1, **spec}})
    assert status in (200, 201), (status, body)
    return body["job"]["job_id"]


def test_metrics_show_the_fault_and_recovery_and_one_webhook_message_per_alert(world):
    srv, recv, client, data = world
    job = _submit(srv, script="train_lm.py", name="metrics-fault", procs_per_node=1,
                  args=["--steps", "30", "--step-sleep", "0.1"], checkpoint={"every_steps": 5})

    # inject the fault after the first checkpoint; scrape while the job still runs
    reader = client.event_reader(job)
    events: list = []
    during = None
    deadline = time.monotonic() + 300
    kinds: list[str] = []
    while time.monotonic() < deadline and "finished" not in kinds:
        events += reader.poll()
        kinds = [e.kind for e in events]
        if "checkpoint.saved" in kinds and "fault.detected" not in kinds and not getattr(client, "_injected", False):
            client.inject_fault(job, 0)
            client._injected = True
        if during is None and "fault.detected" in kinds:
            s = scrape(srv)
            if value(s, "hyperpod_lab_faults_total", cluster="local") >= 1:
                during = (s, list(kinds))
        time.sleep(0.2)
    assert "fault.detected" in kinds and "recovery.completed" in kinds and "finished" in kinds, kinds
    assert during is not None, "the fault never showed on /metrics while the job ran"
    s, seen = during
    assert "finished" not in seen
    assert value(s, "hyperpod_lab_jobs", cluster="local", state="running") >= 1

    assert client.wait(job, timeout_s=120).status == "completed"
    # then a job that fails (its rank exits 3, no restart)
    failing = _submit(srv, script="fail.py", name="metrics-failing", procs_per_node=1,
                      resiliency={"max_retries": 0, "auto_resume": False})
    assert client.wait(failing, timeout_s=120).status == "failed"

    # after: the recovery, its downtime, the detection latency, event lag, poll time, job states
    def settled(s):
        return (value(s, "hyperpod_lab_recoveries_total", cluster="local") >= 1
                and value(s, "hyperpod_lab_jobs", cluster="local", state="completed") == 1
                and value(s, "hyperpod_lab_jobs", cluster="local", state="failed") == 1)

    deadline = time.monotonic() + 30
    s = scrape(srv)
    while not settled(s) and time.monotonic() < deadline:
        time.sleep(0.5)
        s = scrape(srv)
    assert settled(s), {k: v for k, v in s.items() if k[0].startswith("hyperpod_lab")}
    # the same numbers as the one fold of both jobs' events (the failing job's exit is a fault
    # too, never recovered)
    facts, failed_facts = fold(events), fold(client.event_reader(failing).poll())
    assert facts.faults == 1 and facts.recoveries == 1 and failed_facts.recoveries == 0
    faults = facts.faults + failed_facts.faults
    assert value(s, "hyperpod_lab_faults_total", cluster="local") == faults
    assert value(s, "hyperpod_lab_recoveries_total", cluster="local") == 1
    assert value(s, "hyperpod_lab_recovery_downtime_seconds_count", cluster="local") == 1
    downtime = value(s, "hyperpod_lab_recovery_downtime_seconds_sum", cluster="local")
    assert downtime > 0 and downtime == pytest.approx(facts.downtime_s, abs=1e-3)
    latencies = [i["detected_at"] - i["last_step_time"] for f in (facts, failed_facts) for i in f.incidents
                 if i["last_step_time"] is not None]
    assert value(s, "hyperpod_lab_fault_detection_latency_seconds_count", cluster="local") == len(latencies) >= 1
    assert value(s, "hyperpod_lab_fault_detection_latency_seconds_sum", cluster="local") == pytest.approx(
        sum(latencies), abs=1e-3)
    assert value(s, "hyperpod_lab_event_lag_seconds_count", cluster="local") > 10
    assert value(s, "hyperpod_lab_status_poll_seconds_count", cluster="local") >= 1
    assert value(s, "hyperpod_lab_jobs", cluster="local", state="running") == 0
    # every series the Grafana dashboard in docs/ queries is served
    with open(DASHBOARD) as f:
        wanted = set(re.findall(r"hyperpod_lab_[a-z_]+", f.read()))
    served = {name for name, _ in s}
    assert wanted and wanted <= served, sorted(wanted - served)

    # the webhook: one message for the failed job, one per fault, one for the recovered job's
    # goodput (below 99.9 %: it lost time to the fault); the first POST was answered 500 twice
    # and retried
    expected = 1 + faults + 1
    deadline = time.monotonic() + 30
    while len(recv.delivered()) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # several status ticks more: nothing is sent twice
    got = recv.delivered()
    assert len([t for t in got if failing in t and t.endswith(")") and " failed (" in t]) == 1, got
    assert len([t for t in got if job in t and "fault 1 detected" in t]) == 1, got
    assert len([t for t in got if job in t and "failed" in t]) == 0, got
    assert len([t for t in got if job in t and "ended with goodput" in t]) == 1, got
    assert len(got) == expected, got
    assert recv.statuses().count(500) == 2 and len(recv.posts) == expected + 2, recv.statuses()
    for _, path, headers, body in recv.posts:
        text = body.decode()
        assert TOKEN not in text and srv.token not in text and "Authorization" not in headers
        assert set(json.loads(body)) == {"text"}
    log = srv.log_text()
    assert TOKEN not in log and recv.url not in log
    assert "retrying" in log  # the retries were logged, with [secret] for the webhook

    # a restarted server sends nothing again (the sent file) and counts no old incident
    srv.stop()
    srv.restart()
    time.sleep(4)
    assert len(recv.posts) == expected + 2, recv.statuses()
    sent = json.load(open(os.path.join(data, "alerts-sent.json")))
    assert [v["result"] for v in sent["sent"].values()] == ["delivered"] * expected
    assert value(scrape(srv), "hyperpod_lab_faults_total", cluster="local") == 0
    assert TOKEN not in srv.log_text()
