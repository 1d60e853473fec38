"""The server's watcher in-process, on the real local backend and real event files: one batched
status refresh for all jobs, one event reader per job shared by every subscriber (tab), and an
``end`` for each subscriber when the job ends. Calls are counted by wrapping the real Client
methods (they still run)."""

from __future__ import annotations

import asyncio
import os
import time

from hyperpod_lab.events import EventWriter, decode_cursor
from hyperpod_lab.server.watch.watcher import Watcher
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobRecord, JobStore


def test_one_batched_refresh_and_one_reader_per_job_for_many_tabs(tmp_path):
    client = Client(JobStore(str(tmp_path / "store")))
    recs = []
    for i in range(5):
        d = tmp_path / f"job{i}"
        (d / "events").mkdir(parents=True)
        # native id: this test's own process, alive for the whole test -> "running"
        rec = JobRecord(job_id=f"w-{i}", name="w", cluster="local", orchestrator="local", native_id=str(os.getpid()),
                        job_dir=str(d), spec={"args": ["--steps", "3"]})
        client.store.put(rec)
        recs.append(rec)
    calls = {"refresh": [], "reader": []}
    refresh, event_reader = client.refresh, client.event_reader
    client.refresh = lambda records: (calls["refresh"].append(len(records)), refresh(records))[1]
    client.event_reader = lambda job_id, cursor=None: (calls["reader"].append(job_id), event_reader(job_id, cursor))[1]

    async def scenario():
        w = Watcher(client, min_interval_s=0.2, max_interval_s=1.0, stream_interval_s=0.1, idle_max_interval_s=2.0)
        w.start()
        tabs = [[] for _ in range(10)]
        for inbox in tabs:
            await w.subscribe("w-0", {}, lambda m, inbox=inbox: inbox.append(m) or True)
        writer = EventWriter(recs[0].job_dir, "rank-0", "w-0")
        for step in range(3):
            writer.emit("step", step=step, loss=1.0 / (step + 1))
            await asyncio.sleep(0.3)
        t0 = time.monotonic()
        calls["reader"].clear()
        await asyncio.sleep(2.0)
        reads_w0 = calls["reader"].count("w-0") / (time.monotonic() - t0)
        writer.emit("finished", status="succeeded", steps=3, final_loss=0.33)
        with open(os.path.join(recs[0].job_dir, "exit_code"), "w") as f:
            f.write("0\n")
        deadline = time.monotonic() + 20
        while not all(inbox and inbox[-1]["type"] == "end" for inbox in tabs) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        jobs = w.jobs()
        await w.stop()
        return tabs, reads_w0, jobs

    tabs, reads_w0, jobs = asyncio.run(scenario())
    # status: every refresh covered all running jobs at once (never one per job)
    assert calls["refresh"] and all(n >= 1 for n in calls["refresh"])
    assert max(calls["refresh"]) == 5
    # events: ~1 read of the watched job per stream interval (0.1 s), not 10 (one per tab)
    assert reads_w0 <= 1 / 0.1 * 1.5, reads_w0
    for inbox in tabs:
        kinds = [m["type"] for m in inbox]
        assert kinds[0] == "status" and kinds[-1] == "end", kinds
        events = [m["event"] for m in inbox if m["type"] == "event"]
        assert [e["kind"] for e in events] == ["step", "step", "step", "finished"]
        assert [m for m in inbox if m["type"] == "status"][-1]["job"]["status"] == "completed"
        assert decode_cursor([m for m in inbox if m["type"] == "event"][-1]["cursor"])["rank-0.jsonl"] > 0
    view = {j["job_id"]: j for j in jobs}["w-0"]
    assert view["progress"]["step"] == 2 and view["progress"]["total_steps"] == 3 and view["progress"]["loss"] == 0.33
    saved = client.store.get_cursor("w-0")
    assert saved and saved[1]["step"] == 2  # the progress survives a restart


def test_poll_located_keeps_file_order_so_per_event_cursors_never_skip(tmp_path):
    from hyperpod_lab.events import EventReader

    clock = iter([10.0, 5.0, 12.0]).__next__  # a clock step backwards inside one writer
    a = EventWriter(str(tmp_path), "rank-0", "j", clock=clock)
    for step in range(3):
        a.emit("step", step=step, loss=1.0)
    EventWriter(str(tmp_path), "agent-n1", "j", clock=lambda: 11.0).emit("fault.detected", rank=1)
    located = EventReader(str(tmp_path)).poll_located()
    rank0 = [ev.seq for ev, f, _ in located if f == "rank-0.jsonl"]
    assert rank0 == [0, 1, 2]  # file order kept despite the clock
    # resuming after each event from its (file, offset) gives exactly the rest
    for i, (ev, fname, end) in enumerate(located):
        cursor = {}
        for e2, f2, o2 in located[: i + 1]:
            cursor[f2] = o2
        rest = EventReader(str(tmp_path), cursor=cursor).poll()
        assert sorted(e.key for e in rest) == sorted(e.key for e, _, _ in located[i + 1:])


