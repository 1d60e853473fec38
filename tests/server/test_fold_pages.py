"""The server's folds read a job of many writers in reads of bounded size (issue 27).

A 2,048-rank job (44 MB of events) was parsed in one read of 1 MiB a file: 246,365 events at
once, and the jupyter server's RSS stayed ~210 MB higher after its dashboard's fold
(``benchmarks/scale.py --server-only``). Here, in-process on the real local backend: a job of
64 rank writers written by the project's own EventWriter (``benchmarks/scale.py``'s
``write_job``), the dashboard's catch-up (no tailer) and a tailer's reads (the watcher started),
each read counted in bytes (``LocalFiles.bytes_read``).
"""

from __future__ import annotations

import asyncio
import os
import time

from benchmarks._common import track_local_job
from benchmarks.scale import write_job
from hyperpod_lab.events import EventReader, LocalFiles
from hyperpod_lab.server.handlers.jobs import read_events
from hyperpod_lab.server.watch import watcher as watcher_mod
from hyperpod_lab.server.watch.tailer import new_aggregate
from hyperpod_lab.server.watch.watcher import Watcher
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobStore

TOTAL = 128 << 10
WRITERS = 64


def _counted(fn, reads: list[int]):
    def wrapped(*args, **kwargs):
        b = LocalFiles.bytes_read
        out = fn(*args, **kwargs)
        reads.append(LocalFiles.bytes_read - b)
        return out
    return wrapped


def test_fold_reads_are_bounded_whatever_the_number_of_writers(tmp_path, monkeypatch):
    """Each read of the dashboard's fold, of a tailer and of a REST events page (``read_events``,
    pages of 1,000 events from no cursor) reads at most about
    ``READ_TOTAL_BYTES`` (here 128 KiB) of a 64-writer job of ~0.8 MB (before: the whole job in
    one read), the job is read about once (each read reads again the partial last line of each
    file it holds back: rank 0's file, a step a line, gates the others), and the paged fold
    equals one fold of every event."""
    monkeypatch.setattr(watcher_mod, "READ_TOTAL_BYTES", TOTAL)
    client = Client(JobStore(str(tmp_path / "store")))
    rec = track_local_job(str(tmp_path / "job"), "pages", store=client.store)
    written = write_job(rec.job_dir, rec.job_id, WRITERS, steps=300)
    events_dir = os.path.join(rec.job_dir, "events")
    job_bytes = sum(os.path.getsize(os.path.join(events_dir, f)) for f in os.listdir(events_dir) if f.endswith(".jsonl"))
    assert job_bytes > 4 * TOTAL, job_bytes
    reference = new_aggregate()
    everything = EventReader(rec.job_dir, LocalFiles()).poll()
    for ev in everything:
        reference.fold(ev)

    async def scenario():
        # the dashboard of a job no tailer reads (the watcher is not started)
        w = Watcher(client)
        dash_reads: list[int] = []
        w._fold_page = _counted(w._fold_page, dash_reads)
        body = await w.dashboard(rec.job_id, read_budget_s=120)
        await w.stop()
        # a tailer's reads (the watcher started; nothing else reads the job)
        w = Watcher(client, stream_interval_s=0.05)
        tail_reads: list[int] = []
        w._poll_blocking = _counted(w._poll_blocking, tail_reads)
        w.start()
        t = w.tailers[rec.job_id]
        deadline = time.monotonic() + 120
        while (not t.polled or t.more) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        tail_events = t.agg.events
        await w.stop()
        return body, dash_reads, tail_reads, tail_events

    body, dash_reads, tail_reads, tail_events = asyncio.run(scenario())
    assert not body["partial"] and body["events"] == written and tail_events == written
    for what, reads in (("dashboard", dash_reads), ("tailer", tail_reads)):
        assert len(reads) > 1 and max(reads) <= 1.2 * TOTAL, (what, reads)
        assert sum(reads) <= 1.5 * job_bytes, (sum(reads), job_bytes)
    want = reference.summary(1000)
    assert {k: body[k] for k in want} == want
    # REST pages of 1,000 events from no cursor (before: the whole job parsed at the first page)
    cursor, rest_reads, keys = {}, [], []
    page = _counted(read_events, rest_reads)
    for _ in range(1000):
        events, cursor, more = page(client, rec.job_id, cursor, 1000)
        keys += [(e["writer"], e["seq"]) for e in events]
        if not events and not more:
            break
    assert keys == [(e.writer, e.seq) for e in everything]
    assert len(rest_reads) > 1 and max(rest_reads) <= 1.2 * TOTAL, rest_reads
    assert sum(rest_reads) <= 1.5 * job_bytes, (sum(rest_reads), job_bytes)
