"""``GET hyperpod/jobs/<id>/logs/triage``: every rank's log in one view (``hyperpod_lab.submit.logtriage``).

Query parameters (all optional; contract in ``docs/openapi.yaml``):

* ``ranks``: ``0,2,4-7`` (at most 256). Default: the failing ranks the job's ``fault.detected``
  events name (the first failure first; from the watcher's fold of the job when it has read
  every event, else from the event files) and 4 healthy ranks spread over the rest, for
  contrast: a view opens a constant number of files whatever the rank count (a search goes
  through every rank, bounded per request; a follow poll reads the ranks its cursor names).
* ``cursor``: the reply's ``cursor``, to read on from where it stopped (follow mode: only new
  lines; a search: the next part of the logs). At most 2 KiB whatever the rank count: a big
  one is a token of the server's cursor store (:mod:`hyperpod_lab.server.cursors`).
* ``length``: bytes read per rank and log file, 1 to 1 MiB (default 64 KiB); a view reads at
  most 8 MiB and returns at most 20,000 lines per request, all ranks together
  (``logtriage.VIEW_BYTES`` / ``VIEW_LINES``; the reply's ``truncated`` says when they cut it).
* ``tail``: ``1`` reads a file the cursor does not name from its last ``length`` bytes.
* ``q``: search (case-insensitive substring; with ``regex=1`` a regular expression in RE2's
  syntax, matched in linear time: backreferences and lookaround are a 400 naming them),
  ``scan`` (bytes scanned per request, default 8 MiB, at most 64 MiB), ``limit`` (matches, at
  most 1000); a search also visits at most 64 ranks per request, and a reply cut by any bound
  says ``truncated`` with a ``note`` (narrow the search, or send the cursor to go on).
* ``around``: ``traceback``: the window around the first failing rank's traceback; ``time``
  (seconds since the epoch, e.g. a ``fault.detected`` event's) picks the traceback nearest it.
* ``failure``: ``0`` skips finding the first failure (follow polls).

Bad parameters answer 400 with the field named (``{"error": {"type": "SpecError", "field"}}``).
"""

from __future__ import annotations

import math

import tornado.web
from jupyter_server.auth.decorator import authorized

from hyperpod_lab.errors import SpecError
from hyperpod_lab.server.handlers.base import HyperPodHandler
from hyperpod_lab.submit import logtriage


class LogTriageHandler(HyperPodHandler):
    """The triage view, search or traceback window of a job's rank logs; every read bounded by
    ``length`` (view) or ``scan`` (search) bytes, and each request by the per-request budgets of
    :mod:`hyperpod_lab.submit.logtriage` (bytes and lines, whatever the rank count). The search
    pattern is compiled (a 400 when RE2 cannot run it) before anything is read. Answers the
    dict of :func:`hyperpod_lab.submit.logtriage.triage`."""

    def _flag(self, name: str) -> bool:
        raw = self.get_query_argument(name, None)
        if raw in (None, "", "0", "false"):
            return False
        if raw in ("1", "true"):
            return True
        raise SpecError(name, f"must be 0 or 1, got {raw[:40]!r}")

    def _folded_faults(self, job_id: str) -> list[dict] | None:
        """The job's ``fault.detected`` events from the watcher's fold of it (its tailer's
        aggregate, every writer's files folded: no file read here), when the tailer has read
        all the events there are; None otherwise (triage then reads the event files)."""
        t = self.hp.watcher.tailers.get(job_id)
        if t is None or t.agg is None or not t.polled or t.more:
            return None
        return logtriage.faults_from_aggregate(t.agg)

    @tornado.web.authenticated
    @authorized
    async def get(self, job_id: str):
        ranks = logtriage.parse_ranks(self.get_query_argument("ranks", None))
        # the old form, or a token of the server's cursor store (bounded whatever the rank count)
        cursors = self.hp.watcher.cursors
        cursor = cursors.resolve(job_id, self.get_query_argument("cursor", None), decode=logtriage.decode_log_cursor)
        length = self.int_arg("length", logtriage.DEFAULT_LENGTH, low=1, high=logtriage.MAX_LENGTH)
        scan = self.int_arg("scan", logtriage.DEFAULT_SCAN, low=1, high=logtriage.MAX_SCAN)
        limit = self.int_arg("limit", 200, low=1, high=logtriage.MAX_MATCHES)
        tail, regex = self._flag("tail"), self._flag("regex")
        failure = self.get_query_argument("failure", None) in (None, "") or self._flag("failure")
        q = self.get_query_argument("q", None)
        if q is not None:
            if q == "":
                q = None
            else:
                logtriage.compile_query(q, regex)  # 400 before any read
        around = self.get_query_argument("around", None)
        if around not in (None, "", "traceback"):
            raise SpecError("around", f"must be 'traceback', got {around[:40]!r}")
        near = self.get_query_argument("time", None)
        near_time = None
        if near not in (None, ""):
            try:
                near_time = float(near)
            except ValueError:
                near_time = math.nan
            if not math.isfinite(near_time) or near_time < 0:
                raise SpecError("time", f"must be seconds since the epoch (a number >= 0), got {near[:40]!r}")
        # the fault events pick the ranks of a first view and find the first failure
        needs_faults = failure or around == "traceback" or (ranks is None and not cursor and q is None)
        reply = await self.hp.watcher.run_for_job(
            job_id, logtriage.triage, self.hp.client, job_id, ranks=ranks, cursor=cursor, length=length,
            tail=tail, q=q, regex=regex, scan=scan, limit=limit, around_traceback=around == "traceback",
            near_time=near_time, failure=failure,
            faults=self._folded_faults(job_id) if needs_faults else None)
        if isinstance(reply.get("cursor"), str) and len(reply["cursor"]) > 1024:  # a big one: a token
            reply["cursor"] = cursors.issue(job_id, logtriage.decode_log_cursor(reply["cursor"]))
        self.reply(reply)
