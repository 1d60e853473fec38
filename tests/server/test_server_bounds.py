"""Bounded reads and backpressure of the server extension (issue 13, findings 3 and 4), on a real
jupyter-server (tests/jupyter_server_proc.py) with the local backend and real event files:

* ``GET events?limit=1`` on a 60 MB event file reads one page, not the file (finding 3);
* ``GET logs`` serves a tail by default and byte ranges on request (finding 3);
* subscribing to a job with 150k events does not block Jupyter's IOLoop (finding 4);
* WebSockets that never read do not grow the server's memory and are closed with a reason;
  the closed one reconnects from its cursor without loss (finding 4);
* a job takes at most ``max_subscribers`` WebSockets (finding 4).

Each test fails on the code before these fixes (whole-file reads, unbounded queues).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time

import pytest
from jupyter_server_proc import JupyterServer

from benchmarks._common import server_rss_mb, track_local_job, write_events

SETTINGS = {"send_queue_bytes": 256 * 1024, "stall_timeout_s": 3.0, "max_subscribers": 40}
BIG_EVENTS = 150_000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("server")
    srv = JupyterServer(str(tmp_path_factory.mktemp("root")), str(work))
    with open(srv.config) as f:
        cfg = json.load(f)
    cfg["HyperPodLab"] = SETTINGS
    with open(srv.config, "w") as f:
        json.dump(cfg, f)
    srv.start()
    yield srv
    srv.stop()
    assert not srv.auth_warnings(), srv.auth_warnings()


@pytest.fixture(scope="module")
def big_job(tmp_path_factory):
    """A running local job with BIG_EVENTS step events in one file (~30 MB)."""
    d = tmp_path_factory.mktemp("big")
    rec = track_local_job(str(d), "bounds-big")
    write_events(str(d), rec.job_id, BIG_EVENTS)
    return rec


def _status_latencies(srv, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        assert srv.call("GET", "/api/status", timeout_s=60)[0] == 200
        out.append(time.monotonic() - t0)
        time.sleep(0.02)


def test_events_limit_1_reads_one_page_not_the_whole_file(server, tmp_path):
    from hyperpod_lab.events import LocalFiles, decode_cursor
    from hyperpod_lab.server.handlers.jobs import read_events
    from hyperpod_lab.submit.client import Client

    rec = track_local_job(str(tmp_path), "bounds-limit")
    path = write_events(str(tmp_path), rec.job_id, 300_000, pad=100)  # ~60 MB
    assert os.path.getsize(path) > 55e6
    first_line = open(path, "rb").readline()
    hwm0 = server_rss_mb(server.proc.pid, peak=True)
    t0 = time.monotonic()
    status, body = server.call("GET", f"/hyperpod/jobs/{rec.job_id}/events?limit=1")
    took = time.monotonic() - t0
    assert status == 200, body
    assert [e["seq"] for e in body["events"]] == [0]
    assert decode_cursor(body["cursor"]) == {"rank-0.jsonl": len(first_line)}  # exactly one line
    assert body["more"] is True
    # the server's peak memory did not take in the 60 MB file (before the fix: + hundreds of MB)
    assert server_rss_mb(server.proc.pid, peak=True) - hwm0 < 20, (hwm0, server_rss_mb(server.proc.pid, peak=True))
    assert took < 2.0, took
    # the next page continues exactly after it
    status, body = server.call("GET", f"/hyperpod/jobs/{rec.job_id}/events?limit=2&cursor={body['cursor']}")
    assert [e["seq"] for e in body["events"]] == [1, 2]
    # in process, counted: one page is a few KiB of reading
    before = LocalFiles.bytes_read
    events, cursor, more = read_events(Client(), rec.job_id, {}, 1)
    assert len(events) == 1 and more and LocalFiles.bytes_read - before <= 8192, LocalFiles.bytes_read - before


def test_logs_tail_by_default_and_byte_ranges(server, tmp_path):
    from hyperpod_lab.jobdir import JobPaths
    from hyperpod_lab.submit.client import Client

    rec = track_local_job(str(tmp_path), "bounds-logs")
    os.makedirs(os.path.dirname(JobPaths(rec.job_dir).launcher_log), exist_ok=True)
    data = b"".join(b"line %07d\n" % i for i in range(300_000))  # 3.6 MB
    with open(JobPaths(rec.job_dir).launcher_log, "wb") as f:
        f.write(data)
    url = f"/hyperpod/jobs/{rec.job_id}/logs"
    status, body = server.call("GET", url)
    assert status == 200, body
    tail = 256 * 1024
    assert body["size"] == len(data) and body["end"] == len(data) and body["offset"] == len(data) - tail
    assert body["text"] == data[-tail:].decode() and body["rank"] is None
    status, body = server.call("GET", url + "?offset=13&length=26")
    assert (body["offset"], body["end"], body["text"]) == (13, 39, data[13:39].decode())
    status, body = server.call("GET", url + f"?offset={len(data) + 5}")
    assert (body["offset"], body["end"], body["text"], body["size"]) == (len(data), len(data), "", len(data))
    status, body = server.call("GET", url + "?length=10")
    assert body["text"] == data[-10:].decode()
    status, body = server.call("GET", url + "?length=99999999999")
    assert status == 400 and body["error"]["field"] == "length", body
    # the CLI's path still gets the whole log (read in pages)
    assert Client().logs(rec.job_id) == data.decode()


def test_subscribing_to_150k_events_does_not_block_the_ioloop(server, big_job):
    import websocket

    lat: list[float] = []
    stop = threading.Event()
    th = threading.Thread(target=_status_latencies, args=(server, stop, lat), daemon=True)
    th.start()
    time.sleep(0.5)
    ws = server.ws(f"/hyperpod/jobs/{big_job.job_id}/stream", timeout_s=120)
    seqs, t0 = [], time.monotonic()
    try:
        while len(seqs) < BIG_EVENTS and time.monotonic() - t0 < 240:
            m = json.loads(ws.recv())
            if m["type"] == "event":
                seqs.append(m["event"]["seq"])
    except websocket.WebSocketTimeoutException:
        pass
    finally:
        ws.close()
        stop.set()
        th.join(timeout=60)
    assert seqs == list(range(BIG_EVENTS)), (len(seqs), seqs[:3], seqs[-3:])
    lat.sort()
    p99 = lat[int(len(lat) * 0.99) - 1] if len(lat) >= 100 else lat[-1]
    # before the fix: the whole history was sent in one IOLoop callback (13 s for /api/status)
    assert len(lat) >= 20 and p99 < 0.5, (len(lat), statistics.median(lat), p99, max(lat))


def test_stalled_websockets_stay_bounded_and_are_closed_with_a_reason(server, big_job):
    import websocket

    rss0 = server_rss_mb(server.proc.pid)
    stalled = []
    t0 = time.monotonic()
    for _ in range(30):
        ws = server.ws(f"/hyperpod/jobs/{big_job.job_id}/stream", timeout_s=60)
        ws.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        stalled.append(ws)
    peak = rss0
    # they never read: the server holds at most the cap for each; the first is closed after
    # stall_timeout_s, and its close frame waits (tornado gives the client 5 s to answer it)
    while time.monotonic() < t0 + SETTINGS["stall_timeout_s"] + 1.5:
        time.sleep(0.2)
        peak = max(peak, server_rss_mb(server.proc.pid))
    # before the fix: every socket buffered the whole history (~30 x 40 MB)
    assert peak - rss0 < 150, (rss0, peak)
    for w in stalled:
        w.close()
    # one that stalls alone: once the server logged closing it, it reads again (tornado waits 5 s
    # for the answer to its close frame): its messages, then the close frame with the reason
    closes = server.log_text().count("closing a subscriber")
    ws = server.ws(f"/hyperpod/jobs/{big_job.job_id}/stream", timeout_s=60)
    deadline = time.monotonic() + SETTINGS["stall_timeout_s"] + 60
    while server.log_text().count("closing a subscriber") == closes:
        assert time.monotonic() < deadline, "the stalled subscriber was never closed"
        time.sleep(0.1)
    last, code, reason = None, None, ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            opcode, data = ws.recv_data(control_frame=True)
        except (websocket.WebSocketConnectionClosedException, ConnectionError):
            break
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            code, reason = int.from_bytes(data[:2], "big"), data[2:].decode()
            break
        if opcode == websocket.ABNF.OPCODE_TEXT:
            m = json.loads(data)
            if m["type"] == "event":
                last = m
    ws.close()
    assert code == 4008 and reason.startswith("slow consumer"), (code, reason)
    assert last is not None
    # it reconnects from its last cursor: the next event, none lost, none twice
    ws = server.ws(f"/hyperpod/jobs/{big_job.job_id}/stream?cursor={last['cursor']}", timeout_s=60)
    try:
        first = None
        while first is None:
            m = json.loads(ws.recv())
            if m["type"] == "event":
                first = m["event"]["seq"]
    finally:
        ws.close()
    assert first == last["event"]["seq"] + 1
    assert server_rss_mb(server.proc.pid) - rss0 < 150


def test_a_job_takes_at_most_max_subscribers(server, tmp_path):
    import websocket

    rec = track_local_job(str(tmp_path), "bounds-cap")
    write_events(str(tmp_path), rec.job_id, 5)
    socks = [server.ws(f"/hyperpod/jobs/{rec.job_id}/stream") for _ in range(SETTINGS["max_subscribers"])]
    try:
        for ws in socks:  # all of them subscribed (their first message came)
            assert json.loads(ws.recv())["type"] == "status"
        with pytest.raises(websocket.WebSocketBadStatusException) as e:
            server.ws(f"/hyperpod/jobs/{rec.job_id}/stream")
        assert e.value.status_code == 429
        assert b"TooManySubscribers" in (e.value.resp_body or b"")
    finally:
        for ws in socks:
            ws.close()
    deadline = time.monotonic() + 10
    while True:  # once they closed, a new one is taken
        try:
            ws = server.ws(f"/hyperpod/jobs/{rec.job_id}/stream")
            break
        except websocket.WebSocketBadStatusException:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert json.loads(ws.recv())["type"] == "status"
    ws.close()
