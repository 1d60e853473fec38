"""Log triage at 2,048 ranks (issue 27, item 4), on real files through the real ``local`` scheduler.

A synthetic job of 2,048 ranks (8 a node, 256 nodes) written as a real one is: its events by the
project's own EventWriter (``benchmarks.scale.write_job``: rank 1,337's fault reported by its
node's agent), its logs in torchrun's layout with ``ranks/rank-R.json`` (``benchmarks.log_triage
.write_rank_logs``: every rank prints the same warning on stderr, rank 1,337 a traceback). The
file-access layer under the scheduler (``CountingFiles``) counts every file opened and listing
made. The server test folds the job in a real jupyter server's watcher.

On the code before this change (seen failing): the first view opened every rank's
``ranks/rank-R.json`` and up to 512 log files plus every small ``rank-*.jsonl`` event file
(4,869 files at 2,048 ranks), and collapsed the first 256 ranks' lines; the search cursor grew
with every rank searched; a fault a rank wrote itself was not found at this size.
"""

from __future__ import annotations

import io
import json
import os
import time

import pytest

from benchmarks.log_triage import WARNING, CountingFiles, write_rank_logs
from benchmarks.scale import write_job
from hyperpod_lab import cli
from hyperpod_lab.events import EventWriter, encode_cursor
from hyperpod_lab.submit import logtriage as lt
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobRecord, JobStore

FAILING = 1337
#: files one first view may open whatever the rank count: the non-rank event files (client,
#: supervisor, the failing node's agent) and, for each rank read (MAX_FAILING + SAMPLE_HEALTHY at
#: most), its rank-R.json, its stdout/stderr logs and torchrun's error.json
MAX_OPENED = 3 + (lt.MAX_FAILING + lt.SAMPLE_HEALTHY) * 4


def _job(tmp, ranks: int, name: str, store: JobStore | None = None) -> tuple[Client, CountingFiles, str]:
    job_dir = str(tmp / name)
    write_job(job_dir, name, ranks, steps=6, fault_rank=FAILING)
    write_rank_logs(job_dir, ranks, FAILING % ranks, kb=2)
    store = store or JobStore(str(tmp / f"{name}-jobs"))
    store.put(JobRecord(name, name, "local", "local", "0", job_dir, {}, status="failed"))
    client = Client(store)
    sched = client.scheduler("local")
    sched.remote = files = CountingFiles(sched.remote)
    return client, files, job_dir


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return _job(tmp_path_factory.mktemp("triage2048"), 2048, "big")


@pytest.fixture(scope="module")
def mid(tmp_path_factory):
    return _job(tmp_path_factory.mktemp("triage64"), 64, "mid")


def _first_view(client, files, job_id):
    files.reset()
    reply = lt.triage(client, job_id, tail=True)
    return reply, list(files.opened), files.calls


def test_first_view_names_rank_1337_first_and_opens_a_constant_number_of_files(big, mid):
    client, files, job_dir = big
    reply, opened, calls = _first_view(client, files, "big")
    f = reply["first_failure"]
    assert f["rank"] == FAILING and f["found_by"] == "event" and f["node"] == "n167", f
    assert "illegal memory access" in f["exception"] and f["source"].endswith("n167/attempt_0/1/stderr.log")
    assert reply["failing_ranks"][0] == FAILING and reply["rank_count"] == 2048 and reply["sampled"] is True
    sample = reply["sample_ranks"]
    assert len(sample) == lt.SAMPLE_HEALTHY and FAILING not in sample and 0 in sample
    assert reply["ranks"] == sorted({FAILING, *sample})
    # the files opened: a constant, none of the 2,048 ranks' event files, no other rank's log
    assert len(opened) <= MAX_OPENED, (len(opened), opened)
    assert not [p for p in opened if os.path.basename(p).startswith("rank-") and p.endswith(".jsonl")], opened
    read_ranks = {json.load(open(p))["rank"] for p in opened if "/ranks/" in p}
    assert read_ranks == set(reply["ranks"]), read_ranks
    # the same counts at 64 ranks: independent of the rank count
    mreply, mopened, mcalls = _first_view(*mid[:2], "mid")
    assert mreply["first_failure"]["rank"] == FAILING % 64
    assert (len(opened), calls) == (len(mopened), mcalls), (len(opened), calls, len(mopened), mcalls)
    # the same sample on every request (deterministic)
    again, _, _ = _first_view(client, files, "big")
    assert again["sample_ranks"] == sample and again["ranks"] == reply["ranks"]
    assert len(json.dumps(reply)) < 256 << 10


