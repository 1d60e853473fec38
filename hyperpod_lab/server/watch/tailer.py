"""One job's tail in the server: its :class:`Tailer` (the one reader of its event files, the
goodput meter and dashboard aggregate folded beside it, the backlog new subscribers replay), the
:class:`Subscription` of each WebSocket, and what makes a progress change worth a message."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable

from hyperpod_lab.errors import HyperPodLabError
from hyperpod_lab.events import Event, EventReader, encode_cursor
from hyperpod_lab.fold.aggregate import JobAggregate
from hyperpod_lab.fold.progress import Progress
from hyperpod_lab.fold.progress import event_dict as _event_dict
from hyperpod_lab.goodput.measure import GoodputMeter
from hyperpod_lab.server.cursors import CursorChain
from hyperpod_lab.submit.jobs import JobRecord

Message = dict[str, Any]
"""A WebSocket message: one JSON object (``docs/openapi.yaml``, the stream)."""


def notable(p: Progress) -> tuple:
    """What a ``status`` message is sent on when it changes: faults, recoveries, excluded nodes,
    nodes that failed a pre-flight health check (a count per run, so cheap per event) and the
    ranks flagged as stragglers now."""
    return (p.faults, p.recoveries, len(p.excluded_nodes), sum(r.get("failed", 0) for r in p.preflight_runs),
            tuple(sorted(x.get("rank", -1) for x in p.stragglers)))


# ---- tailers and subscribers -------------------------------------------------------------
class TooManySubscribers(HyperPodLabError):
    """A job already has the most subscribers a server takes (``Watcher.max_subscribers``)."""


class Subscription:
    """One subscriber (a WebSocket) of one job: its own cursor and a ``send(message)`` callback
    called on the IOLoop thread. ``send`` returning False (socket gone) unsubscribes it.

    Args:
        pending: bytes sent but not yet written out by the transport (its send queue), or None
            for a transport without one (then nothing is held back).
        close: closes the transport with a reason (a subscriber stalled over the cap).

        chain: makes the ``cursor`` of each event message (bounded tokens for big cursors,
            :class:`~hyperpod_lab.server.cursors.CursorChain`); None: the old form.

    Attributes:
        live: True once the history is sent: events then come from the tailer as read; False
            while the subscriber replays (or catches up after falling behind) from its cursor.
    """

    def __init__(self, job_id: str, cursor: dict[str, int], send: Callable[[Message], bool],
                 pending: Callable[[], int] | None = None, close: Callable[[str], None] | None = None,
                 chain: CursorChain | None = None):
        self.job_id, self.cursor, self.send = job_id, dict(cursor), send
        self.chain = chain  # the tokens of its cursors (None: always the old form)
        self.leftover: tuple[list, dict[str, int]] | None = None  # a replay page's undelivered rest
        self.pending, self.close = pending, close
        self.ended = False
        self.live = False
        self.gone = False
        self.task: asyncio.Task | None = None
        self.reader: EventReader | None = None  # its replay's reader (Watcher._read_page)

    def over(self, cap: int) -> bool:
        """Whether the transport holds ``cap`` bytes or more not yet written out."""
        return self.pending is not None and self.pending() >= cap

    def deliver(self, ev: Event, fname: str, end: int) -> bool:
        if end <= self.cursor.get(fname, 0):
            return True  # already seen by this subscriber
        self.cursor[fname] = end
        token = self.chain.advance(self.cursor, fname, end) if self.chain is not None else encode_cursor(self.cursor)
        return self.send({"type": "event", "event": _event_dict(ev), "cursor": token})


class Tailer:
    """Reads one job's events for all its subscribers.

    ``items`` holds the events read since ``base`` (a cursor): at most ``window`` of the newest,
    and none while nobody subscribes (``base`` then follows ``cursor``). A subscriber whose
    cursor is behind ``base`` replays from the files up to it (:meth:`Watcher._catch_up`).
    """

    def __init__(self, rec: JobRecord, base: dict[str, int] | None = None, progress: dict | None = None,
                 window: int = 1024):
        self.job_id, self.cluster = rec.job_id, rec.cluster
        if progress is not None and "incidents" not in progress:
            base, progress = None, None  # saved before the job facts fold: read every event again
        self.base = dict(base or {})
        self.cursor = dict(self.base)
        self.window = window
        self.items: deque[tuple[Event, str, int]] = deque()
        self.more = False               # the last read stopped at read_bytes: read again at once
        self.reader: EventReader | None = None  # kept from read to read (Watcher._reader)
        self.progress = Progress(rec.spec, progress if base else None)
        # the goodput measurement over the same facts (it folds each event into them); a summary
        # saved before the meter existed resumes without one (goodput then reads on its own)
        saved_meter = (progress or {}).get("goodput") if self.base else None
        self.meter: GoodputMeter | None = (GoodputMeter(saved_meter, self.progress)
                                           if saved_meter is not None or not self.base else None)
        # the dashboard's aggregate (hyperpod_lab.fold.aggregate), saved like the meter
        saved_agg = (progress or {}).get("aggregate") if self.base else None
        self.agg: JobAggregate | None = load_aggregate(saved_agg) if self.base else new_aggregate()
        self.subs: list[Subscription] = []
        self.generation = 0
        self.complete = False           # job terminal and every event read
        self.terminal_seen_at: float | None = None
        self.next_poll = 0.0
        self.caught_up = False          # a read found no more to read (the history is behind it)
        self.history = True             # the read being applied was part of the history
        self.inflight = False           # in a lane's read under way (Watcher._lane)
        self.idle_interval = 1.0
        self.dirty = False              # cursor/progress not yet saved
        self.polled = False             # read at least once since created or reset
        self.finished_seen = False      # a 'finished' event was read
        # notifications (local-mount mode): see DirNotifier and Watcher._poll_batch
        self.local_events: str | None = None  # its events directory here ("" : none / no watch)
        self.watched_fs = False         # notifications come for it
        self.notify_ok = True           # and are trusted (no timed read found events they missed)
        self.notify_armed = False       # a read completed since the watch began
        self.notify_seq = 0             # notifications received
        self.read_seq = self.last_read_seq = 0  # notify_seq when this read / the previous one began

    def covers(self, cursor: dict[str, int]) -> bool:
        return all(cursor.get(f, 0) >= off for f, off in self.base.items())

    def keep(self, item: tuple[Event, str, int]) -> None:
        """Add a read event to the window, dropping the oldest beyond it (``base`` follows)."""
        self.items.append(item)
        while len(self.items) > self.window:
            _, fname, end = self.items.popleft()
            self.base[fname] = end

    def fold(self, ev: Event) -> None:
        """Fold one read event into the progress (and the goodput meter, which feeds it)."""
        (self.meter if self.meter is not None else self.progress).update(ev)
        if self.agg is not None:
            self.agg.fold(ev)

    def saved(self) -> dict:
        """What the store keeps beside the cursor: the progress, and the goodput meter's state
        (without the facts, which are the progress) under ``"goodput"``."""
        d = self.progress.to_dict()
        if self.meter is not None:
            d["goodput"] = self.meter.to_dict(facts=False)
        if self.agg is not None:
            d["aggregate"] = self.agg.to_state()
        return d

    def reset(self, rec: JobRecord) -> None:
        self.base, self.cursor, self.items = {}, {}, deque()
        self.reader = None
        self.progress = Progress(rec.spec)
        self.meter = GoodputMeter(None, self.progress)
        self.agg = new_aggregate()
        self.generation += 1
        self.complete = self.polled = self.finished_seen = False


#: buckets of a server-side aggregate's step series (each gives at most 2 points: 1024 points)
AGGREGATE_BUCKETS = 512


def new_aggregate() -> JobAggregate:
    """A fresh :class:`JobAggregate` with the server's bounds."""
    return JobAggregate(max_buckets=AGGREGATE_BUCKETS)


def load_aggregate(state: dict | None) -> JobAggregate | None:
    """The saved aggregate, or None (saved by an older server or unreadable: the dashboard then
    reads the job on its own)."""
    if state is None:
        return None
    try:
        return JobAggregate.from_state(state)
    except (ValueError, KeyError, TypeError):
        return None
