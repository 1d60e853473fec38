"""Reading a job's events at 2, 64, 512 and 2,048 ranks (issue 27, items 1-2 and 6 in part).

Synthetic jobs written by the project's own :class:`~hyperpod_lab.events.EventWriter` (one file per
writer, as a real job): ``step`` events from rank 0 only (as the runtime writes them), a
``checkpoint.saved`` (memory tier, with its ``rank`` and ``node`` as the runtime's) per rank every 5 steps (as ranks
alone on their nodes write them; 8 ranks a node now write one for the node,
:mod:`hyperpod_lab.runtime.checkpoint.node_saves`, so this is 8x a real job's checkpoint events:
the worst case is the default, and the numbers stay comparable with earlier runs; ``--node-events``
writes the runtime's shape instead: one a node and step, from its lowest rank, whose file is then
the only rank file of its node, and the steady poll grows 10 % of those; and each node's pre-flight
``health.checked`` in its own ``health-<node>`` file, as the batch script's health check writes it,
so the files are those of a real job at 8 ranks a node), one agent per node of 8 ranks, the
supervisor's ``started``, the client's ``submitted``, and one fault (``fault.detected``,
``recovery.started``/``completed`` from node 0's agent). Each job is read with an
:class:`~hyperpod_lab.events.EventReader`:

* ``local``: this machine's files (:class:`~hyperpod_lab.events.LocalFiles`);
* ``ssh``: the dev cluster's sshd on loopback (``hyperpod_lab.devcluster.profile_for()``; nothing
  is submitted to Slurm), through :class:`~hyperpod_lab.schedulers.remote.SSHRemote`: once with
  its one-command read (``read_tails``, :mod:`hyperpod_lab.tails`) and once file by file over
  SFTP (``--no-sftp`` skips it; the old path, as a baseline in the same run).

Measured per job and path: the first read (every event, s), a steady poll after 10 % of the
rank writers appended one event (s; the median of ``--repeat``, 5), an idle poll (nothing new), the round trips of each
(``SSHRemote.ops``: one per command or SFTP request), the files the local steady poll probed
(``tails.FileTailer.probed``: with the job's change log, the files that grew), and the cursor's size as clients get it
(the old base64 JSON form, and the server's bounded form, :mod:`hyperpod_lab.server.cursors`).
The SSH reader program's start (once per connection) is measured apart
(``ssh_reader_start_s``). Ratios against the 2-rank job of the same run. JSON to ``benchmarks/results/scale.json``.

``--server``: the same jobs through a real jupyter server (local files): the dashboard's cold
fold (``GET hyperpod/jobs/<id>/dashboard`` until it is no longer ``partial``: the GETs, the
longest one, the reply's size), every event by REST pages of 1,000 with cursors, and a
WebSocket replay from the first event (events/s, the longest cursor and message). The server's
memory (``/proc/<pid>/status``: ``VmRSS``, and ``VmHWM``, the peak since it was reset through
``/proc/<pid>/clear_refs`` before each job) before the job's record exists (its events already
written), after its dashboard fold and after the REST read and the replay, in MB; growth per job
and its ratio against the first (2-rank) job's. ``--server-only``: no reader rows (only the server's).

Run: ``.venv/bin/python benchmarks/scale.py [--ranks 2,64,512,2048] [--steps 100]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import write_results
from hyperpod_lab.events import EventReader, EventWriter, LocalFiles, encode_cursor

RANKS_PER_NODE = 8


def _writers(ranks: int, node_events: bool) -> list[int]:
    """The ranks that write checkpoint events: every rank, or (``node_events``) each node's lowest."""
    return list(range(0, ranks, RANKS_PER_NODE)) if node_events else list(range(ranks))


