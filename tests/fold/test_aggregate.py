"""JobAggregate (hyperpod_lab/fold/aggregate.py): the one fold of a job's events behind the dashboard
and the notebook widget. Events are built in memory with the real Event type (no job runs)."""

from __future__ import annotations

import json
import random

from hyperpod_lab.events import Event
from hyperpod_lab.fold.aggregate import JobAggregate

T0 = 1_700_000_000.0


class Writers:
    """Events of several writers with their own sequence numbers, as EventWriter stamps them."""

    def __init__(self):
        self.seq: dict[str, int] = {}

    def __call__(self, kind: str, writer: str, t: float, **data) -> Event:
        s = self.seq.get(writer, 0)
        self.seq[writer] = s + 1
        return Event(kind=kind, job_id="j1", time=T0 + t, writer=writer, seq=s, data=data)


def _job_with_fault() -> list[Event]:
    """2 ranks, a step and a memory + peer checkpoint of each rank at every step 0..40, rank 1
    fails at step 40, the job restores step 40 and goes on 41..60."""
    ev = Writers()
    out = [ev("submitted", "client", 0, cluster="local")]
    for r in (0, 1):
        out.append(ev("started", f"rank-{r}", 0.5, world_size=2))
    for s in range(0, 41):
        t = 1 + s
        out.append(ev("step", "rank-0", t, step=s, loss=2.0 - s * 0.01, steps_per_s=1.0))
        for r in (0, 1):
            out.append(ev("checkpoint.saved", f"rank-{r}", t + 0.1, tier="memory", step=s, rank=r))
            out.append(ev("checkpoint.saved", f"rank-{r}", t + 0.2, tier="peer", step=s, of_rank=1 - r))
    out.append(ev("fault.detected", "agent-local", 43, rank=1, node="local", reason="exception"))
    out.append(ev("recovery.started", "agent-local", 43.5, node="local", reason="local worker failed"))
    for r in (0, 1):
        out.append(ev("checkpoint.restored", f"rank-{r}", 45, tier="memory", step=40, rank=r, node="local"))
    for s in range(41, 61):
        t = 5 + s
        out.append(ev("step", "rank-0", t, step=s, loss=1.6 - (s - 40) * 0.01, steps_per_s=1.0))
        if s == 41:
            out.append(ev("recovery.completed", "rank-0", t, restored_step=40, downtime_s=3.0,
                          restored_from="memory"))
    out.append(ev("finished", "rank-0", 70, status="succeeded", steps=61))
    return out


def test_checkpoints_of_two_ranks_collapse_into_spans_per_rank_and_tier():
    events = _job_with_fault()
    agg = JobAggregate()
    # any writer order: each writer's own events in order, writers interleaved at random
    per: dict[str, list[Event]] = {}
    for e in events:
        per.setdefault(e.writer, []).append(e)
    rng = random.Random(3)
    while per:
        w = rng.choice(sorted(per))
        agg.fold(per[w].pop(0))
        if not per[w]:
            del per[w]
    lanes = agg.lanes()
    assert set(lanes) == {"job", "0", "1"}
    for r in ("0", "1"):
        ck = [s for s in lanes[r]["spans"] if s["kind"] == "checkpoint"]
        by_tier = {s["tier"]: s for s in ck}
        assert len(ck) == 2, ck  # one span per tier, not 41 marks
        for tier in ("memory", "peer"):
            s = by_tier[tier]
            assert (s["step0"], s["step1"], s["count"]) == (0, 40, 41)
            assert s["t0"] < s["t1"]
    steps = [s for s in lanes["0"]["spans"] if s["kind"] == "step"]
    assert [(s["step0"], s["step1"], s["count"]) for s in steps] == [(0, 40, 41), (41, 60, 20)]
    # the fault is a mark of rank 1's lane; recovery marks are job-level
    faults = [m for m in lanes["1"]["marks"] if m["cat"] == "fault"]
    assert len(faults) == 1 and faults[0]["rank"] == 1 and faults[0]["node"] == "local"
    assert "fault: rank 1 on local" in faults[0]["label"]
    rec = [m for m in lanes["job"]["marks"] if m["kind"] == "recovery.completed"]
    assert len(rec) == 1 and rec[0]["restored_step"] == 40 and rec[0]["t"] > faults[0]["t"]
    assert agg.steps == 61 and agg.ranks_sorted == [0, 1]