def test_status_is_sent_when_faults_or_recoveries_change(tmp_path):
    """A streamed job's subscribers get a status message right after the event that opens a
    failure incident and after the one that recovers it (not for the second agent's report of
    the same incident), with the fold's progress."""
    client = Client(JobStore(str(tmp_path / "store")))
    d = tmp_path / "job"
    (d / "events").mkdir(parents=True)
    rec = JobRecord(job_id="f-1", name="f", cluster="local", orchestrator="local", native_id=str(os.getpid()),
                    job_dir=str(d), spec={"args": ["--steps", "10"]})
    client.store.put(rec)
    clock = [100.0]
    writers = {n: EventWriter(str(d), n, "f-1", clock=lambda: clock[0]) for n in ("rank-0", "agent-n0", "agent-n1")}

    async def scenario():
        w = Watcher(client, min_interval_s=0.2, max_interval_s=1.0, stream_interval_s=0.05, idle_max_interval_s=2.0)
        w.start()
        inbox = []
        await w.subscribe("f-1", {}, lambda m: inbox.append(m) or True)
        for at, writer, kind, data in [(100.0, "rank-0", "step", {"step": 4, "loss": 1.0}),
                                       (101.0, "agent-n1", "fault.detected", {"rank": 1}),
                                       (101.2, "agent-n0", "fault.detected", {"rank": 0}),
                                       (105.0, "rank-0", "recovery.completed", {"restored_step": 3, "restart_count": 1,
                                                                                "downtime_s": 4.0}),
                                       (105.0, "rank-0", "step", {"step": 4, "loss": 1.0})]:
            clock[0] = at
            writers[writer].emit(kind, **data)
            await asyncio.sleep(0.3)
        await w.stop()
        return inbox

    inbox = asyncio.run(scenario())
    kinds = [m["event"]["kind"] if m["type"] == "event" else m["type"] for m in inbox]
    assert [k for k in kinds if k != "status"] == ["step", "fault.detected", "fault.detected",
                                                   "recovery.completed", "step"], kinds
    first_fault, recovery = kinds.index("fault.detected"), kinds.index("recovery.completed")
    opened, recovered = inbox[first_fault + 1], inbox[recovery + 1]  # right after the event
    assert opened["type"] == recovered["type"] == "status", kinds
    # (the status loop may also send one for the pending -> running change; it changes no count)
    counts = [(m["job"]["progress"]["faults"], m["job"]["progress"]["recoveries"]) for m in inbox if m["type"] == "status"]
    assert [c for i, c in enumerate(counts) if i == 0 or c != counts[i - 1]] == [(0, 0), (1, 0), (1, 1)]
    opened, recovered = opened["job"]["progress"], recovered["job"]["progress"]
    assert (opened["faults"], opened["recoveries"], opened["downtime_s"], opened["last_downtime_s"]) == (1, 0, 0.0, None)
    assert (recovered["faults"], recovered["recoveries"]) == (1, 1)
    assert recovered["downtime_s"] == recovered["last_downtime_s"] == 4.0
    assert recovered["fault_events"] == 2


def test_a_summary_saved_before_the_facts_fold_is_rebuilt_from_the_events():
    from hyperpod_lab.server.watch.tailer import Tailer

    rec = JobRecord(job_id="o-1", name="o", cluster="local", orchestrator="local", native_id="1",
                    job_dir="/nonexistent", spec={})
    old = {"step": 3, "total_steps": 9, "loss": 1.0, "steps_per_s": 2.0, "last_event": None, "faults": 2,
           "recoveries": 1}  # 'faults' then counted raw fault.detected events
    t = Tailer(rec, {"rank-0.jsonl": 100}, old)
    assert t.base == {} and t.cursor == {} and t.progress.faults == 0
    new = Tailer(rec, {"rank-0.jsonl": 100}, t.progress.to_dict())  # the fold's own summary resumes
    assert new.base == {"rank-0.jsonl": 100}


