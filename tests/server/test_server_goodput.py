"""``GET hyperpod/jobs/{id}/goodput`` answers from the job's incremental goodput fold (issue 13,
finding 3: it used to read every event of the job on every request). In process, on the
watcher with real event files (``LocalFiles.bytes_read`` counts what is read), and on a real
jupyter-server (the server process's ``rchar`` from ``/proc/<pid>/io``). Each test fails on the
code before the fix (a whole read per request)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import replace

import pytest

from benchmarks._common import track_local_job, write_events
from hyperpod_lab import goodput as gp
from hyperpod_lab.events import EventWriter, LocalFiles
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobStore

N = 20_000


def _all_events(job_id: str, client: Client):
    return client.event_reader(job_id).poll()


def _finished_job(tmp_path, client, name, n=N):
    """A completed job (no tailer: the untracked path) with ``n`` step events, a checkpoint
    and a fault with its recovery."""
    rec = track_local_job(str(tmp_path / name), name, store=client.store)
    write_events(rec.job_dir, rec.job_id, n)
    w = EventWriter(rec.job_dir, "rank-1", rec.job_id)
    w.emit("checkpoint.saved", tier="memory", step=10, blocked_s=0.001, total_s=0.001)
    rec = replace(rec, status="completed", exit_code=0)
    client.store.put(rec)
    return rec


def test_untracked_job_is_read_once_then_only_its_new_bytes(tmp_path):
    from hyperpod_lab.server.watch.watcher import Watcher

    client = Client(JobStore(str(tmp_path / "store")))
    rec = _finished_job(tmp_path, client, "gp-untracked")
    size = sum(os.path.getsize(os.path.join(rec.job_dir, "events", f)) for f in os.listdir(
        os.path.join(rec.job_dir, "events")) if f.endswith(".jsonl"))

    async def scenario():
        w = Watcher(client, read_bytes=256 << 10)
        assert rec.job_id not in w.tailers
        b0 = LocalFiles.bytes_read
        first = await w.goodput(rec.job_id)
        b1 = LocalFiles.bytes_read
        second = await w.goodput(rec.job_id)
        reads_second = LocalFiles.bytes_read - b1
        EventWriter(rec.job_dir, "rank-0", rec.job_id).emit("step", step=N, loss=0.1)
        b2 = LocalFiles.bytes_read  # (the writer read its file for its sequence number)
        third = await w.goodput(rec.job_id)
        b3 = LocalFiles.bytes_read
        return first, second, third, (b1 - b0, reads_second, b3 - b2)

    first, second, third, reads = asyncio.run(scenario())
    assert reads[0] >= size  # the first request reads the job once (in pages)
    assert reads[1] == 0, reads  # before the fix: the whole job again
    assert 0 < reads[2] < 1024, reads  # only the new event
    assert first == second and first["steps"] == N and third["steps"] == N + 1
    assert json.dumps(third) and third == gp.measure_from_events(_all_events(rec.job_id, client))


def test_tracked_job_answers_from_its_tailer_and_survives_a_restart(tmp_path):
    from hyperpod_lab.server.watch.watcher import Watcher

    client = Client(JobStore(str(tmp_path / "store")))
    rec = track_local_job(str(tmp_path / "job"), "gp-tracked", store=client.store)  # running
    write_events(rec.job_dir, rec.job_id, N)
    w2 = EventWriter(rec.job_dir, "rank-1", rec.job_id)
    w2.emit("checkpoint.saved", tier="memory", step=10, blocked_s=0.001, total_s=0.001)

    async def caught_up(w, steps):
        deadline = time.monotonic() + 60
        while True:
            t = w.tailers.get(rec.job_id)
            if t is not None and t.meter is not None and t.meter.facts.steps >= steps and not t.more:
                return
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)

    async def scenario():
        w = Watcher(client, stream_interval_s=0.05, idle_max_interval_s=0.2, read_bytes=256 << 10)
        w.start()
        await caught_up(w, N)
        b0 = LocalFiles.bytes_read
        a = await w.goodput(rec.job_id)
        b = await w.goodput(rec.job_id)
        reads = LocalFiles.bytes_read - b0  # the tailer may poll meanwhile: nothing new to read
        await w.stop()  # saves cursor, progress and the meter's state
        saved = client.store.get_cursor(rec.job_id)
        # a restarted server resumes the fold: the next event is all it reads
        w2.emit("step", step=N, loss=0.1)  # (rank-1's file is small: its own read is small)
        w3 = Watcher(client, stream_interval_s=0.05, idle_max_interval_s=0.2)
        b1 = LocalFiles.bytes_read
        w3.start()
        await caught_up(w3, N + 1)
        c = await w3.goodput(rec.job_id)
        restart_reads = LocalFiles.bytes_read - b1
        await w3.stop()
        return a, b, reads, saved, c, restart_reads

    a, b, reads, saved, c, restart_reads = asyncio.run(scenario())
    assert reads == 0 and a == b and a["steps"] == N
    assert saved is not None and "goodput" in saved[1] and len(json.dumps(saved[1]["goodput"])) < 32 * 1024
    assert restart_reads < 1024, restart_reads
    assert c == gp.measure_from_events(_all_events(rec.job_id, client))


# ---- on a real jupyter-server ----------------------------------------------------------------
def _rchar(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


# ``server``: a real jupyter server for the module (tests/conftest.py)


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/io"), reason="needs /proc/<pid>/io")
def test_goodput_route_reads_only_new_bytes(server, tmp_path):
    client = Client()
    rec = _finished_job(tmp_path, client, "gp-route", n=100_000)  # ~20 MB
    size = os.path.getsize(os.path.join(rec.job_dir, "events", "rank-0.jsonl"))
    url = f"/hyperpod/jobs/{rec.job_id}/goodput"
    r0 = _rchar(server.proc.pid)
    status, body = server.call("GET", url, timeout_s=120)
    assert status == 200, body
    r1 = _rchar(server.proc.pid)
    status, again = server.call("GET", url)
    r2 = _rchar(server.proc.pid)
    assert status == 200 and again == body
    assert set(body["measured"]) >= {"goodput", "wall_s", "steps", "step_time_s", "tiers", "lost_s"}
    assert body["measured"]["steps"] == 100_000
    assert r1 - r0 >= size  # read once
    assert r2 - r1 < size / 20, (r1 - r0, r2 - r1)  # before the fix: the whole file again
    # a tracked (running) job answers from its tailer's meter
    run = track_local_job(str(tmp_path / "running"), "gp-running")
    write_events(run.job_dir, run.job_id, 5)
    deadline = time.monotonic() + 30
    while True:
        status, body = server.call("GET", f"/hyperpod/jobs/{run.job_id}/goodput")
        if status == 200 and body["measured"]["steps"] == 5:
            break
        assert time.monotonic() < deadline, (status, body)
        time.sleep(0.2)
    status, body = server.call("GET", "/hyperpod/jobs/no-such-job/goodput")
    assert status == 404, body