def test_a_warning_every_rank_printed_is_one_entry_in_the_reply_and_the_cli(big):
    client, files, _ = big
    reply, _, _ = _first_view(client, files, "big")
    warn = [ln for ln in reply["lines"] if ln["text"] == WARNING]
    assert len(warn) == 1, warn
    assert warn[0]["count"] == len(reply["ranks"]) == 5 and warn[0]["ranks"] == reply["ranks"]
    assert warn[0]["stream"] == "stderr" and set(warn[0]["offsets"]) == set(reply["ranks"])
    tb = [ln for ln in reply["lines"] if "illegal memory access" in ln["text"]]
    assert tb and all(ln["ranks"] == [FAILING] for ln in tb)
    out = io.StringIO()
    cli.run(["logs", "big", "--triage"], client=client, out=out)
    text = out.getvalue()
    first = text.splitlines()[0]
    assert first.startswith("=== failing rank 1337;") and "5 of 2048 ranks read" in first, first
    assert text.count(WARNING) == 1, text[:3000]
    line = next(t for t in text.splitlines() if t.endswith(WARNING))
    assert line.startswith("[x5 ranks 0,"), line
    assert "first failure: rank 1337 on n167: RuntimeError: CUDA error: an illegal memory access" in text


def test_a_follow_poll_reads_the_ranks_of_its_cursor_and_only_new_lines(big):
    client, files, job_dir = big
    reply, _, _ = _first_view(client, files, "big")
    cursor = lt.decode_log_cursor(reply["cursor"])
    files.reset()
    nothing = lt.triage(client, "big", cursor=cursor, failure=False)
    assert nothing["ranks"] == reply["ranks"] and nothing["lines"] == [], nothing["lines"][:3]
    assert len(files.opened) <= MAX_OPENED and not any("/events/" in p for p in files.opened), files.opened
    healthy = reply["sample_ranks"][1]
    slot = os.path.join(job_dir, "logs", "torchrun", f"n{healthy // 8}", "attempt_0", str(healthy % 8))
    with open(os.path.join(slot, "stdout.log"), "ab") as fh:
        fh.write(b"a new line\n")
    new = lt.triage(client, "big", cursor=lt.decode_log_cursor(nothing["cursor"]), failure=False)
    assert [(ln["text"], ln["ranks"]) for ln in new["lines"]] == [("a new line", [healthy])]


def test_a_search_of_every_rank_is_bounded_per_request_and_goes_on_with_its_cursor(big):
    client, files, _ = big
    seen: list[int] = []
    cursor = None
    for page in range(3):
        files.reset()
        res = lt.triage(client, "big", q="says hello", cursor=cursor, failure=False, limit=1000)
        ranks = [m["rank"] for m in res["matches"]]
        assert 0 < len(ranks) <= lt.SEARCH_RANKS, len(ranks)
        assert res["truncated"] is True and res["done"] is False
        assert "narrow the search" in res["note"] and "ranks visited" in res["note"], res["note"]
        assert len(files.opened) <= lt.SEARCH_RANKS * 3 + 2, len(files.opened)  # json + 2 logs a rank
        seen += ranks
        cursor = lt.decode_log_cursor(res["cursor"])
        assert len(encode_cursor(cursor)) < 1024, len(encode_cursor(cursor))
    assert seen == list(range(len(seen))) and len(seen) >= 3 * lt.SEARCH_RANKS - 2, seen[-5:]
    # the match cap: cut, said so, and the next request goes on after the last match
    res = lt.triage(client, "big", q="loss 0.5", failure=False, limit=3)
    assert len(res["matches"]) == 3 and res["truncated"] and "3 matches" in res["note"]
    nxt = lt.triage(client, "big", q="loss 0.5", failure=False, limit=3, cursor=lt.decode_log_cursor(res["cursor"]))
    assert [m["rank"] for m in nxt["matches"]] == [3, 4, 5], nxt["matches"]
    out = io.StringIO()
    cli.run(["logs", "big", "--grep", "says hello"], client=client, out=out)
    assert "narrow the search" in out.getvalue().splitlines()[-1]