def test_timeline_one_entry_per_checkpoint_span_per_tier_and_per_incident():
    agg = JobAggregate()
    for e in _job_with_fault():
        agg.fold(e)
    tl = agg.timeline()
    ck = [e for e in tl if e["kind"] == "checkpoint"]
    assert sorted(e["label"] for e in ck) == ["checkpoint memory steps 0-40 (x41) · ranks 0, 1",
                                              "checkpoint peer steps 0-40 (x41) · ranks 0, 1"]
    assert all(e["ranks"] == [0, 1] for e in ck)
    kinds = [e["kind"] for e in tl if e["kind"] != "checkpoint"]
    assert kinds.count("fault.detected") == 1
    assert kinds.count("recovery.completed") == 1
    restored = [e for e in tl if e["kind"] == "checkpoint.restored"]  # both ranks' restore: one line
    assert [(e["label"], e["ranks"]) for e in restored] == [("restored memory step 40 · ranks 0, 1", [0, 1])]
    assert kinds[-1] == "finished"
    assert len(tl) < 10  # never one entry per checkpoint per rank (164 events)
    assert tl == sorted(tl, key=lambda e: e["t"])


def test_node_down_fault_is_a_mark_in_each_of_its_ranks_lanes_and_once_in_the_timeline():
    ev = Writers()
    agg = JobAggregate()
    agg.fold(ev("step", "rank-0", 1, step=0, loss=1.0))
    agg.fold(ev("fault.detected", "supervisor", 2, rank=[2, 3], node="n2", reason="node down"))
    agg.fold(ev("fault.detected", "agent-n1", 3, rank=1, node="n1", reason="hang", stalled_s=31.2, section="fwd"))
    agg.fold(ev("elastic.scaled", "rank-0", 4, step=5, old_world_size=4, new_world_size=2))
    agg.fold(ev("straggler.detected", "agent-n1", 5, rank=1, node="n1", score=2.0, step_s=0.2, median_step_s=0.1))
    agg.fold(ev("node.excluded", "supervisor", 6, node="n2", reason="faulted twice", faults=2))
    agg.fold(ev("health.failed", "health-n3", 7, check="shm", detail="too small"))
    lanes = agg.lanes()
    assert [m["cat"] for m in lanes["2"]["marks"]] == ["fault"] == [m["cat"] for m in lanes["3"]["marks"]]
    assert [m["cat"] for m in lanes["1"]["marks"]] == ["hang", "straggler"]
    assert {m["cat"] for m in lanes["job"]["marks"]} == {"scaling", "exclusion", "health"}
    tl = agg.timeline()
    assert [e["cat"] for e in tl] == ["fault", "hang", "scaling", "straggler", "exclusion", "health"]
    assert tl[1]["label"] == "hang: rank 1 on n1 made no progress for 31.2 s in section fwd"


def test_series_keeps_min_max_peaks_when_downsampled():
    agg = JobAggregate(max_buckets=64)
    n = 100_000
    for s in range(n):
        loss = 1.0
        if s == 12_345:
            loss = 50.0   # one-step spike
        if s == 77_777:
            loss = -3.0   # one-step dip
        agg.fold(Event("step", "j", T0 + s, "rank-0", s, {"step": s, "loss": loss, "steps_per_s": 10.0 + (s == 500)}))
    ser = agg.series(max_points=40)
    assert ser["points"] <= 40 and len(ser["loss"]) == len(ser["step"]) == len(ser["steps_per_s"])
    assert max(ser["loss"]) == 50.0 and ser["step"][ser["loss"].index(50.0)] == 12_345
    assert min(ser["loss"]) == -3.0 and ser["step"][ser["loss"].index(-3.0)] == 77_777
    assert max(x for x in ser["steps_per_s"] if x is not None) == 11.0
    assert ser["step"] == sorted(ser["step"])


def test_memory_bounded_by_buckets_and_spans_not_steps():
    agg = JobAggregate()
    for s in range(1_000_000):
        agg.fold(Event("step", "j", T0 + s * 0.01, "rank-0", s, {"step": s, "loss": 1.0 / (s + 1), "steps_per_s": 100.0}))
        if s % 1000 == 0:
            for r in (0, 1):
                agg.fold(Event("checkpoint.saved", "j", T0 + s * 0.01, f"rank-{r}", s, {"tier": "memory", "step": s}))
    state = agg.to_state()
    size = len(json.dumps(state))
    assert sum(b is not None for b in agg._buckets) <= agg.max_buckets
    assert size < 400_000, size  # ~2048 buckets and a handful of spans, whatever the step count
    assert agg.steps == 1_000_000
    spans = agg.lanes()["0"]["spans"]
    assert [(s["kind"], s["step0"], s["step1"], s["count"]) for s in spans] == [
        ("step", 0, 999_999, 1_000_000), ("checkpoint", 0, 999_000, 1000)]
    assert agg.series(2000)["points"] <= 2000


