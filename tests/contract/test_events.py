import json

import pytest

from hyperpod_lab.events import Event, EventKind, EventReader, EventSchemaError, EventWriter


def test_writer_reader_round_trip_and_cursor(tmp_path):
    job = str(tmp_path)
    clock = iter(range(100)).__next__
    a = EventWriter(job, "rank-0", "j1", clock=lambda: float(clock()))
    b = EventWriter(job, "agent-n1", "j1", clock=lambda: float(clock()))
    a.emit("started", world_size=2)
    b.emit(EventKind.FAULT_DETECTED, rank=1, signal="SIGKILL")
    reader = EventReader(job)
    first = reader.poll()
    assert [e.kind for e in first] == ["started", "fault.detected"]
    assert reader.poll() == []  # nothing new: no duplicates
    a.emit("finished", status="succeeded")
    assert [e.kind for e in reader.poll()] == ["finished"]
    # a reader resumed from the saved cursor sees nothing old
    resumed = EventReader(job, cursor=reader.cursor)
    a.emit("step", step=3, loss=1.5)
    assert [(e.kind, e.data["step"]) for e in resumed.poll()] == [("step", 3)]


def test_partial_line_is_not_consumed_until_complete(tmp_path):
    job = str(tmp_path)
    w = EventWriter(job, "rank-0", "j1")
    w.emit("started")
    line = Event("step", "j1", 5.0, "rank-0", 1, {"step": 0}).to_json()
    with open(w.path, "ab") as f:
        f.write(line[:10].encode())  # a writer mid-write
    r = EventReader(job)
    assert [e.kind for e in r.poll()] == ["started"]
    with open(w.path, "ab") as f:
        f.write((line[10:] + "\n").encode())
    assert [e.kind for e in r.poll()] == ["step"]


def test_restarted_writer_continues_sequence_and_heals_torn_line(tmp_path):
    job = str(tmp_path)
    w = EventWriter(job, "rank-0", "j1")
    w.emit("started")
    with open(w.path, "ab") as f:
        f.write(b'{"v":1,"kind":"st')  # killed mid-write
    w2 = EventWriter(job, "rank-0", "j1")
    ev = w2.emit("step", step=1)
    assert ev.seq == 2
    r = EventReader(job)
    assert [e.kind for e in r.poll()] == ["started", "step"]
    assert len(r.skipped) == 1


def test_schema_rejects_other_versions_and_kinds():
    good = json.loads(Event("step", "j", 1.0, "rank-0", 0, {}).to_json())
    with pytest.raises(EventSchemaError, match="version"):
        Event.from_json(json.dumps({**good, "v": 2}))
    with pytest.raises(EventSchemaError):
        Event.from_json(json.dumps({**good, "kind": "exploded"}))
    with pytest.raises(ValueError):
        EventWriter("/tmp", "../evil", "j")


def test_all_schema_kinds_listed():
    assert {k.value for k in EventKind} >= {"submitted", "started", "step", "checkpoint.saved",
                                            "checkpoint.restored", "fault.detected", "recovery.started",
                                            "recovery.completed", "elastic.scaled", "finished"}


def test_summary_counts_from_events():
    from hyperpod_lab.submit.client import summarize

    mk = lambda i, kind, t, **d: Event(kind, "j", t, "rank-0", i, d)  # noqa: E731
    evs = [mk(0, "submitted", 0.0), mk(1, "step", 1.0, step=0, loss=5.0), mk(2, "checkpoint.saved", 2.0, step=9),
           mk(3, "fault.detected", 3.0, rank=1), mk(4, "recovery.completed", 9.0, downtime_s=6.0),
           mk(5, "step", 10.0, step=12, loss=3.0), mk(6, "finished", 12.0, status="succeeded", steps=20, final_loss=2.9)]
    s = summarize(evs)
    assert s["steps"] == 20 and s["checkpoints"] == 1 and s["faults"] == 1 and s["recoveries"] == 1
    assert s["recovery_downtime_s"] == [6.0] and s["first_loss"] == 5.0 and s["final_loss"] == 2.9
    assert s["wall_s"] == 12.0 and s["status"] == "succeeded"
    # two agents reporting the same restart round count as one fault
    agents = [Event("fault.detected", "j", 3.0, "agent-n1", 0, {"rank": 1}),
              Event("recovery.started", "j", 3.1, "agent-n1", 1, {"restart_count": 1, "reason": "local worker failed"}),
              Event("fault.detected", "j", 3.2, "agent-n2", 0, {"rank": 0}),
              Event("recovery.started", "j", 3.3, "agent-n2", 1, {"restart_count": 1, "reason": "local worker failed"})]
    s2 = summarize(evs[:3] + agents + evs[4:])
    assert s2["faults"] == 1 and s2["fault_events"] == 2