def test_the_server_takes_the_failing_rank_from_its_fold(server, tmp_path):
    """A fault only rank 1,337's own event file holds (as a checkpointless rank writes it): at
    2,048 ranks the event files' reader leaves the ranks' files out, the server's watcher has
    folded them, and the server's triage names rank 1,337 (without the fold: agent n0's rank 0)."""
    ranks = 2048
    job_dir = tmp_path / "folded"
    write_job(str(job_dir), "folded", ranks, steps=6, fault_rank=0)
    EventWriter(str(job_dir), f"rank-{FAILING}", "folded", clock=lambda: 1.7e9 + 1.1).emit(
        "fault.detected", rank=FAILING, node="n167", reason="exception", root_cause=True)
    write_rank_logs(str(job_dir), ranks, FAILING, kb=2)
    from hyperpod_lab.submit.jobs import new_job_id

    job_id = new_job_id("folded")
    store = Client().store
    store.put(JobRecord(job_id, "folded", "local", "local", "0", str(job_dir), {}, status="failed"))
    direct = lt.triage(Client(store), job_id, tail=True)
    assert direct["failing_ranks"] == [0], direct["failing_ranks"]  # the files' reader alone misses it
    status, _ = server.call("GET", "/hyperpod/jobs", timeout_s=120)  # the watcher tracks the job
    assert status == 200
    deadline = time.monotonic() + 120
    while True:
        status, dash = server.call("GET", f"/hyperpod/jobs/{job_id}/dashboard", timeout_s=120)
        assert status == 200, dash
        if not dash.get("partial") and dash.get("events", 0) >= ranks:
            break
        assert time.monotonic() < deadline, dash.get("events")
        time.sleep(0.5)
    status, body = server.call("GET", f"/hyperpod/jobs/{job_id}/logs/triage?tail=1", timeout_s=120)
    assert status == 200, body
    assert body["failing_ranks"][:2] == [FAILING, 0], body["failing_ranks"]
    assert body["first_failure"]["rank"] == FAILING and "illegal memory access" in body["first_failure"]["exception"]
    assert len(body["ranks"]) <= lt.MAX_FAILING + lt.SAMPLE_HEALTHY
    assert sum(ln["text"] == WARNING for ln in body["lines"]) == 1


def test_the_sample_is_spread_and_fixed_and_the_failing_ranks_come_root_cause_first():
    assert lt.healthy_sample(list(range(2048)), [FAILING]) == [0, 511, 1023, 1536]
    assert lt.healthy_sample([0, 1, 2], [1]) == [0, 2]
    faults = [{"time": 5.0, "data": {"rank": 7, "reason": "Connection closed by peer"}},  # a consequence
              {"time": 9.0, "data": {"rank": [40, 41], "reason": "replica group lost"}},  # a group's ranks
              {"time": 6.0, "data": {"rank": 12, "reason": "exception", "root_cause": True}},
              {"time": 1.0, "data": {"rank": True, "reason": "exception"}}]  # not a rank
    assert lt.failing_ranks(faults) == [12, 40, 41, 7]
    assert lt.failing_ranks(faults, known=range(41)) == [12, 40, 7]
    assert lt.failing_ranks(faults, limit=2) == [12, 40]


def test_without_fault_events_the_job_logs_report_names_the_failing_rank(tmp_path):
    """No event names a rank (a SIGKILL, agents that wrote nothing): torchelastic's report in the
    whole job's log (one file) names rank 1,337, and only it and the sample are read."""
    job_dir = tmp_path / "noevents"
    write_rank_logs(str(job_dir), 2048, -1, kb=2)  # no traceback anywhere
    (job_dir / "events").mkdir()
    report = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" + "=" * 60 + "\n"
              "train.py FAILED\nRoot Cause (first observed failure):\n[0]:\n  time      : 2026-11-27_08:00:00\n"
              f"  host      : n167\n  rank      : {FAILING} (local_rank: 1)\n  exitcode  : -9 (pid: 4242)\n"
              "  traceback : Signal 9 (SIGKILL) received by PID 4242\n" + "=" * 60 + "\n")
    (job_dir / "logs" / "launcher.log").write_text("starting\n" + report)
    store = JobStore(str(tmp_path / "jobs"))
    store.put(JobRecord("noevents", "noevents", "local", "local", "0", str(job_dir), {}, status="failed"))
    client = Client(store)
    sched = client.scheduler("local")
    sched.remote = files = CountingFiles(sched.remote)
    reply = lt.triage(client, "noevents", tail=True)
    assert reply["failing_ranks"] == [FAILING] and FAILING in reply["ranks"] and len(reply["ranks"]) == 5
    f = reply["first_failure"]
    assert f["rank"] == FAILING and f["source"] == lt.JOB_LOG and "SIGKILL" in f["exception"], f
    assert len(files.opened) <= MAX_OPENED, files.opened


def test_a_small_jobs_follow_poll_reads_ranks_that_started_after_its_first_view(tmp_path):
    job_dir = tmp_path / "small"
    write_rank_logs(str(job_dir), 4, 3, kb=1)
    (job_dir / "events").mkdir()
    late = job_dir / "ranks" / "rank-3.json"
    later = tmp_path / "rank-3.json"
    late.rename(later)  # rank 3 has not started yet
    store = JobStore(str(tmp_path / "jobs"))
    store.put(JobRecord("small", "small", "local", "local", "0", str(job_dir), {}, status="running"))
    client = Client(store)
    first = lt.triage(client, "small", tail=True, failure=False)
    assert first["ranks"] == [0, 1, 2] and first["sampled"] is False
    later.rename(late)
    nxt = lt.triage(client, "small", cursor=lt.decode_log_cursor(first["cursor"]), failure=False)
    assert nxt["ranks"] == [0, 1, 2, 3] and any(3 in ln["ranks"] for ln in nxt["lines"])
