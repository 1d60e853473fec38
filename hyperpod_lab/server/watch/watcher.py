"""The server's one view of every job: a batched status watcher and one event tailer per job.

* **Status**: one loop refreshes all non-terminal jobs through ``Client.refresh`` (one
  ``squeue``/``sacct`` per cluster per tick, never one poll per job or per browser tab), every
  ``min_interval_s`` while something changes or someone watches, backing off to
  ``max_interval_s`` when nothing does, and after a cluster error.
* **Events**: one :class:`Tailer` per job reads its event files (``EventReader`` over the
  cluster's remote seam) and fans the events out to every subscriber (WebSocket, any number of
  tabs). Watched jobs are read every ``stream_interval_s``, in their own worker call ahead of
  the others; unwatched running jobs (for the jobs list's progress) are read at most
  ``idle_batch`` per call and back off to ``idle_max_interval_s``.
* Each job's ``progress`` is the job facts fold (:mod:`hyperpod_lab.fold.facts`, through
  :class:`~hyperpod_lab.fold.progress.Progress`) over its events: the same faults, recoveries and
  downtime as ``client.summarize`` and the goodput measurement. Subscribers get a ``status``
  message on each state change and whenever ``progress.faults``, ``progress.recoveries``,
  the excluded nodes (``progress.excluded_nodes``) or the nodes that failed a pre-flight
  health check (``progress.health``) change (right after the event that changed them).
* Each tailer's cursor and progress summary are saved in the JobStore, so a restarted server
  resumes where it was.
* **Goodput** (issue 13, finding 3): each tailer also feeds a
  :class:`~hyperpod_lab.goodput.GoodputMeter` (the goodput measurement folded incrementally,
  bounded state) over the same facts, saved beside the progress (its ``"goodput"`` key), so
  :meth:`Watcher.goodput` answers a tracked job without reading anything; an untracked job is
  read once, in pages, and its meter kept with its cursor (``goodput_cache_jobs`` of them), so
  the next request reads only the new bytes.
* **Dashboard** (issue 18): the same way, each tailer folds a
  :class:`~hyperpod_lab.fold.aggregate.JobAggregate` (lanes, timeline, downsampled series; bounded
  state), saved beside the progress (its ``"aggregate"`` key); :meth:`Watcher.dashboard`
  answers a tracked job from it without reading anything, any other job from a cached
  aggregate brought up to date page by page.

* **Notifications** (issue 16, item 3): a job whose files this machine sees through its own
  mount of the cluster's shared storage (``local_mount``, ``schedulers/remote/__init__.py``'s
  ``MountedRemote``) has its ``events/`` directory watched with ``watchdog`` (inotify on Linux):
  an appended or new event file wakes the job's tailer at once, and the timed read becomes a
  fallback every ``notify_fallback_s``. Notifications are trusted only while they announce what
  the reads find: a timed read that finds events no notification announced (a network file
  system such as Lustre or NFS tells a client of its own writes, not of other hosts') returns the
  job to reads every ``stream_interval_s``. Without watchdog, or where a watch cannot be set, the
  reads are timed as for any job (``notify=False`` turns notifications off).

Everything runs on the tornado IOLoop; every blocking call runs in a worker thread: each
cluster has its own for its commands (status refreshes, submits: a slow cluster never delays
another cluster's calls), and the store and the calls of no cluster have one more. A cluster's
event reads have a worker per lane beside it (:meth:`Watcher.run_on_reads`): live watched jobs,
backlogs, idle jobs and replay pages, so a live job's read never queues behind a status
refresh's ``squeue``/``sacct`` nor behind a page of a million-event replay (issue 27); remote reads
share the cluster's SSH connection, each on its own channel. The three
read lanes are tasks of their own (a lane still reading keeps its due jobs for the next round;
no lane waits for another), and saving cursors is a task of its own too. Every read is bounded
(issue 13, finding 3): a tailer reads at most ``read_bytes`` of each event file per call and
comes back at once when there is more.

Backpressure (issue 13, finding 4): a tailer keeps only a window of its newest events, and only
while someone watches (``window_events``); a subscriber behind that window replays the history
from the files in pages of ``page_bytes`` per file, one executor call per page, so the IOLoop
runs between pages. A subscriber whose transport reports ``pending()`` bytes at or over
``send_queue_bytes`` gets nothing more (its cursor stays where it was) until it drained to half
of that, then catches up from its cursor the same way; one that stays over it for
``stall_timeout_s`` is closed through its ``close(reason)``. A job takes at most
``max_subscribers`` subscribers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any, Callable

from hyperpod_lab.errors import HyperPodLabError
from hyperpod_lab.events import Event, EventKind, EventReader
from hyperpod_lab.fold.progress import Progress
from hyperpod_lab.goodput.measure import GoodputMeter
from hyperpod_lab.server.cursors import CursorStore
from hyperpod_lab.server.watch.notifier import DirNotifier
from hyperpod_lab.server.watch.tailer import (
    Message,
    Subscription,
    Tailer,
    TooManySubscribers,
    load_aggregate,
    new_aggregate,
    notable,
)
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobRecord

log = logging.getLogger("hyperpod_lab.server")

#: kinds whose fold never changes :func:`~hyperpod_lab.server.watch.tailer.notable` (the job
#: facts fold: a step or a saved checkpoint opens, ends, excludes or flags nothing)
_NOT_NOTABLE = frozenset((EventKind.STEP.value, EventKind.CHECKPOINT_SAVED.value))

#: most bytes one replay page reads, all event files together (see Watcher.page_file_bytes). Issue
#: 27: a page's events stay parsed while the socket drains (the page, and what its reader held back
#: of each file for the next one: rank 0's file, a step a line, cuts every page in time), and the
#: server's RSS grew with the page: a 2,048-rank job replayed in pages of 16 MiB (8 KiB a file,
#: ~90,000 events parsed at once) left it 105 MB higher, in pages of 2 MiB (1 KiB a file) 3 MB
#: (in-process, its tailer caught up; ``tests/server/test_replay_holds.py`` bounds what a page holds)
PAGE_TOTAL_BYTES = 2 << 20
#: the least a file's share of a replay page (a longer line is read whole all the same)
PAGE_FILE_MIN_BYTES = 512
#: most bytes one read of the server's folds parses, all event files together (a tailer's read, a
#: page of the dashboard's or goodput's catch-up; see Watcher.read_file_bytes). Issue 27: a
#: 2,048-rank job (44 MB) read at 1 MiB a file was one page of 246,365 parsed events (~250 MB at
#: once) and the server's RSS stayed ~210 MB higher after its fold
READ_TOTAL_BYTES = 4 << 20
#: the least a file's share of such a read (a longer line is read whole all the same)
READ_FILE_MIN_BYTES = 2048


def file_share(limit: int, files: int) -> int:
    """Bytes of each of ``files`` event files one bounded read of the server takes: ``limit``,
    less for many files so that all together hold at most about :data:`READ_TOTAL_BYTES`, never
    under :data:`READ_FILE_MIN_BYTES`; that least when no file is known yet (``files`` 0: that
    first read counts them)."""
    if files <= 0:
        return READ_FILE_MIN_BYTES
    return max(READ_FILE_MIN_BYTES, min(limit, READ_TOTAL_BYTES // files))


class Watcher:
    """Job state and events for the server. Construct once per server; ``start()`` on the IOLoop.

    Args:
        client: the core (store, schedulers).
        min_interval_s: status poll interval while jobs change or are watched (s).
        max_interval_s: status poll interval when nothing changes (s).
        stream_interval_s: event poll interval of watched jobs (s).
        idle_max_interval_s: longest event poll interval of unwatched running jobs (s).
        idle_batch: most unwatched jobs read per executor call; watched jobs (with a
            subscriber) are read first in their own call, so their latency does not grow with
            the number of tracked jobs.
        read_bytes: most bytes a tailer reads of one event file per call (less for a job of
            many files: at most :data:`READ_TOTAL_BYTES` a call, :meth:`read_file_bytes`).
        page_bytes: most bytes of one event file per page of a subscriber's replay (less for a job
            of many files: at most :data:`PAGE_TOTAL_BYTES` a page, :meth:`page_file_bytes`).
        window_events: newest events a watched job's tailer keeps in memory.
        send_queue_bytes: a subscriber whose transport holds this many bytes unsent gets no
            more until it drained to half (then it catches up from its cursor).
        stall_timeout_s: a subscriber over ``send_queue_bytes`` for this long is closed (s).
        max_subscribers: most subscribers of one job.
        cluster_workers: worker threads per cluster for its commands (status refreshes, submits);
            its event reads have their own (:meth:`run_on_reads`).
        goodput_cache_jobs: goodput meters of untracked jobs kept (with their cursors), newest used.
        notify: watch the event files of jobs on locally mounted shared storage (file-system
            notifications, see the module docstring).
        notify_fallback_s: the timed read of a watched job whose notifications are trusted (s).

    Attributes:
        notify_wakeups: tailer wake-ups by a notification; notify_misses: timed reads that found
            events no notification announced (the job then went back to timed reads).
    """

    def __init__(self, client: Client, min_interval_s: float = 1.0, max_interval_s: float = 10.0,
                 stream_interval_s: float = 0.25, idle_max_interval_s: float = 10.0, idle_batch: int = 8,
                 read_bytes: int = 1 << 20, page_bytes: int = 256 << 10, window_events: int = 1024,
                 send_queue_bytes: int = 1 << 20, stall_timeout_s: float = 30.0, max_subscribers: int = 64,
                 cluster_workers: int = 1, goodput_cache_jobs: int = 64, notify: bool = True,
                 notify_fallback_s: float = 2.0):
        self.client, self.store = client, client.store
        self.min_interval_s, self.max_interval_s = min_interval_s, max_interval_s
        self.stream_interval_s, self.idle_max_interval_s = stream_interval_s, idle_max_interval_s
        self.idle_batch = idle_batch
        self.read_bytes, self.page_bytes, self.window_events = read_bytes, page_bytes, window_events
        self.send_queue_bytes, self.stall_timeout_s = send_queue_bytes, stall_timeout_s
        self.max_subscribers, self.cluster_workers = max_subscribers, cluster_workers
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hyperpod-lab")  # store, no cluster
        self._executors: dict[str, ThreadPoolExecutor] = {}
        self._read_executors: dict[str, ThreadPoolExecutor] = {}  # event reads per lane (run_on_reads)
        self.closed_slow = 0  # subscribers closed for staying over send_queue_bytes (tests, benchmarks)
        self.tailers: dict[str, Tailer] = {}
        self.progress: dict[str, dict] = {}
        self.status_polls = 0  # batched refreshes done (tests and benchmarks read it)
        self._seen: dict[str, tuple] = {}  # job id -> (status, exit_code, reason) at the last tick
        self._tasks: list[asyncio.Task] = []
        self._wake_status = asyncio.Event()
        self._wake_events = asyncio.Event()
        self._stopped = False
        self.persist_interval_s = 1.0  # cursors and progress are saved at most this often (s)
        self._lanes: dict[tuple[str, str], asyncio.Task] = {}  # (cluster, lane) -> its read under way
        self.goodput_cache_jobs = goodput_cache_jobs
        # job id -> {"meter": GoodputMeter, "cursor": {file: offset}} of jobs with no tailer
        self._goodput: OrderedDict[str, dict] = OrderedDict()
        self._goodput_locks: dict[str, asyncio.Lock] = {}
        # job id -> {"agg": JobAggregate, "cursor": {file: offset}} of jobs with no tailer (dashboard)
        self._dashboards: OrderedDict[str, dict] = OrderedDict()
        self._dashboard_locks: dict[str, asyncio.Lock] = {}
        self.notify, self.notify_fallback_s = notify, notify_fallback_s
        self.notifier: DirNotifier | None = None
        self.notify_wakeups = 0
        self.notify_misses = 0
        # what watches the jobs beside the subscribers (server/metrics.py, server/alerts.py), called on
        # the IOLoop thread: on_status(recs, poll_s) after each status tick; before_fold(tailer) and
        # after_fold(tailer, before, located, first) around each batch of events read (after_fold
        # also once, with no events, when the tailer becomes complete)
        self.observers: list[Any] = []
        self._poll_s: dict[str, float] = {}  # seconds of each cluster's refresh in the current tick
        # cursors of bounded size: big ones are tokens kept beside the job store (server/cursors.py)
        root = getattr(self.store, "root", None)
        self.cursors = CursorStore(os.path.join(root, "cursors") if root else None)

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Load saved progress and start the two loops on the running event loop."""
        for job_id, (_, prog) in self.store.cursors().items():
            if prog is not None:
                self.progress[job_id] = prog
        for rec in self.store.list():
            if not rec.state.is_terminal():
                self._ensure_tailer(rec)
        loop = asyncio.get_event_loop()
        if self.notify:
            self.notifier = DirNotifier(loop, self._notified)
        self._tasks = [loop.create_task(self._status_loop()), loop.create_task(self._events_loop()),
                       loop.create_task(self._persist_loop())]

    async def stop(self) -> None:
        self._stopped = True
        for t in [*self._tasks, *self._lanes.values()]:
            t.cancel()
        await self._persist()
        if self.notifier is not None:
            self.notifier.stop()
        self.executor.shutdown(wait=False)
        for ex in [*self._executors.values(), *self._read_executors.values()]:
            ex.shutdown(wait=False)

    async def run(self, fn: Callable, *args, **kwargs):
        """Run a blocking call of no cluster (store, discovery) in the watcher's own worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    def executor_of(self, cluster: str) -> ThreadPoolExecutor:
        """The worker threads of one cluster (``cluster_workers``), made on first use."""
        ex = self._executors.get(cluster)
        if ex is None:
            name = "hyperpod-lab-" + re.sub(r"[^A-Za-z0-9_.-]", "_", cluster)[:40]
            ex = self._executors[cluster] = ThreadPoolExecutor(max_workers=self.cluster_workers,
                                                               thread_name_prefix=name)
        return ex

    async def run_on(self, cluster: str, fn: Callable, *args, **kwargs):
        """Run a blocking call on ``cluster``'s worker thread: a slow or big call there never
        delays another cluster's calls, the store's, or the IOLoop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor_of(cluster), lambda: fn(*args, **kwargs))

    async def run_on_reads(self, cluster: str, fn: Callable, *args, lane: str = "live", **kwargs):
        """Run a blocking read of ``cluster``'s event files on a worker of its own per ``lane``
        (``live``, ``backlog``, ``idle``, ``replay``), never on the cluster's command worker
        (:meth:`run_on`): a status refresh's ``squeue`` and ``sacct`` never delay a live job's
        events, and a live job's read never waits behind a page of a replay or a backlog. Files on
        this machine (local-mount mode, the local backend) need no connection; a remote read goes
        through the cluster's one SSH connection on its own channel (its reader program's requests
        are serialised by :class:`~hyperpod_lab.schedulers.remote.ssh.SSHRemote`, not by this
        thread). Issue 27: on the 16-node dev-cluster job the live poll queued behind status
        refreshes on the one worker."""
        key = f"{cluster}\0{lane}"
        ex = self._read_executors.get(key)
        if ex is None:
            name = "hyperpod-lab-reads-" + re.sub(r"[^A-Za-z0-9_.-]", "_", cluster)[:40] + "-" + lane
            ex = self._read_executors[key] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(ex, lambda: fn(*args, **kwargs))

    async def run_for_job(self, job_id: str, fn: Callable, *args, **kwargs):
        """:meth:`run_on` the cluster of job ``job_id``. Raises UnknownJob."""
        return await self.run_on(self.store.get(job_id).cluster, fn, *args, **kwargs)

    # ---- views -----------------------------------------------------------------------
    def view(self, rec: JobRecord) -> dict[str, Any]:
        """JobView: the record's fields plus ``progress`` (:class:`Progress`'s ``to_dict()``: step,
        total_steps, loss, steps_per_s, last_event, faults, recoveries, downtime_s (s),
        last_downtime_s (s or None), excluded_nodes, health, preflight_s and the other job
        facts)."""
        d = asdict(rec)
        t = self.tailers.get(rec.job_id)
        if t is not None:
            d["progress"] = t.progress.to_dict()
        else:
            # through the fold again: a summary saved by an older server gains the new keys
            d["progress"] = Progress(rec.spec, self.progress.get(rec.job_id)).to_dict()
        return d

    def jobs(self) -> list[dict[str, Any]]:
        """JobViews of every record, newest first (store + cache; no cluster call)."""
        recs = self.store.list()
        for r in recs:  # a job submitted elsewhere (CLI, kernel) gets tracked here too
            if r.job_id not in self.tailers and (not r.state.is_terminal() or r.job_id not in self.progress):
                self._ensure_tailer(r)
        return [self.view(r) for r in recs]

    def track(self, rec: JobRecord) -> None:
        """A job was just submitted through this server: watch it at once."""
        self._ensure_tailer(rec)
        self._wake_status.set()
        self._wake_events.set()

    def _ensure_tailer(self, rec: JobRecord, full_history: bool = False) -> Tailer:
        t = self.tailers.get(rec.job_id)
        if t is None:
            saved = None if full_history else self.store.get_cursor(rec.job_id)
            t = Tailer(rec, *(saved or (None, None)), window=self.window_events)
            self.tailers[rec.job_id] = t
            self._wake_events.set()
        return t

    # ---- goodput ---------------------------------------------------------------------
    async def goodput(self, job_id: str, first_read_timeout_s: float = 10.0) -> dict:
        """Job ``job_id``'s goodput measurement (:meth:`GoodputMeter.result`, the dict of
        ``hyperpod_lab.goodput.measure_from_events``) as far as its events were read.

        A tracked job answers from its tailer's meter (no read; after the tailer's first read,
        waited for up to ``first_read_timeout_s``). Any other job's meter is kept here with its
        cursor (made from the store's saved state when there is one, else from the start) and
        first brought up to date, one page of ``read_bytes`` per file per call on the job's
        cluster worker, so a request reads only what was written since the last one.

        Raises:
            UnknownJob: no such job.
            GoodputInputError: nothing to measure yet (no events, or no step events).
        """
        rec = self.store.get(job_id)
        t = self.tailers.get(job_id)
        if t is not None and t.meter is not None:
            deadline = time.monotonic() + first_read_timeout_s
            while not t.polled and not t.meter.events and time.monotonic() < deadline:
                t.next_poll = 0.0
                self._wake_events.set()
                await asyncio.sleep(0.05)
            return t.meter.result()
        # one request at a time feeds a job's meter (two would feed the same events twice)
        async with self._goodput_locks.setdefault(job_id, asyncio.Lock()):
            entry = self._goodput.get(job_id)
            if entry is None:
                saved = await self.run(self.store.get_cursor, job_id)
                entry = self._saved_goodput(rec, saved)
            self._cache_goodput(job_id, entry)
            while await self.run_on(rec.cluster, self._goodput_page, rec, entry):
                pass
            return entry["meter"].result()

    @staticmethod
    def _saved_goodput(rec: JobRecord, saved) -> dict:
        """A goodput cache entry from the store's ``(cursor, progress)`` when it holds a meter,
        else a fresh one that reads from the start."""
        cursor, prog = saved if saved is not None else ({}, None)
        if cursor and prog and "incidents" in prog and prog.get("goodput") is not None:
            return {"meter": GoodputMeter(prog["goodput"], Progress(rec.spec, prog)), "cursor": dict(cursor)}
        return {"meter": GoodputMeter(None, Progress(rec.spec)), "cursor": {}}

    def _cache_goodput(self, job_id: str, entry: dict) -> None:
        self._cache_entry(self._goodput, self._goodput_locks, job_id, entry)

    def _cache_entry(self, cache: OrderedDict, locks: dict[str, asyncio.Lock], job_id: str, entry: dict) -> None:
        """Keep ``entry`` as ``job_id``'s in ``cache`` (the goodput's or the dashboard's cache of
        jobs with no tailer), the newest, dropping the oldest beyond ``goodput_cache_jobs`` and
        their unheld locks."""
        cache[job_id] = entry
        cache.move_to_end(job_id)
        while len(cache) > self.goodput_cache_jobs:
            gone, _ = cache.popitem(last=False)
            lock = locks.get(gone)
            if lock is not None and not lock.locked():
                del locks[gone]

    def _goodput_page(self, rec: JobRecord, entry: dict) -> bool:
        """Feed ``entry``'s meter one page of the events after its cursor (worker thread); the
        entry stays consistent page by page. Returns whether more is waiting."""
        return self._fold_page(rec, entry, entry["meter"].update)

    def _fold_page(self, rec: JobRecord, entry: dict, fold: Callable[[Event], Any]) -> bool:
        """``fold`` each event of one page after ``entry``'s cursor, advancing the cursor event by
        event (worker thread; ``entry`` keeps its reader for the next page). Returns whether more
        is waiting."""
        reader = entry["reader"] = self._reader(rec, entry["cursor"], entry.get("reader"))
        for ev, fname, end in reader.poll_located(max_bytes=self.read_file_bytes(rec.job_id, entry["cursor"])):
            fold(ev)
            entry["cursor"][fname] = end
        entry["cursor"] = dict(reader.cursor)
        return bool(reader.more)

    def _reader(self, rec: JobRecord, cursor: dict[str, int], reader: EventReader | None) -> EventReader:
        """``reader`` when it stands at ``cursor`` (it then keeps the parsed events its last page
        held back: a long job's catch-up reads and parses each line once), else a new reader of
        ``rec``'s events from ``cursor`` (also when the kept reader's connection died: the client
        then connects again)."""
        if reader is not None and reader.cursor == cursor and getattr(reader.files, "alive", True) is not False:
            reader.skipped.clear()  # nobody here reads them: a reader kept for long keeps none
            return reader
        return self.client.event_reader(rec.job_id, cursor)

    # ---- dashboard -------------------------------------------------------------------
    async def dashboard(self, job_id: str, points: int = 1000, first_read_timeout_s: float = 1.0,
                        read_budget_s: float = 2.0, node: str | None = None) -> dict:
        """Job ``job_id``'s dashboard: :meth:`JobAggregate.summary` (``t0``, ``t1`` in s since the
        epoch, ``steps``, ``ranks``, ``events``, ``lanes``, ``timeline``, ``series`` downsampled
        to at most ``points`` points; lanes per node, ``node``'s ranks' lanes in ``expanded``) as
        far as its events were read, plus ``partial``: True
        while events are known to be waiting unread (ask again: each request folds more).

        A tracked job answers from its tailer's aggregate (no read; after the tailer's first
        read, waited for up to ``first_read_timeout_s``). Any other job's aggregate, or a tracked
        job's whose tailer is still reading its backlog, is kept here with its cursor (from the
        store's saved state when it holds one, else from the start) and brought up to date one
        page of ``read_bytes`` per file per call on the job's cluster worker, for at most
        ``read_budget_s`` per request, so the next request reads only the new bytes.

        Raises:
            UnknownJob: no such job.
        """
        rec = self.store.get(job_id)
        t = self.tailers.get(job_id)
        if t is not None and t.agg is not None:
            entry = self._dashboards.get(job_id)
            # a tailer re-reading a backlog this cache already folded further: answer from the
            # cache at once (no wait for the tailer)
            cached_ahead = lambda: (entry is not None and (not t.polled or t.more)  # noqa: E731
                                    and entry["agg"].events > t.agg.events)
            if not cached_ahead():
                deadline = time.monotonic() + first_read_timeout_s
                while (not t.polled or t.more) and time.monotonic() < deadline:
                    t.next_poll = 0.0
                    self._wake_events.set()
                    await asyncio.sleep(0.05)
                if not cached_ahead():
                    return {**t.agg.summary(points, node), "partial": not t.polled or t.more}
        async with self._dashboard_locks.setdefault(job_id, asyncio.Lock()):
            entry = self._dashboards.get(job_id)
            if entry is None:
                saved = await self.run(self.store.get_cursor, job_id)
                cursor, prog = saved if saved is not None else ({}, None)
                agg = load_aggregate((prog or {}).get("aggregate")) if cursor else None
                entry = {"agg": agg, "cursor": dict(cursor)} if agg is not None else {"agg": new_aggregate(), "cursor": {}}
            self._cache_dashboard(job_id, entry)
            deadline = time.monotonic() + read_budget_s
            more = True
            while more and time.monotonic() < deadline:
                more = await self.run_on(rec.cluster, self._dashboard_page, rec, entry)
            return {**entry["agg"].summary(points, node), "partial": more}

    def _cache_dashboard(self, job_id: str, entry: dict) -> None:
        self._cache_entry(self._dashboards, self._dashboard_locks, job_id, entry)

    def _dashboard_page(self, rec: JobRecord, entry: dict) -> bool:
        """Fold one page of the events after ``entry``'s cursor into its aggregate (worker
        thread). Returns whether more is waiting."""
        return self._fold_page(rec, entry, entry["agg"].fold)

    # ---- subscriptions ---------------------------------------------------------------
    def subscribers(self, job_id: str) -> int:
        """Subscribers of job ``job_id`` now."""
        t = self.tailers.get(job_id)
        return len(t.subs) if t is not None else 0

    async def subscribe(self, job_id: str, cursor: dict[str, int], send: Callable[[Message], bool],
                        pending: Callable[[], int] | None = None,
                        close: Callable[[str], None] | None = None) -> Subscription:
        """Send the job's events after ``cursor`` (history first, replayed from the files in
        pages), then live ones, status changes and ``end``, through ``send``.

        Args:
            pending, close: the transport's send queue and close (see :class:`Subscription`).

        Raises:
            UnknownJob: no such job.
            TooManySubscribers: the job has ``max_subscribers`` already.
        """
        rec = self.store.get(job_id)
        t = self._ensure_tailer(rec)
        if len(t.subs) >= self.max_subscribers:
            raise TooManySubscribers(f"job {job_id} has {len(t.subs)} subscribers, the most this server takes "
                                     f"(max_subscribers); close a tab or reconnect later")
        sub = Subscription(job_id, cursor, send, pending, close, chain=self.cursors.chain(job_id))
        if sub.send({"type": "status", "job": self.view(rec)}) is False:
            return sub
        t.subs.append(sub)
        t.next_poll = 0.0
        sub.task = asyncio.get_running_loop().create_task(self._catch_up(t, sub, rec))
        self._wake_events.set()
        self._wake_status.set()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        sub.gone = True
        if sub.chain is not None:
            sub.chain.flush()
        t = self.tailers.get(sub.job_id)
        if t is not None and sub in t.subs:
            t.subs.remove(sub)
        task = sub.task
        if task is not None and not task.done():
            try:
                current = asyncio.current_task()
            except RuntimeError:
                current = None
            if task is not current:
                task.cancel()

    def _final_status(self, t: Tailer) -> dict | None:
        """``{"type": "status", "job": JobView}`` of ``t``'s job as stored now, or None if gone."""
        try:
            return {"type": "status", "job": self.view(self.store.get(t.job_id))}
        except HyperPodLabError:
            return None

    def _end(self, t: Tailer, sub: Subscription, final: dict | None = None) -> None:
        """Send ``sub`` the job's terminal status (``final``, else read now), then ``end``. The
        status goes first because the events side may see the terminal record (stored by a
        status refresh still running in a worker thread) before the status loop has sent it:
        without it a tab's last status could say ``running`` after ``end``."""
        if not sub.ended:
            sub.ended = True
            final = final or self._final_status(t)
            if final is None or sub.send(final) is not False:  # a closed transport gets nothing more
                sub.send({"type": "end"})
        if sub in t.subs:
            t.subs.remove(sub)

    def _fall_behind(self, t: Tailer, sub: Subscription) -> None:
        """``sub``'s transport is over ``send_queue_bytes``: send it nothing more until it drained,
        then let it catch up from its cursor (nothing lost, nothing held here meanwhile)."""
        sub.live = False
        if sub.task is None or sub.task.done():
            rec = None
            try:
                rec = self.store.get(sub.job_id)
            except HyperPodLabError:
                self.unsubscribe(sub)
                return
            sub.task = asyncio.get_running_loop().create_task(self._catch_up(t, sub, rec))

    def page_file_bytes(self, job_id: str, cursor: dict[str, int]) -> int:
        """Bytes of each event file a replay page reads: ``page_bytes``, less for a job of many
        files so that a page holds at most about ``PAGE_TOTAL_BYTES`` whatever the rank count
        (at least ``PAGE_FILE_MIN_BYTES`` a file; the files counted from the tailer's cursor or
        ``cursor``)."""
        t = self.tailers.get(job_id)
        files = max(len(cursor), len(t.cursor) if t is not None else 0, 1)
        return max(PAGE_FILE_MIN_BYTES, min(self.page_bytes, PAGE_TOTAL_BYTES // files))

    def read_file_bytes(self, job_id: str, cursor: dict[str, int], limit: int | None = None) -> int:
        """Bytes of each event file one read of the server's folds parses (a tailer's read, a
        dashboard or goodput catch-up page): ``limit`` (default ``read_bytes``), less for a job of
        many files so that a read holds at most about ``READ_TOTAL_BYTES`` of events whatever the
        rank count (at least ``READ_FILE_MIN_BYTES`` a file; the files counted from the tailer's
        cursor or ``cursor``; a job none of whose files is known yet reads that least first, its
        first read then counts them)."""
        t = self.tailers.get(job_id)
        files = max(len(cursor), len(t.cursor) if t is not None else 0)
        return file_share(self.read_bytes if limit is None else limit, files)

    def _read_page(self, rec: JobRecord, cursor: dict[str, int], sub: Subscription | None = None
                   ) -> tuple[list, dict[str, int]]:
        """One page of a job's events after ``cursor`` (``page_bytes`` per file); worker thread.
        ``sub``: the subscriber replaying, whose reader is kept for its next page."""
        reader = self._reader(rec, cursor, sub.reader if sub is not None else None)
        located = reader.poll_located(max_bytes=self.page_file_bytes(rec.job_id, cursor))
        if sub is not None:
            sub.reader = reader
        return located, dict(reader.cursor)

    async def _catch_up(self, t: Tailer, sub: Subscription, rec: JobRecord) -> None:
        """Bring ``sub`` from its cursor up to the tailer's window, page by page, waiting for its
        transport to drain between pages; then make it live (and end it if the job is done)."""
        cap = self.send_queue_bytes
        over_since: float | None = None
        last_pending: int | None = None
        try:
            while not sub.gone:
                pending = sub.pending() if sub.pending is not None else 0
                if pending > cap // 2:  # backpressure: wait to drain
                    now = time.monotonic()
                    if over_since is None or (last_pending is not None and pending < last_pending):
                        over_since = now  # (still) draining: the stall clock starts again
                    last_pending = pending
                    # a consumer that drains nothing for stall_timeout_s is closed, whether its
                    # queue stopped above the cap or between half of it and the cap
                    if now - over_since > self.stall_timeout_s:
                        self._close_slow(t, sub, pending)
                        return
                    await asyncio.sleep(min(0.05, self.stall_timeout_s / 4))
                    continue
                over_since = last_pending = None
                if t.covers(sub.cursor):
                    # the window holds what a cut page left, and what the replay's reader parsed
                    # and held back: neither is kept for the socket's lifetime
                    sub.leftover = sub.reader = None
                    for ev, fname, end in list(t.items):
                        if sub.over(cap):
                            break
                        if sub.deliver(ev, fname, end) is False:
                            self.unsubscribe(sub)
                            return
                    else:
                        sub.live = True
                        if t.complete:
                            self._end(t, sub)
                        return
                    continue
                if sub.leftover is not None:  # the rest of a page cut by backpressure: not read again
                    located, cursor = sub.leftover
                    sub.leftover = None
                else:
                    try:
                        located, cursor = await self.run_on_reads(rec.cluster, self._read_page, rec,
                                                                  dict(sub.cursor), sub, lane="replay")
                    except (HyperPodLabError, OSError, EOFError) as e:
                        log.warning("hyperpod_lab: history of %s not read: %s", rec.job_id, e)
                        await asyncio.sleep(1.0)
                        continue
                if sub.gone:
                    return
                for i, (ev, fname, end) in enumerate(located):
                    if sub.over(cap):
                        sub.leftover = (located[i:], cursor)
                        break
                    if sub.deliver(ev, fname, end) is False:
                        self.unsubscribe(sub)
                        return
                else:  # the whole page went out: also pass what it skipped (malformed lines)
                    stuck = not located and all(cursor.get(f, 0) <= sub.cursor.get(f, 0) for f in cursor)
                    before = dict(sub.cursor)
                    for f, off in cursor.items():
                        sub.cursor[f] = max(sub.cursor.get(f, 0), off)
                    if stuck:  # nothing more on disk before the window (files gone): go live
                        sub.cursor.update({f: max(sub.cursor.get(f, 0), off) for f, off in t.base.items()})
                    if sub.cursor != before and sub.chain is not None:
                        sub.chain.reset()  # moved other than event by event: the next token is a new root
                await asyncio.sleep(0)  # let the IOLoop run between pages
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("hyperpod_lab: subscriber of %s failed", sub.job_id)
            self.unsubscribe(sub)

    def _close_slow(self, t: Tailer, sub: Subscription, pending: int) -> None:
        self.closed_slow += 1
        reason = (f"slow consumer: {pending} bytes unsent for over {self.stall_timeout_s:g} s "
                  f"(cap {self.send_queue_bytes}); reconnect with your last cursor")
        log.warning("hyperpod_lab: closing a subscriber of %s: %s", sub.job_id, reason)
        self.unsubscribe(sub)
        if sub.close is not None:
            sub.close(reason)

    # ---- status loop -----------------------------------------------------------------
    def _refresh_cluster(self, cluster: str, group: list[JobRecord]) -> bool:
        """One batched refresh of ``cluster``'s jobs (on its worker thread). Returns False on error."""
        started = time.monotonic()
        try:
            self.client.refresh(group)
            self._poll_s[cluster] = time.monotonic() - started
            return True
        except (HyperPodLabError, OSError, EOFError) as e:
            log.warning("hyperpod_lab: status of %d job(s) on %s not refreshed: %s", len(group), cluster, e)
            return False

    async def _refresh(self) -> tuple[list[JobRecord], list[JobRecord], bool]:
        """One batched refresh per cluster, each on its own worker thread, all at once.
        Returns (changed records, all records, any error)."""
        recs = await self.run(self.store.list)
        active = [r for r in recs if not r.state.is_terminal()]
        # the state last seen here, else as read now (a change made by another process, e.g. the
        # CLI, between two ticks counts as a change too)
        before = {r.job_id: self._seen.get(r.job_id, (r.status, r.exit_code, r.reason)) for r in recs}
        by_cluster: dict[str, list[JobRecord]] = {}
        for r in active:
            by_cluster.setdefault(r.cluster, []).append(r)
        self._poll_s = {}
        oks = await asyncio.gather(*(self.run_on(c, self._refresh_cluster, c, g) for c, g in by_cluster.items()))
        changed = [r for r in recs if (r.status, r.exit_code, r.reason) != before[r.job_id]]
        self._seen = {r.job_id: (r.status, r.exit_code, r.reason) for r in recs}
        return changed, recs, not all(oks)

    async def _status_loop(self) -> None:
        delay = self.min_interval_s
        while not self._stopped:
            try:
                changed, recs, error = await self._refresh()
                self.status_polls += 1
            except Exception:  # never let the loop die
                log.exception("hyperpod_lab: status refresh failed")
                changed, recs, error = [], [], True
            if recs:
                self._observe("on_status", recs, dict(self._poll_s))
            now = time.monotonic()
            for rec in changed:
                t = self.tailers.get(rec.job_id) or self._ensure_tailer(rec)
                if rec.state.is_terminal() and t.terminal_seen_at is None:
                    t.terminal_seen_at = now
                    t.next_poll = 0.0
                for sub in list(t.subs):
                    if sub.send({"type": "status", "job": self.view(rec)}) is False:
                        self.unsubscribe(sub)
            for rec in recs:  # terminal jobs with a tailer: let it finish reading
                t = self.tailers.get(rec.job_id)
                if t is not None and rec.state.is_terminal() and t.terminal_seen_at is None:
                    t.terminal_seen_at = now
            if changed:
                self._wake_events.set()
            watched = any(t.subs for t in self.tailers.values())
            active = any(not r.state.is_terminal() for r in recs)
            if error:
                delay = min(max(delay, self.min_interval_s) * 2, self.max_interval_s)
            elif changed or (watched and active):
                delay = self.min_interval_s
            else:
                delay = min(delay * 2, self.max_interval_s)
            self._wake_status.clear()
            try:
                await asyncio.wait_for(self._wake_status.wait(), timeout=delay)
                delay = self.min_interval_s
            except asyncio.TimeoutError:
                pass

    # ---- events loop -----------------------------------------------------------------
    def _notified(self, job_id: str) -> None:
        """A notification for ``job_id``'s event files (IOLoop thread): read it now (watched) or
        within ``min_interval_s`` (unwatched)."""
        t = self.tailers.get(job_id)
        if t is None or t.complete:
            return
        self.notify_wakeups += 1
        t.notify_seq += 1
        now = time.monotonic()
        t.next_poll = min(t.next_poll, now if t.subs else now + self.min_interval_s)
        self._wake_events.set()

    def _notifications(self, polls, results) -> None:
        """After a batch of reads (IOLoop thread): judge the notifications of the jobs read
        (events found that none announced: back to timed reads), and watch the event
        directories of newly read jobs whose files are on this machine."""
        for res in results:
            t, located, error = res[0], res[3], res[5]
            if error is not None or not t.watched_fs:
                continue
            if t.notify_armed and t.notify_ok and located and t.read_seq == t.last_read_seq:
                t.notify_ok = False
                self.notify_misses += 1
                log.info("hyperpod_lab: a timed read of %s found events no notification announced (a network "
                         "file system's other hosts write them): read every %g s", t.job_id, self.stream_interval_s)
            t.notify_armed = True
        if self.notifier is None:
            return
        for t, _, _ in polls:
            if not t.watched_fs and t.local_events and not t.complete:
                t.watched_fs = self.notifier.watch(t.job_id, t.local_events)
                if not t.watched_fs:
                    t.local_events = ""  # not again

    def _poll_blocking(self, polls: list[tuple[Tailer, JobRecord, dict[str, int]]]):
        out = []
        for t, rec, cursor in polls:
            try:
                # the tailer's reader when it stands at the cursor (a backlog read in pages);
                # none kept after a failed read
                reader, t.reader = t.reader, None
                reader = self._reader(rec, cursor, reader)
                if t.local_events is None:
                    local_path = getattr(reader.files, "local_path", None)
                    t.local_events = (local_path(reader.dir) if local_path is not None else None) or ""
                # a job catching up on a backlog reads in smaller pages, so the live jobs polled
                # in the same round are not held up behind a large parse
                located = reader.poll_located(max_bytes=self.read_file_bytes(
                    rec.job_id, cursor, self.page_bytes if t.more else self.read_bytes))
                t.reader = reader
                out.append((t, t.generation, cursor, located, dict(reader.cursor), None, reader.more))
            except (HyperPodLabError, OSError, EOFError) as e:
                out.append((t, t.generation, cursor, [], cursor, e, False))
        return out

    def _apply(self, t: Tailer, generation: int, read_from: dict[str, int], located, cursor, error, more,
               started_at: float) -> None:
        if generation != t.generation or read_from != t.cursor:
            return  # reset, or another read was applied, while this one ran: its result is stale
        if error is not None:
            log.warning("hyperpod_lab: events of %s not read: %s", t.job_id, error)
            t.idle_interval = min(t.idle_interval * 2, self.idle_max_interval_s)
            return
        first, t.polled = not t.polled, True
        t.history = not t.caught_up  # this read is part of the job's history (observers: not live)
        t.caught_up = t.caught_up or not more
        t.more = more
        cap = self.send_queue_bytes
        was_complete = t.complete
        before = [(o, self._observe("before_fold", t, observer=o)) for o in self.observers]
        for ev, fname, end in located:
            if t.subs:
                t.keep((ev, fname, end))
            # a step or a checkpoint.saved never changes what notable() counts (the bulk of a job)
            counts = None if ev.kind in _NOT_NOTABLE or not t.subs else notable(t.progress)
            t.fold(ev)
            t.finished_seen |= ev.kind == EventKind.FINISHED.value
            for sub in list(t.subs):
                if not sub.live:
                    continue  # replaying: it reads this event from the files
                if sub.over(cap):
                    self._fall_behind(t, sub)
                elif sub.deliver(ev, fname, end) is False:
                    self.unsubscribe(sub)
            if counts is not None and t.subs and notable(t.progress) != counts:
                # a fault opened or recovered (the sidebar notifies from it), a node was excluded
                # or failed its health checks (the sidebar lists them)
                self._send_status(t)
        if located or cursor != t.cursor:
            t.dirty = True
        t.cursor = dict(cursor)
        if not t.subs:  # nobody watches: keep no events (a new subscriber replays from the files)
            t.items.clear()
            t.base = dict(t.cursor)
        t.idle_interval = 1.0 if located else min(t.idle_interval * 2, self.idle_max_interval_s)
        # complete: the job is terminal, a read that began after that found nothing new, and
        # either 'finished' was read or the terminal state is old enough for any late writer
        if (t.terminal_seen_at is not None and started_at >= t.terminal_seen_at and not located and not more
                and (t.finished_seen or started_at >= t.terminal_seen_at + 3.0)):
            t.complete = True
            live = [sub for sub in t.subs if sub.live]  # a replaying subscriber gets 'end' once it caught up
            final = self._final_status(t) if live else None  # one read and view for all tabs
            for sub in live:
                self._end(t, sub, final)
        if located or t.complete != was_complete:  # new events, or the last read of a job that ended
            for o, snap in before:
                self._observe("after_fold", t, snap, located, first, observer=o)

    def _observe(self, hook: str, *args, observer: Any = None):
        """Call ``hook(*args)`` of one observer (``observer``) or of each; an observer's error is
        logged, never the watcher's. Returns the one observer's answer (None on error)."""
        for o in ([observer] if observer is not None else list(self.observers)):
            try:
                out = getattr(o, hook)(*args)
            except Exception:
                log.exception("hyperpod_lab: %s.%s failed", type(o).__name__, hook)
                out = None
            if observer is not None:
                return out
        return None

    def _send_status(self, t: Tailer) -> None:
        """Send ``{"type": "status", "job": JobView}`` to every subscriber of ``t``'s job."""
        try:
            rec = self.store.get(t.job_id)
        except HyperPodLabError:
            return
        msg = {"type": "status", "job": self.view(rec)}
        for sub in list(t.subs):
            if sub.send(msg) is False:
                self.unsubscribe(sub)

    async def _poll_batch(self, polls: list[tuple[Tailer, JobRecord, dict[str, int]]], lane: str = "live") -> None:
        started = time.monotonic()
        for t, _, _ in polls:
            t.last_read_seq, t.read_seq = t.read_seq, t.notify_seq
        try:  # beside the cluster's commands, not behind them
            results = await self.run_on_reads(polls[0][1].cluster, self._poll_blocking, polls, lane=lane)
        except Exception:
            log.exception("hyperpod_lab: event poll failed")
            results = []
        for res in results:
            self._apply(*res, started_at=started)
        self._notifications(polls, results)
        done = time.monotonic()
        for t, _, _ in polls:
            interval = self.stream_interval_s if t.subs else t.idle_interval
            if t.watched_fs and t.notify_ok:  # notifications wake it: the timed read is a fallback
                interval = max(interval, self.notify_fallback_s)
            # more than read_bytes waiting, or a notification came during the read: read on at
            # once (the IOLoop ran in between)
            t.next_poll = done if t.more or t.notify_seq != t.read_seq else done + interval
            if t.more and lane == "backlog":  # a catch-up takes at most half the IOLoop: replays and
                t.next_poll = done + (done - started)  # live reads get the rest (issue 27)

    async def _persist(self) -> None:
        dirty = [(t.job_id, dict(t.cursor), t.saved()) for t in self.tailers.values() if t.dirty]
        for t in self.tailers.values():
            t.dirty = False
        for job_id, _, prog in dirty:
            self.progress[job_id] = prog
        if dirty:
            await self.run(self.store.put_cursors, dirty)

    async def _lane(self, key: tuple[str, str], polls: list[tuple[Tailer, JobRecord, dict[str, int]]]) -> None:
        """One lane's read (``key``: cluster, lane), then its jobs are free to be due again."""
        try:
            await self._poll_batch(polls, key[1])
        finally:
            for t, _, _ in polls:
                t.inflight = False
            self._lanes.pop(key, None)
            self._wake_events.set()

    async def _persist_loop(self) -> None:
        """Save the cursors and progress of changed jobs every ``persist_interval_s`` (its own
        task: a slow save never delays a read)."""
        while not self._stopped:
            await asyncio.sleep(self.persist_interval_s)
            try:
                await self._persist()
            except Exception:
                log.exception("hyperpod_lab: saving event cursors failed")

    async def _events_loop(self) -> None:
        while not self._stopped:
            now = time.monotonic()
            due = []
            for t in list(self.tailers.values()):
                if t.complete:
                    if not t.subs:  # done and nobody watches: keep the summary, drop the history
                        self.progress[t.job_id] = t.saved()
                        if not t.dirty:
                            del self.tailers[t.job_id]
                            if self.notifier is not None:
                                self.notifier.unwatch(t.job_id)
                            if t.meter is not None:  # goodput goes on from here, never from the start
                                self._cache_goodput(t.job_id, {"meter": t.meter, "cursor": dict(t.cursor)})
                            if t.agg is not None:  # and so does the dashboard
                                self._cache_dashboard(t.job_id, {"agg": t.agg, "cursor": dict(t.cursor)})
                    continue
                if now >= t.next_poll and not t.inflight:
                    due.append(t)
            # per cluster, on its own worker (all clusters at once): watched jobs first, in their
            # own executor call; then at most idle_batch idle jobs (the most overdue first), so a
            # streamed job never waits behind every idle job's read: the rest stay due and go in
            # the next iterations (their records are not even read now)
            by_cluster: dict[str, list[Tailer]] = {}
            for t in due:
                by_cluster.setdefault(t.cluster, []).append(t)
            for cluster, group in by_cluster.items():
                idle = sorted((t for t in group if not t.subs), key=lambda t: t.next_poll)[:self.idle_batch]
                watched = [t for t in group if t.subs]
                # three lanes, each its own task: live watched jobs, backlogs (a replay, a first read
                # of a long job) and idle jobs; a lane whose read is under way keeps its due jobs
                # for the next round, and no lane waits for another (nor for the saving of cursors)
                for lane, part in (("live", [t for t in watched if not t.more]),
                                   ("backlog", [t for t in watched if t.more]), ("idle", idle)):
                    if (cluster, lane) in self._lanes:
                        continue
                    polls = []
                    for t in part:
                        try:
                            rec = self.store.get(t.job_id)
                        except HyperPodLabError:
                            self.tailers.pop(t.job_id, None)
                            if self.notifier is not None:
                                self.notifier.unwatch(t.job_id)
                            continue
                        if rec.state.is_terminal() and t.terminal_seen_at is None:
                            t.terminal_seen_at = now
                        polls.append((t, rec, dict(t.cursor)))
                    if polls:
                        for t, _, _ in polls:
                            t.inflight = True
                        self._lanes[(cluster, lane)] = asyncio.get_running_loop().create_task(
                            self._lane((cluster, lane), polls))
            waits = [t.next_poll for t in self.tailers.values() if not t.complete and not t.inflight]
            timeout = max(0.02, min(waits) - time.monotonic()) if waits else self.idle_max_interval_s
            self._wake_events.clear()
            try:
                await asyncio.wait_for(self._wake_events.wait(), timeout=timeout)
            except asyncio.TimeoutError:
                pass
