"""What a WebSocket history replay holds at once is bounded whatever the rank count (issue 27).

A replay page's events stay parsed in the server while the socket's send queue drains: the page
itself (``Subscription.leftover`` when backpressure cuts it) and what the replay's kept
``EventReader`` parsed and held back for the next page. With pages of 16 MiB all files
together (8 KiB of each of a 2,048-rank job's files, ~90,000 events parsed at once) the replay
left the jupyter server's RSS 130 MB higher (``benchmarks/scale.py --server-only``; in-process
109 MB), the job's whole growth 168 MB against the Must-show's 100 MB. All real here: a job of
512 writer files written as ``Event.to_json`` writes them (``benchmarks._common.write_events``),
the local backend, the watcher's own tailer and replay (``Watcher.subscribe``), a send queue
that drains like a socket's.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from benchmarks._common import track_local_job, write_events
from hyperpod_lab.server.watch.watcher import Watcher
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobStore

WRITERS = 512
PER_WRITER = 16
#: the most bytes of event lines a replay may hold parsed at once (2 MiB pages, 1.25x slack)
HELD_BYTES = int(2.5 * (1 << 20))


def test_a_replay_holds_a_bounded_page_and_delivers_every_event_once(tmp_path):
    """A replay of a 512-file job of ~7.7 MB (1 KiB lines) from no cursor holds at most
    ``HELD_BYTES`` of parsed event lines at once (each page as read plus what its reader held
    back; before: one page of 32 KiB a file, the whole job, 8,192 events), delivers every event
    exactly once in time order, and keeps no reader once live; the cursor store keeps one
    root of its chain in memory (before: every root, 8 here, up to 64 of ~2,051 offsets and
    deliveries each at 2,048 ranks), and tokens of its earlier roots still resolve."""
    client = Client(JobStore(str(tmp_path / "store")))
    rec = track_local_job(str(tmp_path / "job"), "replayholds", store=client.store)
    for r in range(WRITERS):
        write_events(rec.job_dir, rec.job_id, PER_WRITER, writer=f"rank-{r}", pad=900)
    written = WRITERS * PER_WRITER
    events_dir = os.path.join(rec.job_dir, "events")
    job_bytes = sum(os.path.getsize(os.path.join(events_dir, f)) for f in os.listdir(events_dir) if f.endswith(".jsonl"))
    line_bytes = job_bytes / written
    assert job_bytes > 3 * HELD_BYTES, job_bytes

    async def scenario():
        w = Watcher(client, stream_interval_s=0.05, window_events=64)
        w.start()
        t = w.tailers[rec.job_id]
        deadline = time.monotonic() + 60
        while (not t.polled or t.more) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert t.polled and not t.more, "the tailer did not read the job within 60 s"
        held, read_page = [], w._read_page

        def counted(rec_, cursor, sub=None):
            located, after = read_page(rec_, cursor, sub)
            kept = sum(len(v[2]) for v in sub.reader._held.values()) if sub is not None else 0
            held.append(len(located) + kept)
            return located, after

        w._read_page = counted
        queue: list[str] = []
        queued = [0]
        got: list[dict] = []
        subs: list = []
        marks: dict[str, dict[str, int]] = {}  # token -> the cursor it stands for, a few of them

        def send(m):
            text = json.dumps(m, default=str)
            queue.append(text)
            queued[0] += len(text)
            if m["type"] == "event":
                got.append(m["event"])
                if len(got) in (1, 700, 3000, written - 1):
                    marks[m["cursor"]] = dict(subs[0].cursor)
            return True

        async def drain():  # a socket writing ~64 messages per IOLoop turn
            while True:
                for _ in range(64):
                    if queue:
                        queued[0] -= len(queue.pop(0))
                await asyncio.sleep(0.001)

        drainer = asyncio.get_running_loop().create_task(drain())
        sub = await w.subscribe(rec.job_id, {}, send, pending=lambda: queued[0])
        subs.append(sub)
        while (len(got) < written or not sub.live) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        live, reader = sub.live, sub.reader
        roots = len(w.cursors._mem)  # the cursor store's roots in memory (each: every file's offset)
        resolved = {token: w.cursors.resolve(rec.job_id, token) for token in marks}
        drainer.cancel()
        await w.stop()
        return got, held, live, reader, roots, marks, resolved

    got, held, live, reader, roots, marks, resolved = asyncio.run(scenario())
    assert len(got) == written and len({(e["writer"], e["seq"]) for e in got}) == written, len(got)
    times = [e["time"] for e in got]
    assert times == sorted(times)
    assert max(held) * line_bytes <= HELD_BYTES, (max(held), line_bytes, held)
    assert len(held) > 1, held
    assert live and reader is None, (live, reader)
    # the cursor store keeps the subscriber's current root in memory, not every root its chain
    # made (one each 1,024 deliveries here), and the older tokens still resolve (from disk)
    assert roots <= 1, roots
    assert len(marks) == 4 and resolved == marks
