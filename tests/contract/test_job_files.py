"""What the submit side reads from a job directory that others can write (issue 13, finding 10).

Reproduced on the code before the fix: a directory named ``x.jsonl`` in ``events/`` made every
poll of the job's events fail (the stream stalled); an event file that is a symbolic link, and a
rank's ``log_file``, were followed out of the job directory; two clients that saw a job end
without the runtime's ``finished`` event could both append one, with the same ``seq``.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

from hyperpod_lab.errors import HyperPodLabError
from hyperpod_lab.events import EventReader, EventWriter
from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.schedulers.local import LocalScheduler
from hyperpod_lab.schedulers.remote import LocalRemote
from hyperpod_lab.submit.clusters import ClusterProfile
from hyperpod_lab.submit.jobs import JobRecord, JobStatus


def _job(tmp_path) -> JobPaths:
    paths = JobPaths(str(tmp_path / "job"))
    for sub in JobPaths.SUBDIRS:
        os.makedirs(paths.path(sub))
    return paths


def test_a_directory_named_like_an_event_file_does_not_stall_the_stream(tmp_path):
    paths = _job(tmp_path)
    os.makedirs(paths.event_file("x"))  # events/x.jsonl/
    EventWriter(paths.folder, "rank-0", "j").emit("started", world_size=1)
    reader = EventReader(paths.folder)
    assert [e.kind for e in reader.poll()] == ["started"]
    EventWriter(paths.folder, "rank-0", "j").emit("step", step=0, loss=1.0)
    assert [e.kind for e in reader.poll()] == ["step"]


def test_an_event_file_that_links_out_of_the_job_directory_is_not_read(tmp_path):
    paths = _job(tmp_path)
    outside = tmp_path / "elsewhere"
    os.makedirs(outside)
    EventWriter(str(outside), "planted", "j").emit("finished", status="completed")
    os.symlink(os.path.join(str(outside), "events", "planted.jsonl"), paths.event_file("planted"))
    EventWriter(paths.folder, "rank-0", "j").emit("started", world_size=1)
    assert [e.writer for e in EventReader(paths.folder).poll()] == ["rank-0"]


def _rank_file(paths: JobPaths, log_file: str) -> tuple[LocalScheduler, JobRecord]:
    with open(paths.rank_file(0), "w") as f:
        json.dump({"rank": 0, "pid": 1234, "node": "n1", "log_file": log_file}, f)
    rec = JobRecord(job_id="j", name="j", cluster="local", orchestrator="local", native_id="1", job_dir=paths.folder,
                    spec={"script": "x.py"})
    return LocalScheduler(ClusterProfile(name="local", orchestrator="local"), LocalRemote()), rec


def test_a_rank_log_outside_the_job_directory_is_refused(tmp_path):
    paths = _job(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    for log_file in (str(secret), paths.path("logs", "..", "..", "secret.txt")):
        sched, rec = _rank_file(paths, log_file)
        with pytest.raises(HyperPodLabError, match="outside the job directory"):
            sched.rank_log(rec, 0)


def test_a_rank_log_that_is_a_link_is_not_followed(tmp_path):
    paths = _job(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    link = paths.path("logs", "stdout.log")
    os.symlink(str(secret), link)
    sched, rec = _rank_file(paths, link)
    with pytest.raises(HyperPodLabError, match="not a regular file"):
        sched.rank_log(rec, 0)


def test_two_clients_never_both_write_the_finished_event(tmp_path, client):
    """Eight clients see the same job end at once (the server's watcher, CLIs, widgets): one
    ``finished`` event, one seq."""
    from hyperpod_lab.submit.client import Client

    paths = _job(tmp_path)
    rec = JobRecord(job_id="j", name="j", cluster="local", orchestrator="local", native_id="1", job_dir=paths.folder,
                    spec={"script": "x.py"})
    clients = [Client(client.store) for _ in range(8)]
    sched = clients[0].scheduler("local")
    barrier = threading.Barrier(len(clients))

    def finish(c):
        barrier.wait()
        c._finish_if_silent(sched, rec, JobStatus.FAILED, 1, "launcher exited")

    threads = [threading.Thread(target=finish, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fins = [e for e in EventReader(paths.folder).poll() if e.kind == "finished"]
    assert len(fins) == 1 and fins[0].data["status"] == "failed"
