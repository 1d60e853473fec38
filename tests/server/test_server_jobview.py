"""The server's JobView carries the fold's excluded nodes and node health (``progress.excluded_nodes``,
``progress.health``), and a subscriber gets a ``status`` message right after the event that
excluded a node or failed a node's health check. In process, on the watcher with a local job's
real event files (no cluster)."""

from __future__ import annotations

import asyncio
import json
import time

from benchmarks._common import track_local_job
from hyperpod_lab.events import EventWriter
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobStore


def _passed():
    return {"status": "passed", "detail": "", "seconds": 0.1}


def test_jobview_exposes_excluded_nodes_and_health_and_status_follows_them(tmp_path):
    from hyperpod_lab.server.watch.watcher import Watcher

    client = Client(JobStore(str(tmp_path / "store")))
    rec = track_local_job(str(tmp_path / "job"), "jobview-health", store=client.store)  # running
    h0 = EventWriter(rec.job_dir, "health-n0", rec.job_id)
    h1 = EventWriter(rec.job_dir, "health-n1", rec.job_id)
    sup = EventWriter(rec.job_dir, "supervisor", rec.job_id)
    shm = {"status": "failed", "detail": "/dev/shm is 64 MiB, needs 1 GiB", "seconds": 0.1}

    async def wait_for(pred, what, timeout_s=30.0):
        deadline = time.monotonic() + timeout_s
        while not pred():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.05)

    async def scenario():
        w = Watcher(client, stream_interval_s=0.05, idle_max_interval_s=0.2)
        w.start()
        msgs: list[dict] = []
        await w.subscribe(rec.job_id, {}, lambda m: msgs.append(json.loads(json.dumps(m))) or True)

        def statuses():
            return [m["job"]["progress"] for m in msgs if m["type"] == "status"]

        await wait_for(lambda: statuses(), "the first status message")
        first = len(statuses())
        h0.emit("health.checked", node="n0", run_id="r1", ok=True, seconds=1.5,
                checks={"gpu": _passed(), "clock": {"status": "skipped", "detail": "no chrony", "seconds": 0.0}})
        await wait_for(lambda: sum(m["type"] == "event" for m in msgs) >= 1, "the n0 health event")
        passed_only = len(statuses())
        h1.emit("health.failed", node="n1", run_id="r1", check="shm", detail=shm["detail"])
        h1.emit("health.checked", node="n1", run_id="r1", ok=False, seconds=2.0,
                checks={"gpu": _passed(), "shm": shm})
        await wait_for(lambda: any(p["health"].get("n1", {}).get("ok") is False for p in statuses()),
                       "a status message naming n1's failed check")
        sup.emit("node.excluded", node="n1", reason="health check failed: shm", faults=0, excluded=["n1"])
        await wait_for(lambda: any(p["excluded_nodes"] for p in statuses()), "a status message after the exclusion")
        h0.emit("straggler.detected", rank=0, node="n0", score=2.1, step_s=0.4, median_step_s=0.2,
                compute_s=0.38, median_compute_s=0.18, wait_s=0.02, window=16, action="report")
        await wait_for(lambda: any(p.get("stragglers") for p in statuses()), "a status message naming the straggler")
        view = w.view(client.store.get(rec.job_id))
        listed = next(j for j in w.jobs() if j["job_id"] == rec.job_id)
        await w.stop()
        return first, passed_only, statuses(), view, listed

    first, passed_only, statuses, view, listed = asyncio.run(scenario())
    assert passed_only == first  # a node that passed changes nothing a client notifies from
    last = statuses[-1]
    assert [(x["node"], x["reason"], x["faults"]) for x in last["excluded_nodes"]] == [
        ("n1", "health check failed: shm", 0)]
    assert last["health"]["n1"]["failed"] == {"shm": "/dev/shm is 64 MiB, needs 1 GiB"}
    assert last["faults"] == 0 and last["recoveries"] == 0  # a failed health check is no fault
    assert [(x["rank"], x["node"], x["score"]) for x in last["stragglers"]] == [(0, "n0", 2.1)]
    for p in (view["progress"], listed["progress"]):  # GET jobs/{id} and GET jobs carry the same
        assert p["excluded_nodes"] == last["excluded_nodes"]
        assert p["health"]["n0"] == {"ok": True, "failed": {}, "skipped": ["clock"], "seconds": 1.5,
                                     "time": p["health"]["n0"]["time"], "run": 0}
        assert p["health"]["n1"]["ok"] is False and p["preflight_s"] > 0
    # what the store kept resumes with the same facts (a restarted server)
    saved = client.store.get_cursor(rec.job_id)
    assert saved is not None and saved[1]["excluded_nodes"] == last["excluded_nodes"]
