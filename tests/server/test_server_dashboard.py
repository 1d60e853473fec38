"""``GET hyperpod/jobs/{id}/dashboard`` (issue 18): the watcher folds each tracked job's events
into a JobAggregate as it reads them and saves it with the cursor, so a request reads no event
file; an untracked job is read once, then only its new bytes. In process on the watcher with
real event files (``LocalFiles.bytes_read`` counts what is read), and on a real jupyter-server."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from benchmarks._common import track_local_job, write_events
from hyperpod_lab.events import EventWriter, LocalFiles
from hyperpod_lab.fold.aggregate import JobAggregate
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobStore

N = 20_000


def _events_with_fault(rec):
    w1 = EventWriter(rec.job_dir, "rank-1", rec.job_id)
    for s in range(0, 10):
        w1.emit("checkpoint.saved", tier="memory", step=s, rank=1)
    EventWriter(rec.job_dir, "agent-local", rec.job_id).emit("fault.detected", rank=1, node="local",
                                                              reason="exception", exitcode=1)


def test_tracked_job_answers_from_its_tailer_without_reading_and_resumes_after_restart(tmp_path):
    from hyperpod_lab.server.watch.watcher import Watcher

    client = Client(JobStore(str(tmp_path / "store")))
    rec = track_local_job(str(tmp_path / "job"), "dash-tracked", store=client.store)
    write_events(rec.job_dir, rec.job_id, N)
    _events_with_fault(rec)

    async def scenario():
        w = Watcher(client, stream_interval_s=0.05, idle_max_interval_s=0.2, read_bytes=256 << 10)
        w.start()
        first = await w.dashboard(rec.job_id, 100)
        while first["partial"]:  # the tailer's first read takes a few pages: ask again, as the tab does
            assert first["events"] < N + 11
            first = await w.dashboard(rec.job_id, 100)
        b0 = LocalFiles.bytes_read
        again = await w.dashboard(rec.job_id, 100)
        reads = LocalFiles.bytes_read - b0
        await w.stop()  # saves the aggregate with the cursor
        w3 = Watcher(client, stream_interval_s=0.05, idle_max_interval_s=0.2)
        w3.start()
        EventWriter(rec.job_dir, "rank-0", rec.job_id)  # (reads its own file for the sequence number)
        b1 = LocalFiles.bytes_read
        after = await w3.dashboard(rec.job_id, 100)
        while after["partial"]:
            after = await w3.dashboard(rec.job_id, 100)
        restart_reads = LocalFiles.bytes_read - b1
        expanded = await w3.dashboard(rec.job_id, 100, node="local")
        await w3.stop()
        return first, again, reads, after, restart_reads, expanded

    first, again, reads, after, restart_reads, expanded = asyncio.run(scenario())
    assert first["steps"] == N and first["series"]["points"] <= 100
    assert reads == 0 and again == first
    assert restart_reads < 4096, restart_reads  # resumed from the saved aggregate, not the start
    assert after == first
    # a lane per node (rank 1's fault names node "local"; rank 0 is in its block of ranks)
    assert first["nodes"] == ["local"] and set(first["lanes"]) == {"job", "local"} and first["expanded"] is None
    ck = [s for s in first["lanes"]["local"]["spans"] if s["kind"] == "checkpoint"]
    assert [(s["tier"], s["step0"], s["step1"], s["count"]) for s in ck] == [("memory", 0, 9, 10)]
    assert [m["cat"] for m in first["lanes"]["local"]["marks"]] == ["fault"]
    # expanded: the node's ranks' own lanes
    assert list(expanded["expanded"]["lanes"]) == ["0", "1"]
    assert [m["cat"] for m in expanded["expanded"]["lanes"]["1"]["marks"]] == ["fault"]
    # the same answer as folding every event from the start
    agg = JobAggregate(max_buckets=512)
    for ev in client.event_reader(rec.job_id).poll():
        agg.fold(ev)
    assert first["partial"] is False
    assert agg.summary(100) == {k: v for k, v in first.items() if k != "partial"}


# ---- on a real jupyter-server ----------------------------------------------------------------
# ``server``: a real jupyter server for the module (tests/conftest.py)


def test_dashboard_route(server, tmp_path):
    client = Client()
    rec = track_local_job(str(tmp_path / "done"), "dash-route", store=client.store)
    write_events(rec.job_dir, rec.job_id, 5000)
    _events_with_fault(rec)
    client.store.put(replace(rec, status="completed", exit_code=0))
    url = f"/hyperpod/jobs/{rec.job_id}/dashboard?points=50"
    deadline = time.monotonic() + 60
    while True:
        status, body = server.call("GET", url, timeout_s=60)
        if status == 200 and body["steps"] == 5000 and body["lanes"].get("local", {}).get("marks"):
            break
        assert time.monotonic() < deadline, (status, body)
        time.sleep(0.2)
    assert body["job_id"] == rec.job_id and body["ranks"] == 2 and body["nodes"] == ["local"]
    assert set(body) >= {"t0", "t1", "steps", "ranks", "nodes", "lanes", "expanded", "timeline", "series"}
    status, one = server.call("GET", url + "&node=local")
    assert status == 200 and list(one["expanded"]["lanes"]) == ["0", "1"], one
    for bad in ("nope", "x" * 300):
        status, err = server.call("GET", f"{url}&node={bad}")
        assert status == 400 and err["error"]["field"] == "node", err
    assert body["series"]["points"] <= 50 and len(body["series"]["loss"]) == body["series"]["points"]
    assert [e["label"] for e in body["timeline"]][:1] == ["checkpoint memory steps 0-9 (x10)"]
    for bad in ("1", "4001", "x"):
        status, err = server.call("GET", f"/hyperpod/jobs/{rec.job_id}/dashboard?points={bad}")
        assert status == 400 and err["error"]["field"] == "points", err
    status, err = server.call("GET", "/hyperpod/jobs/no-such-job/dashboard")
    assert status == 404, err
