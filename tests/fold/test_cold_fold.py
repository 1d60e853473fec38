"""A long job's first fold (issue 18: "cheaper first fold of a long job"): an event reader kept
across pages keeps the parsed events a page held back (later than a truncated file's last event
read) and reads only what follows them, so a catch-up page by page reads and parses each line
once; the server's watcher keeps one reader per catch-up (dashboard, goodput, a tailer's backlog,
a subscriber's replay). Real event files on this machine (``LocalFiles.bytes_read`` counts what
is read), the real watcher in process.

The job's shape is the one that made pages expensive: rank 0 writes a step event every 10 ms,
rank 1 a checkpoint event every 100 ms (its file is small next to rank 0's, so a page of it
reaches far later than rank 0's page and most of it is held back at every page)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace

from benchmarks._common import track_local_job
from hyperpod_lab import goodput as gp
from hyperpod_lab.events import Event, EventReader, EventWriter, LocalFiles
from hyperpod_lab.fold.aggregate import JobAggregate
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobStore

STEPS = 20_000
PAGE = 64 << 10
LINE = 256  # longer than any line written here
T0 = 1.7e9


def _write_job(job_dir: str, job_id: str, steps: int = STEPS, torn_at: int | None = None) -> int:
    """rank-0: a step event per step (10 ms apart); rank-1: a checkpoint every 10 steps (and a
    torn line after checkpoint ``torn_at`` if given); agent-n1: a fault and a recovery. Returns
    the bytes written."""
    ev_dir = os.path.join(job_dir, "events")
    os.makedirs(ev_dir, exist_ok=True)
    with open(os.path.join(ev_dir, "rank-0.jsonl"), "w") as f:
        f.writelines(Event("step", job_id, T0 + i * 0.01, "rank-0", i, {"step": i, "loss": 1.0 / (i + 1)}).to_json()
                     + "\n" for i in range(steps))
    with open(os.path.join(ev_dir, "rank-1.jsonl"), "w") as f:
        for k, i in enumerate(range(0, steps, 10)):
            f.write(Event("checkpoint.saved", job_id, T0 + i * 0.01 + 0.001, "rank-1", k,
                          {"tier": "memory", "step": i, "blocked_s": 0.001, "total_s": 0.002, "rank": 1}).to_json() + "\n")
            if k == torn_at:
                f.write('{"v":1,"kind":"checkp\n')  # a writer killed mid-line
    with open(os.path.join(ev_dir, "agent-n1.jsonl"), "w") as f:
        t = T0 + steps // 2 * 0.01 + 0.005
        f.write(Event("fault.detected", job_id, t, "agent-n1", 0, {"rank": 1, "node": "n1", "exitcode": 1}).to_json() + "\n")
        f.write(Event("recovery.started", job_id, t + 0.001, "agent-n1", 1, {"restart_count": 1}).to_json() + "\n")
    return sum(os.path.getsize(os.path.join(ev_dir, n)) for n in os.listdir(ev_dir))


def _pages(job_dir: str, one_reader: bool, max_bytes: int = PAGE):
    """Read a job page by page from the start: (pages, bytes read, reader of the last page)."""
    cursor: dict[str, int] = {}
    reader, pages = None, []
    b0 = LocalFiles.bytes_read
    while True:
        if reader is None or not one_reader:
            reader = EventReader(job_dir, cursor=cursor)
        b = LocalFiles.bytes_read
        pages.append(reader.poll_located(max_bytes=max_bytes))
        assert LocalFiles.bytes_read - b <= 3 * max_bytes  # a page is bounded: at most max_bytes a file
        # what a kept reader holds back is at most one page of each file
        assert all(stop - start <= max_bytes for start, stop, _ in reader._held.values())
        cursor = dict(reader.cursor)
        if not reader.more:
            return pages, LocalFiles.bytes_read - b0, reader


def test_a_reader_kept_across_pages_reads_each_line_once_and_returns_the_same_events(tmp_path):
    size = _write_job(str(tmp_path), "j", torn_at=700)
    pages, read, reader = _pages(str(tmp_path), one_reader=True)
    fresh_pages, fresh_read, fresh = _pages(str(tmp_path), one_reader=False)
    everything = EventReader(str(tmp_path)).poll()

    got = [(ev.key, f, end) for page in pages for ev, f, end in page]
    assert len(pages) > 20  # rank 0's file is read in many pages
    # the same events in the same order as one read of everything: none lost, none twice, each
    # page in time order and the pages one after the other in time order
    assert [k for k, _, _ in got] == [ev.key for ev in everything] == [ev.key for p in fresh_pages for ev, _, _ in p]
    assert [ev.time for p in pages for ev, _, _ in p] == sorted(ev.time for ev in everything)
    for f in ("rank-0.jsonl", "rank-1.jsonl"):  # each file in position order, offsets growing
        ends = [end for _, ff, end in got if ff == f]
        assert ends == sorted(set(ends))
    assert reader.cursor == fresh.cursor == {n: os.path.getsize(tmp_path / "events" / n)
                                             for n in ("rank-0.jsonl", "rank-1.jsonl", "agent-n1.jsonl")}
    # each line read once (before: rank 1's held-back part was read and parsed again each page);
    # only the partial line after a page's last newline is read again by the next page
    assert size <= read < size + len(pages) * 2 * LINE, (read, size, len(pages))
    assert fresh_read > 1.5 * size, (fresh_read, size)
    # the torn line is reported once, not at every page that read it again
    assert len(reader.skipped) == 1 and reader.skipped[0][0] == "rank-1.jsonl"
    assert len(fresh.skipped) == 0  # (fresh readers: each page's reader had its own list)


def test_a_cursor_moved_from_outside_drops_what_was_held(tmp_path):
    _write_job(str(tmp_path), "j", steps=5_000)
    reader = EventReader(str(tmp_path))
    first = reader.poll_located(max_bytes=16 << 10)
    assert reader.more and reader._held  # rank-1's later checkpoints wait parsed
    back = {f: end for _, f, end in first[: len(first) // 2]}  # a subscriber that took half the page
    reader.cursor = dict(back)
    rest = []
    while True:
        rest += reader.poll_located(max_bytes=16 << 10)
        if not reader.more:
            break
    expected = EventReader(str(tmp_path), cursor=back).poll()
    assert [ev.key for ev, _, _ in rest] == [ev.key for ev in expected]
    # a file that shrank (replaced) is read again, not served from memory
    reader = EventReader(str(tmp_path))
    reader.poll_located(max_bytes=16 << 10)
    with open(tmp_path / "events" / "rank-1.jsonl", "r+") as f:
        f.truncate(100)
    again = reader.poll_located(max_bytes=16 << 10)
    assert all(end <= 100 for _, f, end in again if f == "rank-1.jsonl")


def _completed_job(tmp_path, client, name):
    rec = track_local_job(str(tmp_path / name), name, store=client.store)
    size = _write_job(rec.job_dir, rec.job_id)
    rec = replace(rec, status="completed", exit_code=0)
    client.store.put(rec)
    return rec, size


def test_untracked_first_fold_reads_each_byte_once_for_dashboard_and_goodput(tmp_path):
    from hyperpod_lab.server.watch.watcher import Watcher

    client = Client(JobStore(str(tmp_path / "store")))
    rec, size = _completed_job(tmp_path, client, "cold-untracked")
    everything = client.event_reader(rec.job_id).poll()

    async def scenario():
        w = Watcher(client, read_bytes=PAGE)
        assert rec.job_id not in w.tailers
        b0 = LocalFiles.bytes_read
        body = await w.dashboard(rec.job_id, 100)
        while body["partial"]:
            body = await w.dashboard(rec.job_id, 100)
        b1 = LocalFiles.bytes_read
        result = await w.goodput(rec.job_id)
        b2 = LocalFiles.bytes_read
        return body, result, b1 - b0, b2 - b1, w._dashboards[rec.job_id]["cursor"], w._goodput[rec.job_id]["cursor"]

    body, result, dash_read, gp_read, dash_cursor, gp_cursor = asyncio.run(scenario())
    agg = JobAggregate(max_buckets=512)
    for ev in everything:
        agg.fold(ev)
    assert body["events"] == len(everything) and {k: v for k, v in body.items() if k != "partial"} == agg.summary(100)
    assert result == gp.measure_from_events(everything)
    sizes = {n: os.path.getsize(os.path.join(rec.job_dir, "events", n)) for n in os.listdir(os.path.join(rec.job_dir, "events"))
             if n.endswith(".jsonl")}  # (not the change log)
    assert dash_cursor == gp_cursor == sizes
    # each line read once (but a page's partial last line): before, rank 1's held-back part
    # was read again at each page, over twice the job's bytes in all
    assert size <= dash_read < 1.05 * size and size <= gp_read < 1.05 * size, (dash_read, gp_read, size)


def test_tailer_backlog_and_replay_read_each_byte_once_and_a_restart_resumes(tmp_path):
    from hyperpod_lab.server.watch.watcher import Watcher

    client = Client(JobStore(str(tmp_path / "store")))
    rec = track_local_job(str(tmp_path / "job"), "cold-tracked", store=client.store)  # running
    size = _write_job(rec.job_dir, rec.job_id)
    everything = client.event_reader(rec.job_id).poll()

    async def caught_up(w, n):
        deadline = time.monotonic() + 60
        while True:
            t = w.tailers.get(rec.job_id)
            if t is not None and t.polled and not t.more and t.agg.events >= n:
                return t
            assert time.monotonic() < deadline, "the tailer did not catch up in 60 s"
            await asyncio.sleep(0.05)

    async def scenario():
        w = Watcher(client, stream_interval_s=0.05, idle_max_interval_s=0.2, read_bytes=PAGE, page_bytes=PAGE // 4,
                    window_events=64)
        b0 = LocalFiles.bytes_read
        w.start()
        t = await caught_up(w, len(everything))
        backlog_read = LocalFiles.bytes_read - b0
        # a subscriber from the start replays from the files in pages of page_bytes
        inbox: list = []
        b1 = LocalFiles.bytes_read
        await w.subscribe(rec.job_id, {}, lambda m: inbox.append(m) or True)
        deadline = time.monotonic() + 60
        while sum(m["type"] == "event" for m in inbox) < len(everything) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        replay_read = LocalFiles.bytes_read - b1
        await w.stop()  # saves the cursor with the progress, the goodput meter and the aggregate
        saved = client.store.get_cursor(rec.job_id)
        # a restarted server resumes from the saved cursor: one new event is all it reads
        EventWriter(rec.job_dir, "agent-n1", rec.job_id).emit("recovery.completed", restored_step=10, downtime_s=1.0)
        w3 = Watcher(client, stream_interval_s=0.05, idle_max_interval_s=0.2, read_bytes=PAGE)
        b2 = LocalFiles.bytes_read
        w3.start()
        t3 = await caught_up(w3, len(everything) + 1)
        restart_read = LocalFiles.bytes_read - b2
        await w3.stop()
        return t, inbox, backlog_read, replay_read, saved, t3, restart_read

    t, inbox, backlog_read, replay_read, saved, t3, restart_read = asyncio.run(scenario())
    assert size <= backlog_read < 1.05 * size, (backlog_read, size)  # each line once
    events = [m["event"] for m in inbox if m["type"] == "event"]
    keys = [(e["writer"], e["seq"]) for e in events]
    assert len(keys) == len(set(keys)) == len(everything)  # none lost, none twice
    assert keys == [ev.key for ev in everything]  # in time order
    assert replay_read < 1.1 * size, (replay_read, size)  # the replay read each line once too
    cursor, prog = saved
    sizes = {n: os.path.getsize(os.path.join(rec.job_dir, "events", n)) for n in ("rank-0.jsonl", "rank-1.jsonl")}
    assert {n: cursor[n] for n in sizes} == sizes
    assert prog["aggregate"] and t.agg.events == len(everything) and t.meter.facts.steps == STEPS
    assert t3.agg.events == len(everything) + 1 and restart_read < 1024, restart_read


def _reference_from_json(line):
    """Event.from_json as it was before the cheaper parse (json.loads, the dataclass's __init__)."""
    import json

    from hyperpod_lab.events import EventKind, EventSchemaError
    try:
        d = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EventSchemaError(f"not a JSON event line: {e}") from None
    if not isinstance(d, dict):
        raise EventSchemaError("an event line must be a JSON object")
    if d.get("v") != 1:
        raise EventSchemaError(f"event schema version {d.get('v')!r} is not 1; upgrade hyperpod-lab")
    try:
        return Event(kind=EventKind(d["kind"]).value, job_id=str(d["job_id"]), time=float(d["time"]),
                     writer=str(d["writer"]), seq=int(d["seq"]), data=dict(d.get("data") or {}))
    except (KeyError, ValueError, TypeError) as e:
        raise EventSchemaError(f"bad event fields: {e}") from None


def test_the_cheaper_parse_gives_the_same_events_errors_and_memory():
    import sys

    from hyperpod_lab.events import EventSchemaError

    good = Event("step", "j", 1.5, "rank-0", 7, {"step": 7, "loss": 0.25}).to_json()
    lines = [good, " " + good + " \r", good + "x", good[:-3], "", "[1]", "\ufeff" + good, '{"v":2}',
             good.replace('"step"', '"nope"', 1), good.replace('"kind":"step"', '"kind":["step"]'),
             good.replace('"seq":7', '"seq":"7"'), good.replace('"time":1.5', '"time":"x"'),
             good.replace('"seq":7', '"seq":"x"').replace('"time":1.5', '"time":"y"'),
             good.replace('{"loss":0.25,"step":7}', 'null'), good.replace('{"loss":0.25,"step":7}', '[["a",1]]'),
             good.replace('{"loss":0.25,"step":7}', '"ab"'), '{"v":1,"kind":"step"}', "\u00e9"]
    for line in lines:
        for form in (line, line.encode("utf-8", "surrogatepass")):
            try:
                want = ("ok", _reference_from_json(form))
            except EventSchemaError as e:
                want = ("error", str(e))
            try:
                got = ("ok", Event.from_json(form))
            except EventSchemaError as e:
                got = ("error", str(e))
            assert got == want, (form, got, want)
    # the instances share their dicts' keys as the constructor's do (a page of a long job holds
    # thousands of them)
    assert sys.getsizeof(Event.from_json(good).__dict__) == sys.getsizeof(_reference_from_json(good).__dict__)