def test_spans_and_marks_are_capped():
    agg = JobAggregate(max_spans=8, max_marks=5)
    for i in range(100):  # a restart every step: a new step span each time
        agg.fold(Event("step", "j", T0 + i, "rank-0", 2 * i, {"step": 0, "loss": 1.0}))
        agg.fold(Event("fault.detected", "j", T0 + i + 0.5, "agent-a", i, {"rank": 0, "node": "a"}))
    ln = agg.lanes()["0"]
    assert len(ln["spans"]) <= 8 and sum(s["count"] for s in ln["spans"]) == 100
    assert len(ln["marks"]) == 5 and agg.dropped_marks == 95


def test_state_round_trip_resumes_the_fold():
    events = _job_with_fault()
    whole = JobAggregate()
    for e in events:
        whole.fold(e)
    half = JobAggregate()
    cut = len(events) // 2
    for e in events[:cut]:
        half.fold(e)
    resumed = JobAggregate.from_state(json.loads(json.dumps(half.to_state())))
    for e in events[cut:]:
        resumed.fold(e)
    assert resumed.summary(100) == whole.summary(100)
    try:
        JobAggregate.from_state({"v": 99})
    except ValueError as e:
        assert "version" in str(e)
    else:
        raise AssertionError("a state of another version was accepted")


def _labels(agg: JobAggregate) -> list[tuple[str, list | None]]:
    return [(e["label"], e.get("ranks")) for e in agg.timeline()]


def test_one_checkpoint_saved_by_two_ranks_ms_apart_is_one_line():
    """Seen on a real 2-rank job when the fault came right after step 0 (tests/notebook/test_widgets.py's
    real-job test): each rank's run of one checkpoint is an instant (t0 == t1), 4 ms apart;
    the ranks' spans of a tier with no fault, recovery or rescale between them are one line,
    and the fault torchrun's SIGTERM of the surviving rank caused (root_cause false) is no line."""
    ev = Writers()
    agg = JobAggregate()
    for e in [ev("checkpoint.saved", "rank-0", 100.000, step=0, tier="memory"),
              ev("checkpoint.saved", "rank-1", 100.004, step=0, tier="memory"),
              ev("fault.detected", "agent-n1", 101.0, rank=1, node="n1", signal="SIGKILL", root_cause=True),
              ev("fault.detected", "agent-n1", 101.0, rank=0, node="n1", signal="SIGTERM", root_cause=False)]:
        agg.fold(e)
    for s in range(1, 5):
        agg.fold(ev("checkpoint.saved", "rank-0", 110.0 + s, step=s, tier="memory"))
        agg.fold(ev("checkpoint.saved", "rank-1", 110.003 + s, step=s, tier="memory"))
    assert _labels(agg) == [("checkpoint memory step 0 (x1) · ranks 0, 1", [0, 1]),
                            ("fault: rank 1 on n1 (SIGKILL)", None),
                            ("checkpoint memory steps 1-4 (x4) · ranks 0, 1", [0, 1])]
    # the secondary fault stays a mark of rank 0's lane (the dashboard draws it fainter)
    assert [m.get("root_cause") for m in agg.lanes()["0"]["marks"]] == [False]


def test_checkpoint_lines_break_at_faults_recoveries_and_rescales_not_at_ms_gaps():
    ev = Writers()
    agg = JobAggregate()
    t = 0.0
    for run, brk in enumerate([("fault.detected", dict(rank=0, node="n1", reason="exception")),
                               ("recovery.started", dict(node="n1", reason="restart")),
                               ("elastic.scaled", dict(step=9, old_world_size=2, new_world_size=1)), None]):
        for s in range(3 * run, 3 * run + 3):
            t += 1.0
            for r in (0, 1):  # each rank's checkpoint an instant, 2 ms after the other's
                agg.fold(ev("checkpoint.saved", f"rank-{r}", t + 0.002 * r, step=s, tier="peer"))
        if brk:
            t += 0.5
            agg.fold(ev(brk[0], "agent-n1" if brk[0] != "elastic.scaled" else "rank-0", t, **brk[1]))
    ck = [e for e in agg.timeline() if e["kind"] == "checkpoint"]
    assert [(e["step0"], e["step1"], e["count"], e["ranks"]) for e in ck] == [
        (0, 2, 3, [0, 1]), (3, 5, 3, [0, 1]), (6, 8, 3, [0, 1]), (9, 11, 3, [0, 1])]


