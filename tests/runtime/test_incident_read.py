"""Rank 0 dates an incident without reading every rank's file (issue 27, Deliver 1: "nothing in
a rank's recovery path reads the job's whole history"; the issue timed the old read at 50 s for
2,048 ranks). Real files written by the project's EventWriter (``benchmarks/scale.py``'s
synthetic job: a file per rank, per node agent, the supervisor and the client)."""

from __future__ import annotations

from benchmarks.scale import write_job
from hyperpod_lab.events import EventReader, EventWriter, LocalFiles, incident_events
from hyperpod_lab.fold.facts import fold
from hyperpod_lab.runtime.context import _incident_start_time


def test_a_2048_rank_job_is_dated_from_its_agents_and_rank_0_alone(tmp_path):
    job = str(tmp_path / "job")
    write_job(job, "j", 2048, steps=20)
    agent = EventWriter(job, "agent-n7", "j", clock=lambda: 1.7e9 + 100.0)
    agent.emit("fault.detected", rank=60, node="n7", reason="exception", exitcode=1)
    every = EventReader(job).poll()
    assert fold(every).incident_detected_at == 1.7e9 + 100.0
    before = LocalFiles.bytes_read
    assert _incident_start_time(job) == 1.7e9 + 100.0
    read = LocalFiles.bytes_read - before
    total = sum(len(e.to_json()) + 1 for e in every)
    # the agents', supervisor's, client's and rank 0's files: under 2 % of the job's 2,054 files' bytes
    assert read < total / 50, (read, total)


def test_an_incident_closed_before_rank_0s_tail_does_not_look_open(tmp_path):
    """Rank 0's file longer than the tail read: an earlier incident (an agent's fault closed by
    rank 0's recovery.completed, both before the tail) is left out; the open one is dated."""
    t = [1000.0]
    clock = lambda: t[0]  # noqa: E731
    r0 = EventWriter(str(tmp_path), "rank-0", "j", clock=clock)
    agent = EventWriter(str(tmp_path), "agent-n2", "j", clock=clock)
    r0.emit("step", step=0)
    t[0] += 1
    agent.emit("fault.detected", rank=3, node="n2", reason="exception")
    t[0] += 5
    r0.emit("recovery.completed", restart_count=1, downtime_s=5.0)
    for s in range(1, 3000):  # ~200 KB of steps after it
        t[0] += 0.1
        r0.emit("step", step=s, loss=1.0 / s, padding="x" * 40)
    t[0] += 2
    agent.emit("fault.detected", rank=5, node="n2", reason="exception")
    detected = t[0]
    evs = incident_events(str(tmp_path), rank0_tail_bytes=64 << 10)
    assert all(e.time > 1010 for e in evs)  # neither the old fault nor its recovery
    assert fold(evs).incident_detected_at == detected
    assert fold(incident_events(str(tmp_path), rank0_tail_bytes=None)).incident_detected_at == detected
    assert fold(EventReader(str(tmp_path)).poll()).incident_detected_at == detected


def test_job_finished_reads_only_the_end_of_each_event_file(tmp_path):
    """``job_finished`` (a hot spare asks it every second, every joining rank at its start) reads
    at most FINAL_TAIL_BYTES of each file, not the job's history, and sees the leader's
    ``finished``; the word in another event's data is not a ``finished`` event."""
    from hyperpod_lab.events import FINAL_TAIL_BYTES
    from hyperpod_lab.jobdir import job_finished

    job = str(tmp_path / "job")
    write_job(job, "j", 64, steps=1000)  # 200 memory checkpoints a rank: about 34 KB a rank file
    total = sum(len(e.to_json()) + 1 for e in EventReader(job).poll())
    files = len(LocalFiles().list_files(f"{job}/events"))
    EventWriter(job, "rank-5", "j").emit("step", step=100, note='"kind":"finished"')
    before = LocalFiles.bytes_read
    assert not job_finished(job)
    read = LocalFiles.bytes_read - before
    assert read <= files * FINAL_TAIL_BYTES and read < total / 5, (read, total, files)
    EventWriter(job, "rank-0", "j").emit("finished", status="succeeded", steps=101)
    assert job_finished(job)
    assert not job_finished(str(tmp_path / "no-such-job"))
