"""A job of 2,048 ranks is read like a 2-rank one (issue 27, items 1-2).

All real: jobs written by the project's own EventWriter (``benchmarks/scale.py``'s ``write_job``:
one file per rank, per node agent, the supervisor and the client), a private OpenSSH ``sshd`` on
127.0.0.1 (``internal-sftp``) for the login node, and a real jupyter server driven over REST and
its WebSocket. No dev Slurm cluster is used.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter

import pytest
from test_storage_confinement import _sshd

from benchmarks._common import track_local_job
from benchmarks.scale import grow, write_job
from hyperpod_lab.events import EventReader, LocalFiles, encode_cursor
from hyperpod_lab.submit.clusters import ClusterProfile

BIG = 2048


def _keys(events):
    return [(e["writer"], e["seq"]) for e in events]


def test_a_new_reader_on_a_shared_connection_reads_a_file_no_writer_named(tmp_path):
    """Two readers of one job on one SSH connection (as the server's job tailer, a REST page and
    the CLI share a cluster's): the second one's first poll, whose request carries no change log
    offset where the first one's did, probes every file, so it reads a file that no writer named
    in the change log (here the client's ``submitted``, as the login node's submit wrote it before
    it named its file; any older writer). fresh26 saw both the REST pages and ``hyperpod-lab
    events`` miss that event: the offset that left the request was sent as 0, which reads the
    log from its start and probes only the files named in it."""
    import os

    from hyperpod_lab.events import EventWriter
    from hyperpod_lab.schedulers.remote import SSHRemote

    proc, ssh = _sshd(str(tmp_path))
    remote = SSHRemote(ClusterProfile(name="shared", orchestrator="slurm", shared_root=str(tmp_path),
                                      python=sys.executable, **ssh).validate())
    try:
        job = tmp_path / "job"
        (job / "events").mkdir(parents=True)
        (job / "events" / "client.jsonl").write_text(  # no name in the change log
            '{"data":{},"job_id":"j","kind":"submitted","seq":0,"time":1.0,"v":1,"writer":"client"}\n')
        writers = [EventWriter(str(job), f"rank-{r}", "j") for r in range(8)]
        for w in writers:
            w.emit("step", step=0)
        os.utime(job / "events", ns=(10**18, 10**18))  # (as if a while had passed since a file was created)
        first = EventReader(str(job), remote)
        assert len(first.poll()) == 9
        writers[3].emit("step", step=1)
        assert [e.writer for e in first.poll()] == ["rank-3"]  # with its offset: a fast poll
        second = EventReader(str(job), remote)  # the same connection, no offset yet
        assert sorted(e.writer for e in second.poll()) == sorted(["client", "rank-3"] + [f"rank-{r}" for r in range(8)])
        assert remote.tails_fallback is None and remote.tails_probed is not None and remote.tails_probed >= 9
    finally:
        remote.close()
        proc.terminate()
        proc.wait(10)


def test_a_poll_costs_one_round_trip_at_2_and_at_2048_writers(tmp_path):
    """Round trips per poll over SSH, counted in the file-access layer (``SSHRemote.ops``):
    the first read, a steady poll after 10 % of the rank writers appended, and an idle one each
    cost one request, at 2 writers and at 2,048, and return what a local reader returns. The
    file-by-file SFTP path (the fallback, and the only path before) costs one call per grown
    file: shown on the same job as the baseline."""
    from hyperpod_lab.schedulers.remote import SSHRemote

    proc, ssh = _sshd(str(tmp_path))
    remote = SSHRemote(ClusterProfile(name="scale", orchestrator="slurm", shared_root=str(tmp_path),
                                      python=sys.executable, **ssh).validate())
    try:
        per_poll = {}
        for ranks in (2, BIG):
            job_dir, job_id = str(tmp_path / f"job-{ranks}"), f"scale-{ranks}"
            written = write_job(job_dir, job_id, ranks, steps=10)
            reader = EventReader(job_dir, remote)
            before = Counter(remote.ops)
            first = reader.poll()
            first_ops = Counter(remote.ops) - before
            local = EventReader(job_dir, LocalFiles()).poll()
            assert [e.key for e in first] == [e.key for e in local] and len(first) == written
            grown = grow(job_dir, job_id, ranks)
            before = Counter(remote.ops)
            new = reader.poll()
            steady_ops = Counter(remote.ops) - before
            before = Counter(remote.ops)
            assert reader.poll() == []
            idle_ops = Counter(remote.ops) - before
            assert len(new) == grown and all(e.kind == "checkpoint.saved" for e in new)
            per_poll[ranks] = (first_ops, steady_ops, idle_ops)
            if ranks == BIG:  # the old path on the same job: a call per grown file
                baseline = EventReader(job_dir, _SFTPOnly(remote), dict(reader.cursor))
                grow(job_dir, job_id, ranks, t=3e9)
                before = Counter(remote.ops)
                assert len(baseline.poll()) == grown
                sftp_ops = Counter(remote.ops) - before
        assert remote.tails_fallback is None
        for ranks, ops in per_poll.items():
            for o in ops:
                assert o == Counter({"exec": 1, "tails": 1}), (ranks, per_poll)
        assert per_poll[2] == per_poll[BIG]
        assert sftp_ops["sftp"] == 1 + grown, sftp_ops  # the baseline: a listing and a read per grown file
    finally:
        remote.close()
        proc.terminate()
        proc.wait(10)


def test_without_python_on_the_login_node_reads_over_sftp(tmp_path):
    """A login node without the profile's python: the reader says why once and reads the same
    events file by file over SFTP."""
    from hyperpod_lab.schedulers.remote import SSHRemote

    proc, ssh = _sshd(str(tmp_path))
    remote = SSHRemote(ClusterProfile(name="nopy", orchestrator="slurm", shared_root=str(tmp_path),
                                      python="/nonexistent/python3", **ssh).validate())
    try:
        job_dir = str(tmp_path / "job")
        written = write_job(job_dir, "nopy-1", 4, steps=10)
        events = EventReader(job_dir, remote).poll()
        assert len(events) == written
        assert remote.tails_fallback and "/nonexistent/python3" in remote.tails_fallback
        assert remote.ops["sftp list"] >= 1
    finally:
        remote.close()
        proc.terminate()
        proc.wait(10)


def _descendants_running(root_pid: int, marker: bytes) -> list[int]:
    """Processes below ``root_pid`` (our private sshd) whose command line holds ``marker``."""
    import os

    def parent(pid: int) -> int:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith("PPid:")))

    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker not in f.read():
                    continue
            pid = int(name)
            while pid > 1 and pid != root_pid:
                pid = parent(pid)
        except (OSError, StopIteration, ValueError):
            continue
        if pid == root_pid:
            found.append(int(name))
    return found


def test_a_killed_reader_program_is_started_again(tmp_path):
    """The login node's reader program killed between polls (an OOM kill, an admin): the next
    poll starts a new one on the same connection and misses nothing; no fall back to SFTP."""
    import os
    import signal

    from hyperpod_lab.schedulers.remote import SSHRemote

    proc, ssh = _sshd(str(tmp_path))
    remote = SSHRemote(ClusterProfile(name="kill", orchestrator="slurm", shared_root=str(tmp_path),
                                      python=sys.executable, **ssh).validate())
    try:
        job_dir = str(tmp_path / "job")
        written = write_job(job_dir, "kill-1", 16, steps=10)
        reader = EventReader(job_dir, remote)
        assert len(reader.poll()) == written
        pids = _descendants_running(proc.pid, b"def read_tails(")
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        grown = grow(job_dir, "kill-1", 16)
        assert len(reader.poll()) == grown
        assert remote.tails_fallback is None and remote.ops["sftp"] == 0, (remote.tails_fallback, remote.ops)
        again = _descendants_running(proc.pid, b"def read_tails(")
        assert len(again) == 1 and again != pids, (pids, again)
    finally:
        remote.close()
        proc.terminate()
        proc.wait(10)


class _SFTPOnly:
    """The remote's SFTP listing and reads only (no ``read_tails``)."""

    def __init__(self, remote):
        self.list_files, self.read_from = remote.list_files, remote.read_from


# ---- on a real jupyter server ----------------------------------------------------------------
# ``server``: a real jupyter server for the module (tests/conftest.py)


@pytest.fixture(scope="module")
def big_job(tmp_path_factory):
    job_dir = str(tmp_path_factory.mktemp("big") / "job")
    rec = track_local_job(job_dir, "scale-2048")
    written = write_job(job_dir, rec.job_id, BIG, steps=10)
    return rec, written


def test_rest_events_and_the_websocket_work_with_cursors_at_2048_writers(server, big_job):
    """REST events page through a 2,048-writer job with cursors, and the WebSocket resumes from
    one of its cursors with exactly the rest; every cursor is a short token, where the old form
    of the same cursor is over tornado's 64 KiB limit on a request's headers."""
    rec, written = big_job
    pages, cursor, lengths = [], None, []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        q = "?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        status, body = server.call("GET", f"/hyperpod/jobs/{rec.job_id}/events{q}", timeout_s=120)
        assert status == 200, (status, str(body)[:300])
        pages += body["events"]
        cursor = body["cursor"]
        lengths.append(len(cursor))
        if not body["events"] and not body["more"]:
            break
    assert len(pages) == written and len(set(_keys(pages))) == written
    assert max(lengths) <= 64, lengths
    full = EventReader(rec.job_dir).poll()
    assert len(encode_cursor({f"{e.writer}.jsonl": 10**5 for e in full})) > 65536  # the old form would not pass
    # the WebSocket from the cursor of the REST page that ended at event 2,000
    status, body = server.call("GET", f"/hyperpod/jobs/{rec.job_id}/events?limit=1000", timeout_s=120)
    status, body2 = server.call("GET", f"/hyperpod/jobs/{rec.job_id}/events?limit=1000&cursor={body['cursor']}",
                                timeout_s=120)
    assert status == 200 and len(body["events"]) + len(body2["events"]) == 2000
    seen = set(_keys(body["events"] + body2["events"]))
    rest_expected = [k for k in _keys(pages) if k not in seen]
    ws = server.ws(f"/hyperpod/jobs/{rec.job_id}/stream?cursor={body2['cursor']}", timeout_s=120)
    got, biggest, msgs = [], 0, 0
    try:
        while len(got) < len(rest_expected) and time.monotonic() < deadline:
            text = ws.recv()
            m = json.loads(text)
            msgs += 1
            biggest = max(biggest, len(text))
            if m["type"] == "event":
                got.append((m["event"]["writer"], m["event"]["seq"]))
                assert len(m["cursor"]) <= 64, m["cursor"]
                last_cursor = m["cursor"]
    finally:
        ws.close()
    assert sorted(got) == sorted(rest_expected) and len(set(got)) == len(got)
    assert biggest < 4096, biggest  # each message bounded: no per-file cursor in it
    # the last message's cursor resumes with nothing more (the job's events were all sent)
    status, body = server.call("GET", f"/hyperpod/jobs/{rec.job_id}/events?cursor={last_cursor}", timeout_s=120)
    assert status == 200 and body["events"] == [], body["events"][:3]


def test_a_replay_cut_by_backpressure_reads_each_byte_once(tmp_path):
    """A subscriber replaying a 256-writer job through a small send queue: every page cut by
    backpressure continues from the events already read and parsed (``Subscription.leftover``,
    the reader kept), so the replay reads the job's bytes about once (the tailer's own first
    read is the other once), where each cut page used to start a new reader from the cursor."""
    import asyncio
    import os

    from hyperpod_lab.server.watch.watcher import Watcher
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobStore

    client = Client(JobStore(str(tmp_path / "store")))
    rec = track_local_job(str(tmp_path / "job"), "replay", store=client.store)
    written = write_job(rec.job_dir, rec.job_id, 256, steps=100)
    events_dir = os.path.join(rec.job_dir, "events")
    job_bytes = sum(os.path.getsize(os.path.join(events_dir, f)) for f in os.listdir(events_dir) if f.endswith(".jsonl"))

    async def scenario():
        w = Watcher(client, stream_interval_s=0.05, page_bytes=64 << 10, send_queue_bytes=16 << 10,
                    window_events=64, stall_timeout_s=60)
        w.start()
        t = w.tailers[rec.job_id]
        deadline = time.monotonic() + 120
        while (not t.polled or t.more) and time.monotonic() < deadline:  # the tailer has read the job
            await asyncio.sleep(0.05)
        got, queued = [], [0]

        def send(m):
            queued[0] += len(json.dumps(m))
            if m["type"] == "event":
                got.append((m["event"]["writer"], m["event"]["seq"], len(m["cursor"])))
            return True

        async def drain():  # a client that reads everything every few milliseconds
            while True:
                queued[0] = 0
                await asyncio.sleep(0.005)

        drainer = asyncio.get_running_loop().create_task(drain())
        b0 = LocalFiles.bytes_read
        await w.subscribe(rec.job_id, {}, send, pending=lambda: queued[0])
        while len(got) < written and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        read = LocalFiles.bytes_read - b0
        drainer.cancel()
        await w.stop()
        return got, read

    got, read = asyncio.run(scenario())
    assert len(got) == written and len({g[:2] for g in got}) == written
    assert read <= 1.2 * job_bytes, (read, job_bytes)
    assert max(g[2] for g in got) <= 2048  # (the old form up to 32 files, then a token)


def test_rest_pages_continue_from_what_the_last_page_read(tmp_path):
    """Paging through a 256-writer job by REST (``read_events``, the events route's worker-thread
    part) reads the job's bytes about once: a request at the cursor where the last page stopped
    goes on with that page's reader and unreturned events, where each page used to read up to a
    page of every writer file again."""
    import os

    from hyperpod_lab.server.handlers.jobs import read_events
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobStore

    client = Client(JobStore(str(tmp_path / "store")))
    rec = track_local_job(str(tmp_path / "job"), "pages", store=client.store)
    written = write_job(rec.job_dir, rec.job_id, 256, steps=100)
    events_dir = os.path.join(rec.job_dir, "events")
    job_bytes = sum(os.path.getsize(os.path.join(events_dir, f)) for f in os.listdir(events_dir) if f.endswith(".jsonl"))
    b0 = LocalFiles.bytes_read
    cursor, got, more = {}, [], True
    while more:
        events, cursor, more = read_events(client, rec.job_id, cursor, 200)
        assert len(events) <= 200
        got += _keys(events)
    read = LocalFiles.bytes_read - b0
    assert len(got) == written and len(set(got)) == written
    assert read <= 1.2 * job_bytes, (read, job_bytes)
    assert read_events(client, rec.job_id, cursor, 200) == ([], cursor, False)


def test_triage_follow_with_a_cursor_of_256_ranks(server, tmp_path):
    """Log triage's follow cursor of 256 ranks x 2 logs (about 10 KB in the old form) comes back
    as a short token and reads on with only the new lines."""
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobRecord, new_job_id

    ranks = 256
    job_dir = tmp_path / "triage"
    (job_dir / "ranks").mkdir(parents=True)
    for r in range(ranks):
        slot = job_dir / "logs" / "torchrun" / "run1" / "attempt_0" / str(r)
        slot.mkdir(parents=True)
        (slot / "stdout.log").write_bytes(f"[rank{r}]: step 1 loss 2.0\n".encode())
        (slot / "stderr.log").write_bytes(b"")
        (job_dir / "ranks" / f"rank-{r}.json").write_text(json.dumps({"log_file": str(slot / "stdout.log"),
                                                                      "node": f"n{r // 8}"}))
    job_id = new_job_id("triage")
    Client().store.put(JobRecord(job_id, "triage", "local", "local", "0", str(job_dir), {}, status="failed"))
    url = f"/hyperpod/jobs/{job_id}/logs/triage?ranks=0-{ranks - 1}&failure=0"
    status, first = server.call("GET", url, timeout_s=120)
    assert status == 200, first
    assert len(first["cursor"]) <= 64, len(first["cursor"])
    for r in (3, 200):
        with open(job_dir / "logs" / "torchrun" / "run1" / "attempt_0" / str(r) / "stdout.log", "ab") as f:
            f.write(f"[rank{r}]: step 2 loss 1.5\n".encode())
    status, nxt = server.call("GET", f"{url}&cursor={first['cursor']}", timeout_s=120)
    assert status == 200, nxt
    texts = json.dumps(nxt["lines"])
    assert "step 2 loss 1.5" in texts and "step 1 loss" not in texts, texts[:500]
    assert len(nxt["cursor"]) <= 64


def test_pages_stay_in_time_order_when_a_file_read_to_its_end_has_events_held_back(tmp_path):
    """A page cut in one file holds back another file's later events although that file was
    read to its end: the next page (whose one-call read leaves out the unchanged file) still
    returns them in time order, none lost or repeated."""
    from hyperpod_lab.events import EventWriter

    now = [0.0]
    a = EventWriter(str(tmp_path), "rank-0", "j", clock=lambda: now[0])
    b = EventWriter(str(tmp_path), "rank-1", "j", clock=lambda: now[0])
    for i in range(100):
        now[0] = float(i)
        a.emit("step", step=i, pad="x" * 100)
        if i in (5, 50, 60):
            b.emit("checkpoint.saved", step=i, tier="memory")
    reader = EventReader(str(tmp_path), LocalFiles())
    got = []
    for _ in range(100):
        page = reader.poll(max_bytes=2048)
        got += page
        if not reader.more and not page:
            break
    assert len(got) == 103 and len({e.key for e in got}) == 103
    times = [e.time for e in got]
    assert times == sorted(times)


def test_a_replay_page_is_bounded_whatever_the_number_of_files(tmp_path, monkeypatch):
    """A replay page of a 256-writer job reads at most about ``PAGE_TOTAL_BYTES`` (here 1 MiB)
    all files together, where each page read up to ``page_bytes`` of every file (here the whole
    5 MB job in one page), and the replay still reads the job about once."""
    import asyncio
    import os

    from hyperpod_lab.server.watch import watcher as watcher_mod
    from hyperpod_lab.server.watch.watcher import Watcher
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobStore

    monkeypatch.setattr(watcher_mod, "PAGE_TOTAL_BYTES", 1 << 20)
    client = Client(JobStore(str(tmp_path / "store")))
    rec = track_local_job(str(tmp_path / "job"), "pages", store=client.store)
    written = write_job(rec.job_dir, rec.job_id, 256, steps=500)
    events_dir = os.path.join(rec.job_dir, "events")
    job_bytes = sum(os.path.getsize(os.path.join(events_dir, f)) for f in os.listdir(events_dir) if f.endswith(".jsonl"))
    assert job_bytes > 4 << 20

    async def scenario():
        w = Watcher(client, stream_interval_s=0.05, page_bytes=1 << 20, window_events=64)
        w.start()
        t = w.tailers[rec.job_id]
        deadline = time.monotonic() + 120
        while (not t.polled or t.more) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        pages, read_page = [], w._read_page

        def counted(*args, **kwargs):
            b = LocalFiles.bytes_read
            out = read_page(*args, **kwargs)
            pages.append(LocalFiles.bytes_read - b)
            return out

        w._read_page = counted
        got = []
        await w.subscribe(rec.job_id, {}, lambda m: (m["type"] == "event" and got.append(m)) or True)
        while len(got) < written and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await w.stop()
        return got, pages

    got, pages = asyncio.run(scenario())
    assert len(got) == written
    assert len(pages) > 1 and max(pages) <= 1.2 * (1 << 20), pages
    assert sum(pages) <= 1.2 * job_bytes, (sum(pages), job_bytes)