def test_restores_of_a_tier_and_step_are_one_line_per_incident():
    ev = Writers()
    agg = JobAggregate()
    for r in range(8):  # 8 ranks restore memory step 40 within a second
        agg.fold(ev("checkpoint.restored", f"rank-{r}", 10 + r * 0.1, tier="memory", step=40, rank=r, node="n1"))
    agg.fold(ev("checkpoint.restored", "rank-0", 12, tier="peer", step=40, rank=0, node="n1"))
    for r in (0, 1):  # a later incident restores the same step again: its own line
        agg.fold(ev("checkpoint.restored", f"rank-{r}", 200 + r, tier="memory", step=40, rank=r, node="n1"))
    assert _labels(agg) == [("restored memory step 40 · ranks 0-7", list(range(8))),
                            ("restored peer step 40", [0]),
                            ("restored memory step 40 · ranks 0, 1", [0, 1])]


def test_timeline_lists_the_nodes_health_checks_passed_and_failed():
    ev = Writers()
    ok = {"status": "passed", "detail": "", "seconds": 0.1}
    agg = JobAggregate()
    agg.fold(ev("health.checked", "health-n1", 2, node="n1", ok=True, seconds=1.25, checks={"gpu": ok, "shm": ok}))
    agg.fold(ev("health.failed", "health-n2", 2.5, node="n2", check="shm", detail="64 MiB"))
    agg.fold(ev("health.checked", "health-n2", 2.5, node="n2", ok=False, seconds=2.0,
                checks={"gpu": ok, "shm": {"status": "failed", "detail": "64 MiB"}}))
    tl = agg.timeline()
    assert [(e["kind"], e["label"], e.get("ok")) for e in tl] == [
        ("health.checked", "health checks passed on n1 (2 checks, 1.25 s)", True),
        ("health.failed", "health check failed on n2: shm — 64 MiB", None),
        ("health.checked", "health checks failed on n2: shm (2 s)", False)]
    assert tl[0]["node"] == "n1" and tl[0]["cat"] == "health"
    # a timeline entry, not a lane mark: the lanes show the failure (health.failed) only
    assert [m["kind"] for m in agg.lanes()["job"]["marks"]] == ["health.failed"]


def test_health_checks_are_capped_and_kept_in_the_state():
    agg = JobAggregate(max_marks=5)
    for i in range(20):
        agg.fold(Event("health.checked", "j", T0 + i, f"health-n{i}", 0, {"node": f"n{i}", "ok": True, "checks": {}}))
    assert sum(e["kind"] == "health.checked" for e in agg.timeline()) == 5 and agg.dropped_marks == 15
    back = JobAggregate.from_state(json.loads(json.dumps(agg.to_state())))
    assert back.timeline() == agg.timeline() and back.to_state()["v"] == 3


def test_state_of_the_previous_version_is_refused_so_the_job_is_folded_again():
    """A state saved before the health checks were kept (v1) cannot give the timeline: from_state
    raises ValueError, which the server's watcher (_load_aggregate) takes as "fold again"."""
    from hyperpod_lab.server.watch.tailer import load_aggregate as _load_aggregate

    agg = JobAggregate()
    for e in _job_with_fault():
        agg.fold(e)
    old = agg.to_state()
    old["v"] = 1
    del old["checks"]
    try:
        JobAggregate.from_state(old)
    except ValueError as e:
        assert "version 1" in str(e) and "fold the job's events again" in str(e)
    else:
        raise AssertionError("a version 1 state was accepted")
    assert _load_aggregate(old) is None and _load_aggregate(agg.to_state()) is not None


def test_recovery_labels_name_where_the_job_resumed_from():
    """docs/events.md recovery.completed: ``restored_from`` is a tier or "none" (no checkpoint
    yet, or a checkpointless heal, ``mode: "checkpointless"`` with ``resumed_step``). The label said
    "from none (step None)" for a job that had no checkpoint yet."""
    from hyperpod_lab.fold.aggregate import mark_label

    ev = Writers()
    assert mark_label(ev("recovery.completed", "rank-0", 1, downtime_s=5.1, restored_from="none",
                         restored_step=None)) == "recovered in 5.1 s from step 0 (no checkpoint yet)"
    assert mark_label(ev("recovery.completed", "rank-0", 2, downtime_s=0.3, restored_from="none",
                         mode="checkpointless", resumed_step=24)) == "recovered in 0.3 s from the live replicas (step 24)"
    assert mark_label(ev("recovery.completed", "rank-0", 3, downtime_s=4.6, restored_from="memory",
                         restored_step=11)) == "recovered in 4.6 s from memory (step 11)"