def write_job(job_dir: str, job_id: str, ranks: int, steps: int = 100, every: int = 5, t0: float = 1.7e9,
              step_s: float = 0.1, fault_rank: int = 1, node_events: bool = False) -> int:
    """Write a synthetic job of ``ranks`` ranks into ``job_dir/events`` (see the module docstring)
    with EventWriter; ``steps`` steps of ``step_s`` s from ``t0``; the fault is rank
    ``fault_rank`` (modulo ``ranks``)'s, reported by its node's agent. ``node_events``: one memory
    ``checkpoint.saved`` a node and step, from its lowest rank, with the node's ``ranks`` and
    ``rank_bytes`` (as the runtime writes them at 8 ranks a node); the other ranks write no event
    (and have no event file), and each node's pre-flight ``health.checked`` is in its ``health-<node>``
    file. Returns the events written."""
    now = [t0]
    clock = lambda: now[0]  # noqa: E731
    nodes = max(1, (ranks + RANKS_PER_NODE - 1) // RANKS_PER_NODE)
    client = EventWriter(job_dir, "client", job_id, clock=clock)
    sup = EventWriter(job_dir, "supervisor", job_id, clock=clock)
    agents = [EventWriter(job_dir, f"agent-n{i}", job_id, clock=clock) for i in range(nodes)]
    rank_w = {r: EventWriter(job_dir, f"rank-{r}", job_id, clock=clock) for r in _writers(ranks, node_events)}
    client.emit("submitted", nodes=nodes)
    now[0] += 0.5
    n = 1
    if node_events:  # every node's pre-flight check, before the job starts (hyperpod_lab.node.health)
        for i in range(nodes):
            EventWriter(job_dir, f"health-n{i}", job_id, clock=clock).emit(
                "health.checked", node=f"n{i}", run_id="1", ok=True, checks=[], seconds=0.5)
            n += 1
    sup.emit("started", nodes=nodes, world_size=ranks)
    n += 1
    for step in range(steps):
        now[0] = t0 + 1 + step * step_s
        rank_w[0].emit("step", step=step, loss=1.0 / (step + 1), step_time_s=step_s)
        n += 1
        if step % every == every - 1:
            for r, w in rank_w.items():
                now[0] = t0 + 1 + step * step_s + 0.01 + r * 1e-6
                if node_events:
                    local = list(range(r, min(r + RANKS_PER_NODE, ranks)))
                    w.emit("checkpoint.saved", tier="memory", step=step, rank=r, node=f"n{r // RANKS_PER_NODE}",
                           bytes=len(local) << 20, ranks=local, rank_bytes=[1 << 20] * len(local),
                           memory_bytes=len(local) << 20)
                else:
                    w.emit("checkpoint.saved", tier="memory", step=step, rank=r, node=f"n{r // RANKS_PER_NODE}",
                           bytes=1 << 20)
                n += 1
        if step == steps // 2:
            now[0] += 0.02
            fr = fault_rank % ranks
            agent = agents[fr // RANKS_PER_NODE]
            agent.emit("fault.detected", rank=fr, node=f"n{fr // RANKS_PER_NODE}", reason="exception", exitcode=1)
            agent.emit("recovery.started", rank=fr)
            now[0] += 0.03
            agent.emit("recovery.completed", downtime_s=0.05)
            n += 3
    return n


def grow(job_dir: str, job_id: str, ranks: int, fraction: float = 0.1, t: float = 2e9,
         node_events: bool = False, change_log: bool = True) -> int:
    """Append one ``checkpoint.saved`` to ``fraction`` of the rank files (at least one; with
    ``node_events``, of the node's lowest ranks' files, the only ones); ``change_log`` False: the
    writers do not name their files in the job's change log. Returns how many."""
    writers = _writers(ranks, node_events)
    k = max(1, int(len(writers) * fraction))
    for r in writers[::max(1, len(writers) // k)][:k]:
        w = EventWriter(job_dir, f"rank-{r}", job_id, clock=lambda: t)
        if not change_log:
            w._ring = lambda: None
        w.emit("checkpoint.saved", tier="memory", step=10**6, rank=r)
    return k


class _SFTPOnly:
    """The SSHRemote's SFTP listing and reads only (no ``read_tails``): the file-by-file baseline."""

    def __init__(self, remote):
        self.list_files, self.read_from, self.ops = remote.list_files, remote.read_from, remote.ops


def _ops(files) -> int:
    ops = getattr(files, "ops", None)
    return 0 if ops is None else ops["exec"] + ops["sftp"]


def _probed(files) -> int | None:
    """Files the last steady poll probed (``tails.FileTailer.probed``, locally or, over SSH, as
    the login node's program replied); None when not known or the poll listed the directory."""
    if hasattr(files, "tails_probed"):  # SSHRemote: the login node's program says
        return files.tails_probed
    tailer = getattr(getattr(files, "_per_thread", None), "tailer", None)
    return None if tailer is None else tailer.probed


def measure(job_dir: str, job_id: str, ranks: int, files, label: str, repeat: int = 5, node_events: bool = False) -> dict:
    """First read, steady and idle poll of one job through ``files`` (see the module docstring)."""
    from hyperpod_lab.server.cursors import CursorStore

    reader = EventReader(job_dir, files)
    o, t = _ops(files), time.perf_counter()
    events = reader.poll()
    first_s, first_ops = time.perf_counter() - t, _ops(files) - o
    steady, idle_t = [], []
    for i in range(repeat):  # medians: this machine is shared
        grown = grow(job_dir, job_id, ranks, t=2e9 + i, node_events=node_events)
        o, t = _ops(files), time.perf_counter()
        new = reader.poll()
        steady.append(time.perf_counter() - t)
        steady_ops = _ops(files) - o
        probed = _probed(files)
        assert len(new) == grown, (label, len(new), grown)
        o, t = _ops(files), time.perf_counter()
        idle = reader.poll()
        idle_t.append(time.perf_counter() - t)
        idle_ops = _ops(files) - o
    steady_s, idle_s = statistics.median(steady), statistics.median(idle_t)
    assert len(new) == grown and not idle, (label, len(new), grown, len(idle))
    old_cursor = encode_cursor(reader.cursor)
    token = CursorStore(None).issue(job_id, reader.cursor)
    return {"path": label, "ranks": ranks, "files": len(reader.cursor), "events": len(events),
            "first_read_s": round(first_s, 4), "first_read_round_trips": first_ops,
            "steady_poll_s": round(steady_s, 5), "steady_round_trips": steady_ops, "steady_grown_writers": grown,
            "idle_poll_s": round(idle_s, 5), "idle_round_trips": idle_ops, "steady_files_probed": probed,
            "cursor_old_chars": len(old_cursor), "cursor_chars": len(token)}


def measure_interleaved(jobs: list[tuple[str, str, int, bool]], files, label: str, repeat: int,
                        node_events: bool) -> list[dict]:
    """The steady and idle polls of every job of ``jobs`` (``(job_dir, job_id, ranks, change
    log)``: with the job's change log, or without it: no ``changes.log``, every poll probes every
    file, as before it) through ``files``, in turns: round i grows and polls each job once, so
    every job's median comes from the same moments of this machine and of the SSH connection (a
    shared machine's noise moves all of them alike, and their ratios stay). First reads as
    :func:`measure`."""
    readers, steady, idle, probed = [], [[] for _ in jobs], [[] for _ in jobs], [None] * len(jobs)
    for job_dir, _, _, _ in jobs:
        reader = EventReader(job_dir, files)
        reader.poll()
        reader.poll()  # (a directory listed within 0.1 s of its last change is listed once more)
        readers.append(reader)
    for i in range(repeat):
        for j, ((job_dir, job_id, ranks, log), reader) in enumerate(zip(jobs, readers)):
            grown = grow(job_dir, job_id, ranks, t=3e9 + i, node_events=node_events, change_log=log)
            t = time.perf_counter()
            new = reader.poll()
            steady[j].append(time.perf_counter() - t)
            probed[j] = _probed(files)
            t = time.perf_counter()
            none = reader.poll()
            idle[j].append(time.perf_counter() - t)
            assert len(new) == grown and not none, (label, ranks, len(new), grown, len(none))
    return [{"path": label, "ranks": ranks, "change_log": log, "files": len(reader.cursor), "interleaved": True,
             "steady_poll_s": round(statistics.median(st), 6), "idle_poll_s": round(statistics.median(it), 6),
             "steady_poll_p90_s": round(sorted(st)[int(0.9 * (len(st) - 1))], 6),
             "steady_files_probed": pr, "steady_grown_writers": grow_count(ranks, node_events)}
            for (_, _, ranks, log), reader, st, it, pr in zip(jobs, readers, steady, idle, probed)]


def grow_count(ranks: int, node_events: bool, fraction: float = 0.1) -> int:
    """How many writers :func:`grow` appends to."""
    return max(1, int(len(_writers(ranks, node_events)) * fraction))


def _rss(pid: int) -> dict:
    """The server's ``VmRSS`` and ``VmHWM`` now (MB, 1 decimal)."""
    from benchmarks._common import server_rss_mb

    return {"rss_mb": round(server_rss_mb(pid), 1), "hwm_mb": round(server_rss_mb(pid, peak=True), 1)}


def reset_peak(pid: int) -> bool:
    """Reset process ``pid``'s ``VmHWM`` to its RSS now (``echo 5 > /proc/<pid>/clear_refs``,
    Linux >= 4.0; our own child only). Returns whether it could."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def list_jobs(url: str, token: str) -> int:
    """``GET hyperpod/jobs`` once (the server then tracks every job it lists). Returns how many."""
    import json
    import urllib.request

    req = urllib.request.Request(f"{url}/hyperpod/jobs", headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        body = json.loads(r.read())
    return len(body["jobs"])


def fold_dashboard(url: str, token: str, job_id: str, events: int, timeout_s: float = 600.0) -> dict:
    """``GET hyperpod/jobs/<id>/dashboard`` until the reply is not ``partial`` (the server's cold
    fold of job ``job_id``, ``events`` expected), then once with ``?node=`` of its first node lane.
    Returns the fold's time (s), GETs, the longest GET (s), the reply's size (bytes), its lanes
    and the expanded node's lanes."""
    import json
    import urllib.parse
    import urllib.request

    def get(q: str) -> tuple[dict, int, float]:
        req = urllib.request.Request(f"{url}/hyperpod/jobs/{job_id}/dashboard?points=1000{q}",
                                     headers={"Authorization": f"token {token}"})
        t1 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            raw = r.read()
        return json.loads(raw), len(raw), time.perf_counter() - t1

    t, gets, longest = time.perf_counter(), 0, 0.0
    while True:
        body, size, took = get("")
        gets, longest = gets + 1, max(longest, took)
        if not body["partial"] or time.perf_counter() - t > timeout_s:
            break
    fold_s = time.perf_counter() - t
    assert body["events"] == events and not body["partial"], (body["events"], events, body["partial"])
    node = body["nodes"][0]
    expanded, expanded_size, expanded_s = get(f"&node={urllib.parse.quote(node)}")
    return {"dashboard_fold_s": round(fold_s, 3), "dashboard_gets": gets, "dashboard_get_max_s": round(longest, 3),
            "dashboard_bytes": size, "dashboard_lanes": len(body["lanes"]),
            "expanded_lanes": len(expanded["expanded"]["lanes"]), "expanded_bytes": expanded_size,
            "expanded_s": round(expanded_s, 3)}


def serve(url: str, token: str, job_id: str, events: int, timeout_s: float = 600.0, pid: int | None = None) -> dict:
    """Through a real jupyter server: every event of job ``job_id`` by REST pages of 1,000 with
    cursors, then by a WebSocket replay from the first event (``events`` expected). Returns the
    times (s), rates (events/s), the longest cursor (chars) and message (bytes); with the
    server's ``pid``, its RSS after the REST read (MB)."""
    import json
    import urllib.request

    import websocket

    hdr = {"Authorization": f"token {token}"}
    t, cursor, got, longest = time.perf_counter(), None, 0, 0
    while True:
        q = "?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        req = urllib.request.Request(f"{url}/hyperpod/jobs/{job_id}/events{q}", headers=hdr)
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            body = json.loads(r.read())
        got += len(body["events"])
        cursor = body["cursor"]
        longest = max(longest, len(cursor))
        if not body["events"] and not body["more"]:
            break
    rest_s = time.perf_counter() - t
    assert got == events, (got, events)
    rss_rest = _rss(pid)["rss_mb"] if pid is not None else None
    ws = websocket.create_connection(url.replace("http", "ws") + f"/hyperpod/jobs/{job_id}/stream",
                                     header=[f"Authorization: token {token}"], timeout=timeout_s)
    t, n, biggest = time.perf_counter(), 0, 0
    try:
        while n < events and time.perf_counter() - t < timeout_s:
            text = ws.recv()
            biggest = max(biggest, len(text))
            n += json.loads(text)["type"] == "event"
    finally:
        ws.close()
    ws_s = time.perf_counter() - t
    return {"rest_s": round(rest_s, 3), "rest_events_per_s": round(got / rest_s), "rest_cursor_max_chars": longest,
            "ws_replay_s": round(ws_s, 3), "ws_events": n, "ws_events_per_s": round(n / ws_s),
            "ws_message_max_bytes": biggest, **({"rss_after_rest_mb": rss_rest} if pid is not None else {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="2,64,512,2048", help="comma-separated rank counts (the first is the baseline)")
    ap.add_argument("--steps", type=int, default=100, help="steps of each synthetic job (checkpoint every 5)")
    ap.add_argument("--repeat", type=int, default=5, help="steady and idle polls measured per job and path (medians)")
    ap.add_argument("--no-change-log", action="store_true",
                    help="the baseline without the change log (events/changes.log removed, writers not naming "
                         "their files in it): every poll probes every file, as before it")
    ap.add_argument("--interleave", action="store_true",
                    help="only the steady and idle polls (local, ssh), every job polled in turn each round "
                         "(measure_interleaved): ratios from the same moments")
    ap.add_argument("--no-ssh", action="store_true", help="local files only")
    ap.add_argument("--node-events", action="store_true", help="one memory checkpoint.saved a node and step (the "
                                                               "runtime's at 8 ranks a node) instead of one a rank "
                                                               "(the worst case, the default)")
    ap.add_argument("--no-sftp", action="store_true", help="skip the file-by-file SFTP baseline")
    ap.add_argument("--server", action="store_true", help="also REST events and a WebSocket replay through a "
                                                            "real jupyter server (local files)")
    ap.add_argument("--server-only", action="store_true", help="--server without the reader rows (local, ssh, sftp)")
    ap.add_argument("--listed", action="store_true", help="with --server: list the jobs first (GET hyperpod/jobs, as "
                                                          "the sidebar does), so the server tracks the job and its "
                                                          "tailer folds it before the dashboard; default: the "
                                                          "WebSocket subscription is what first tracks it, and that "
                                                          "tailer's first read of the whole job runs beside the replay")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "scale.json"))
    args = ap.parse_args(argv)
    args.server = args.server or args.server_only
    if args.no_change_log:
        EventWriter._ring = lambda self: None  # (this process's writers: the synthetic jobs)
    ranks = [int(x) for x in args.ranks.split(",")]
    remote = base = None
    if not args.no_ssh:
        from hyperpod_lab import devcluster
        from hyperpod_lab.schedulers.remote import SSHRemote

        profile = devcluster.profile_for()
        base = os.path.join(profile.shared_root, "hyperpod-lab-bench")
        os.makedirs(base, mode=0o700, exist_ok=True)
        remote = SSHRemote(profile)
    work = tempfile.mkdtemp(prefix="scale-", dir=base)
    rows = []
    served = []
    server = None
    if args.server:
        from benchmarks._common import start_jupyter_server

        data_dir = os.path.join(work, "data")
        os.makedirs(data_dir, mode=0o700)
        server = start_jupyter_server(work, work, {"HYPERPOD_LAB_DATA_DIR": data_dir})
    reader_start_s = None
    if remote is not None:  # the connection and its reader program start once, not per job
        remote.list_files(work)
        t = time.perf_counter()
        remote.read_tails(work, {}, None, 0)
        reader_start_s = round(time.perf_counter() - t, 4)
        print(f"reader program started on the login node in {reader_start_s:.3f} s", flush=True)
    try:
        if args.interleave:  # each job twice: with its change log and without (the baseline)
            jobs = [(os.path.join(work, f"job-{n}{'' if log else '-nolog'}"), f"scale-{n}", n, log)
                    for log in (True, False) for n in ranks]
            for job_dir, job_id, n, log in jobs:
                written = write_job(job_dir, job_id, n, steps=args.steps, node_events=args.node_events)
                if not log:
                    os.remove(os.path.join(job_dir, "events", "changes.log"))
                print(f"{n} ranks{'' if log else ', no change log'}: {written} events written", flush=True)
            time.sleep(0.2)
            for label, files in [("local", LocalFiles())] + ([("ssh", remote)] if remote is not None else []):
                for row in measure_interleaved(jobs, files, label, args.repeat, args.node_events):
                    rows.append(row)
                    print(f"  {label:5s} {row['ranks']:5d} ranks{'' if row['change_log'] else ' (no log)'}: steady "
                          f"{row['steady_poll_s'] * 1e3:.2f} ms (p90 "
                          f"{row['steady_poll_p90_s'] * 1e3:.2f}; {row['steady_files_probed']} of {row['files']} "
                          f"files probed, {row['steady_grown_writers']} new events), idle "
                          f"{row['idle_poll_s'] * 1e3:.2f} ms", flush=True)
            ranks_done: list[int] = []
        else:
            ranks_done = ranks
        for n in ranks_done:
            job_dir, job_id = os.path.join(work, f"job-{n}"), f"scale-{n}"
            paths = []
            if not args.server_only:
                t = time.perf_counter()
                written = write_job(job_dir, job_id, n, steps=args.steps, node_events=args.node_events)
                write_s = time.perf_counter() - t
                print(f"{n} ranks: {written} events written in {write_s:.1f} s", flush=True)
                paths = [("local", LocalFiles())]
                if remote is not None:
                    paths.append(("ssh", remote))
                    if not args.no_sftp:
                        paths.append(("sftp", _SFTPOnly(remote)))
            for label, files in paths:
                row = measure(job_dir, job_id, n, files, label, repeat=args.repeat, node_events=args.node_events)
                row["events_written"] = written
                rows.append(row)
                print(f"  {label:5s} first {row['first_read_s']:.3f} s ({row['first_read_round_trips']} round trips), "
                      f"steady {row['steady_poll_s'] * 1e3:.2f} ms ({row['steady_round_trips']}; "
                      f"{row['steady_files_probed'] if row['steady_files_probed'] is not None else '?'} of "
                      f"{row['files']} files probed), idle "
                      f"{row['idle_poll_s'] * 1e3:.1f} ms ({row['idle_round_trips']}), cursor "
                      f"{row['cursor_old_chars']} -> {row['cursor_chars']} chars", flush=True)
            if server is not None:
                from benchmarks._common import track_local_job
                from hyperpod_lab.submit.jobs import JobStore, new_job_id

                sdir, pid = os.path.join(work, f"served-{n}"), server[0].pid
                served_id = new_job_id(f"scale-{n}")
                count = write_job(sdir, served_id, n, steps=args.steps, node_events=args.node_events)  # written before the server knows the job
                peak_reset = reset_peak(pid)
                before = _rss(pid)
                rec = track_local_job(sdir, f"scale-{n}", store=JobStore(os.path.join(work, "data", "jobs")),
                                      job_id=served_id)
                if args.listed:
                    list_jobs(server[1], server[2])
                row = {"ranks": n, "events": count, "listed": args.listed, **fold_dashboard(server[1], server[2], rec.job_id, count)}
                folded = _rss(pid)
                row.update(serve(server[1], server[2], rec.job_id, count, pid=pid))
                after = _rss(pid)
                row.update(rss_before_mb=before["rss_mb"], rss_after_fold_mb=folded["rss_mb"],
                           hwm_fold_mb=folded["hwm_mb"] if peak_reset else None, rss_after_serve_mb=after["rss_mb"],
                           hwm_serve_mb=after["hwm_mb"] if peak_reset else None,
                           rss_growth_fold_mb=round(folded["rss_mb"] - before["rss_mb"], 1),
                           rss_growth_mb=round(after["rss_mb"] - before["rss_mb"], 1),
                           peak_growth_mb=round(after["hwm_mb"] - before["rss_mb"], 1) if peak_reset else None)
                served.append(row)
                print(f"  server: dashboard cold fold {row['dashboard_fold_s']:.2f} s ({row['dashboard_gets']} GETs, "
                      f"longest {row['dashboard_get_max_s']:.2f} s, {row['dashboard_bytes']} bytes, "
                      f"{row['dashboard_lanes']} lanes); RSS {before['rss_mb']:.0f} -> {folded['rss_mb']:.0f} MB "
                      f"(fold) -> {row['rss_after_rest_mb']:.0f} MB (REST) -> {after['rss_mb']:.0f} MB (replay), peak {after['hwm_mb']:.0f} MB", flush=True)
                print(f"  server: REST {row['rest_s']:.2f} s ({row['rest_events_per_s']} events/s, cursor <= "
                      f"{row['rest_cursor_max_chars']} chars), WebSocket replay {row['ws_replay_s']:.2f} s "
                      f"({row['ws_events_per_s']} events/s, messages <= {row['ws_message_max_bytes']} bytes)", flush=True)
                shutil.rmtree(sdir, ignore_errors=True)
            shutil.rmtree(job_dir, ignore_errors=True)
    finally:
        if server is not None:
            from benchmarks._common import stop_procs

            stop_procs([server[0]])
        shutil.rmtree(work, ignore_errors=True)
        if remote is not None:
            remote.close()
    base_rows = {(r["path"], r.get("change_log")): r for r in rows if r["ranks"] == ranks[0]}
    for r in rows:
        b = base_rows.get((r["path"], r.get("change_log")))
        if b:
            for k in ("first_read_s", "steady_poll_s", "idle_poll_s", "steady_round_trips", "cursor_chars"):
                if k in r and k in b:
                    r[f"{k}_ratio"] = round(r[k] / b[k], 3) if b[k] else None
    for r in served:  # growth ratios: None where the first job's growth is under 1 MB (noise)
        for k in ("rss_growth_fold_mb", "rss_growth_mb", "peak_growth_mb", "dashboard_fold_s", "dashboard_bytes"):
            b = served[0].get(k)
            r[f"{k}_ratio"] = round(r[k] / b, 2) if r.get(k) is not None and b and (abs(b) >= 1 or "mb" not in k) else None
    return write_results(args.out, {"benchmark": "scale", "steps": args.steps, "ranks": ranks,
                                    "interleave": args.interleave, "repeat": args.repeat,
                                    "change_log": not args.no_change_log,
                                    "checkpoint_events": "node" if args.node_events else "rank",
                                    "ssh_reader_start_s": reader_start_s, "server": served,
                                    "loadavg": os.getloadavg(), "rows": rows})


if __name__ == "__main__":
    sys.exit(main())