def test_stopped_ranks_is_read_one_way_everywhere():
    """``fault.detected``'s ``stopped_ranks`` (the ranks a node's agent SIGTERMed because one of
    its workers failed): the whole numbers >= 0 in their order, anything else passed over; the
    fold's lane marks, log triage and the CLI's line all read it through this one function."""
    from hyperpod_lab.cli.render import event_text
    from hyperpod_lab.events import Event, stopped_ranks
    from hyperpod_lab.fold.aggregate import JobAggregate
    from hyperpod_lab.submit.logtriage import select

    d = {"rank": 2, "node": "n1", "stopped_ranks": [3, 1.0, -1, True, "4", 2.5, None, 7]}
    assert stopped_ranks(d) == [3, 1, 7]
    assert stopped_ranks({}) == [] and stopped_ranks({"stopped_ranks": "3"}) == []
    assert select.stopped_ranks({"data": d}) == [3, 1, 7] and select.stopped_ranks({"data": None}) == []
    ev = Event(kind="fault.detected", job_id="j", time=1.0, writer="agent-n1", seq=0, data={**d, "reason": "signal"})
    assert "its agent stopped ranks 3, 1, 7" in event_text(ev)
    agg = JobAggregate()
    agg.fold(ev)
    assert agg.ranks >= {1, 3, 7} and 4 not in agg.ranks  # a lane mark each stopped rank, none for "4"


def test_event_lines_parse_to_what_json_loads_gives():
    """``Event.from_json`` skips ``json.loads``'s per-call work (the decoder's scanner called
    directly) but gives its values for what a job writes: ``NaN`` and ``Infinity`` (``json.dumps``
    writes them for a diverged loss), integers beyond 64 bits, a lone surrogate, a repeated key
    (the last), white space around the object; extra data and a truncated line are an
    EventSchemaError."""
    import math

    base = {"v": 1, "kind": "step", "job_id": "j", "time": 1.5, "writer": "rank-0", "seq": 3}
    lines = [json.dumps({**base, "data": {"loss": float("nan"), "grad_norm": float("inf")}}),
             json.dumps({**base, "data": {"tokens": 2**70}}),
             json.dumps({**base, "data": {"note": "\ud800"}}),
             '{"v":1,"kind":"step","job_id":"j","time":1.5,"writer":"rank-0","seq":3,"data":{"a":1,"a":2}}',
             " " + json.dumps({**base, "data": {"loss": 0.25, "name": "é"}}) + "\n"]
    for line in lines:
        ev, want = Event.from_json(line), json.loads(line)
        assert (ev.kind, ev.job_id, ev.time, ev.writer, ev.seq) == ("step", "j", 1.5, "rank-0", 3)
        assert json.dumps(ev.data, sort_keys=True) == json.dumps(want["data"], sort_keys=True), line
    assert math.isnan(Event.from_json(lines[0]).data["loss"])
    assert Event.from_json(lines[1]).data["tokens"] == 2**70
    assert Event.from_json(lines[3]).data == {"a": 2}
    for bad in (json.dumps(base) + " {}", json.dumps(base)[:-1]):
        with pytest.raises(EventSchemaError, match="not a JSON event line"):
            Event.from_json(bad)


def test_a_poll_orders_events_as_a_merge_of_the_files():
    """A poll's order (``events._merged``) is ``heapq.merge`` of the files by (time, writer,
    seq): ties in file order, and each file in position order even where its times go back (a
    writer's clock stepped back), for random files of either kind."""
    import heapq
    import random

    from hyperpod_lab.events import _merged

    rng = random.Random(27)
    key = lambda x: (x[0].time, x[0].writer, x[0].seq)  # noqa: E731
    for trial in range(300):
        runs = []
        for f in range(rng.randint(0, 6)):
            times = sorted(rng.choice([1.0, 2.0, 2.5, 3.0]) for _ in range(rng.randint(0, 5)))
            if trial % 3 == 0 and len(times) > 1:
                rng.shuffle(times)  # a clock stepped back
            runs.append([(Event("step", "j", t, f"rank-{f % 3}", i, {}), f"rank-{f}.jsonl", i) for i, t in enumerate(times)])
        want = list(heapq.merge(*runs, key=key))
        got = _merged(runs)
        assert [(e.time, e.writer, e.seq, name) for e, name, _ in got] == \
               [(e.time, e.writer, e.seq, name) for e, name, _ in want], runs