def test_a_subscriber_gets_the_terminal_status_before_end_even_when_the_status_loop_is_asleep(tmp_path):
    """The events side can see a terminal record (stored by a refresh in a worker thread, or by
    another process such as the CLI) before the status loop sends it; a fresh-clone run saw a tab
    whose last status said 'running' after 'end'. Here the status loop sleeps 30 s after its first
    tick, so only the end path can deliver the terminal status."""
    client = Client(JobStore(str(tmp_path / "store")))
    d = tmp_path / "job"
    (d / "events").mkdir(parents=True)
    rec = JobRecord(job_id="t-0", name="t", cluster="local", orchestrator="local", native_id=str(os.getpid()),
                    job_dir=str(d), spec={"args": []})
    client.store.put(rec)

    async def scenario():
        w = Watcher(client, min_interval_s=30.0, max_interval_s=30.0, stream_interval_s=0.05, idle_max_interval_s=0.2)
        w.start()
        inbox: list[dict] = []
        await w.subscribe("t-0", {}, lambda m: inbox.append(m) or True)
        deadline = time.monotonic() + 10
        while not any(m["type"] == "status" for m in inbox) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the status loop is now asleep for 30 s
        done = client.store.get("t-0")
        done.status, done.exit_code = "completed", 0
        client.store.put(done)  # as another process (the CLI) would
        EventWriter(str(d), "rank-0", "t-0").emit("finished", status="succeeded", steps=0, final_loss=None)
        deadline = time.monotonic() + 10
        while not (inbox and inbox[-1]["type"] == "end") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await w.stop()
        return inbox

    inbox = asyncio.run(scenario())
    kinds = [m["type"] for m in inbox]
    assert kinds[-1] == "end", kinds
    assert [m for m in inbox if m["type"] == "status"][-1]["job"]["status"] == "completed", inbox


def test_event_lag_counts_live_events_not_a_history_read_in_pages(tmp_path):
    """``hyperpod_lab_event_lag_seconds`` (docs/metrics.md): a job's history, read in bounded pages
    (here 2 KiB a read: many pages), adds nothing to the lag histogram; events written after the
    watcher caught up each add one sample. Before, every page after the first counted its old
    events (their age, hours for a long job) as lag."""
    from prometheus_client import CollectorRegistry

    from hyperpod_lab.server.metrics import ServerMetrics

    client = Client(JobStore(str(tmp_path / "store")))
    d = tmp_path / "job"
    (d / "events").mkdir(parents=True)
    rec = JobRecord(job_id="lag-1", name="lag", cluster="local", orchestrator="local", native_id=str(os.getpid()),
                    job_dir=str(d), spec={})
    client.store.put(rec)
    old = EventWriter(str(d), "rank-0", "lag-1", clock=lambda: time.time() - 3600)
    for step in range(400):  # ~40 KB: 20 reads of 2 KiB
        old.emit("step", step=step, loss=1.0)
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry)

    def lag_count():
        return registry.get_sample_value("hyperpod_lab_event_lag_seconds_count", {"cluster": "local"}) or 0.0

    async def scenario():
        w = Watcher(client, min_interval_s=0.2, max_interval_s=1.0, stream_interval_s=0.05, idle_max_interval_s=0.2,
                    read_bytes=2048, page_bytes=2048)
        w.observers.append(metrics)
        w.start()
        deadline = time.monotonic() + 30
        while not (w.tailers.get("lag-1") and w.tailers["lag-1"].caught_up) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        history = lag_count()
        live = EventWriter(str(d), "rank-0", "lag-1")
        for step in range(400, 403):
            live.emit("step", step=step, loss=1.0)
        while lag_count() < history + 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await w.stop()
        return history, lag_count()

    history, after = asyncio.run(scenario())
    assert history == 0, history
    assert after == 3, after


def test_steps_and_saved_checkpoints_never_change_what_status_messages_are_sent_on():
    """The watcher skips notable() around the events of kinds in _NOT_NOTABLE (most of a job):
    over every scenario of the job facts tests (checkpoint-restart, checkpointless loss, operator
    recovery, pre-flight, node down, stragglers), folding such an event never changes it."""
    import importlib.util

    from hyperpod_lab.fold.progress import Progress
    from hyperpod_lab.server.watch.tailer import notable
    from hyperpod_lab.server.watch.watcher import _NOT_NOTABLE

    spec = importlib.util.spec_from_file_location(
        "facts_scenarios", os.path.join(os.path.dirname(os.path.dirname(__file__)), "fold", "test_facts.py"))
    test_facts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test_facts)
    scenarios = [getattr(test_facts, n)() for n in ("checkpoint_restart", "checkpointless_loss",
                                                     "preflight_then_training", "node_down_during_training")]
    seen = set()
    for events in scenarios:
        p = Progress({})
        for ev in sorted(events, key=lambda e: (e.time, e.writer, e.seq)):
            before = notable(p)
            p.update(ev)
            if ev.kind in _NOT_NOTABLE:
                seen.add(ev.kind)
                assert notable(p) == before, ev
    assert seen == _NOT_NOTABLE
