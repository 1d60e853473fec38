"""The clusters, jobs, events, logs, faults, goodput and discovery REST handlers under
``<base_url>hyperpod/`` (contract: ``docs/openapi.yaml``). Thin: each parses its input, calls the
core (``Client``) or the :class:`Watcher` and writes JSON; errors map to statuses in
:class:`~hyperpod_lab.server.handlers.base.HyperPodHandler`."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import asdict
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.utils import ensure_async

from hyperpod_lab.errors import NotAllowed, SpecError
from hyperpod_lab.jobdir import DEFAULT_FAULT_KIND, fault_kind, slow_factor
from hyperpod_lab.schedulers.base import DEFAULT_LOG_TAIL, LogChunk
from hyperpod_lab.server.handlers.base import (
    EVENT_PAGE_BYTES_PER_EVENT,
    EVENT_PAGE_MAX_BYTES,
    MAX_EVENTS,
    MAX_LOG_BYTES,
    MAX_OFFSET,
    HyperPodHandler,
)
from hyperpod_lab.server.watch.watcher import file_share
from hyperpod_lab.spec import host_code_env
from hyperpod_lab.submit.clusters import get_profile, load_profiles
from hyperpod_lab.submit.notebook_script import skip_env_check, spec_from_request


class ClustersHandler(HyperPodHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        profs = load_profiles()
        self.reply({"clusters": [_profile(p) for p in profs.values()]})


class ClusterHandler(HyperPodHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, name: str):
        prof = get_profile(name)
        health = await self.hp.watcher.run_on(name, self.hp.client.cluster_health, name)
        self.reply({"cluster": _profile(prof), **health})


class JobsHandler(HyperPodHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        self.reply({"jobs": self.hp.watcher.jobs()})

    @tornado.web.authenticated
    @authorized
    async def post(self):
        body = self.json_body()
        skip = skip_env_check(body)
        spec = spec_from_request(body, self.hp.root_dir)
        self._check_secret_env(spec)
        await self._check_local(spec)
        # on the cluster's own worker: a hung cluster holds only its own submits
        rec = await self.hp.watcher.run_on(spec.cluster, self.hp.client.submit, spec,
                                           env_check=False if skip else None)
        self.hp.watcher.track(rec)
        self.reply({"job": self.hp.watcher.view(rec)}, status=201)

    def _check_secret_env(self, spec) -> None:
        """``secret_env`` copies values from this server's environment into the job (any
        backend), so over REST a name is taken only when the server's owner listed it in
        ``HyperPodLab.secret_env_allowlist`` (default empty). Raises NotAllowed naming the
        refused names and the setting."""
        refused = [n for n in spec.secret_env if n not in self.hp.secret_env_allowlist]
        if refused:
            raise NotAllowed(
                f"secret_env {', '.join(refused)} would copy the Jupyter server's own environment variable into "
                "the job, and it is not in the server's allowlist. Remove it from secret_env (or pass a value "
                "you own with env), or ask the server's owner to add it to c.HyperPodLab.secret_env_allowlist "
                "in jupyter_server_config.py")

    async def _check_local(self, spec) -> None:
        """On the local backend the job runs the user's script on the Jupyter host as the server's
        user: that is running code there, so it needs what a kernel needs, ``execute`` on
        ``kernels`` (besides ``write`` on ``hyperpod``). Raises NotAllowed."""
        if get_profile(spec.cluster).orchestrator != "local":
            return
        if not await ensure_async(self.authorizer.is_authorized(self, self.current_user, "execute", "kernels")):
            risky = host_code_env([*spec.env, *spec.secret_env])
            also = f" (and {', '.join(risky)} would run code there too)" if risky else ""
            raise NotAllowed(f"cluster {spec.cluster!r} runs the job on the Jupyter host{also}; only a user who "
                             "may run kernels ('execute' on 'kernels') may submit to it. Submit to a Slurm or "
                             "EKS cluster, or ask the server's owner for the right to run kernels")


class JobHandler(HyperPodHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, job_id: str):
        self.reply({"job": self.hp.watcher.view(self.hp.client.get(job_id))})


class CancelHandler(HyperPodHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self, job_id: str):
        rec = await self.hp.watcher.run_for_job(job_id, self.hp.client.cancel, job_id)
        self.hp.watcher.track(rec)
        self.reply({"job": self.hp.watcher.view(rec)})


class FaultsHandler(HyperPodHandler):
    """``POST jobs/<id>/faults`` ``{"rank": R, "kind": "kill" | "node" | "exception" | "hang" |
    "slow", "factor": F}`` (kind default ``kill``; ``factor`` for ``slow`` only, 1 to 100, default
    2): :meth:`hyperpod_lab.submit.client.Client.inject_fault`. 400 for a bad rank, kind (the message
    names the valid kinds) or factor, 403 when the scheduler refuses (a Slurm node needs an
    operator), 409 when the job, rank or backend cannot take it."""

    @tornado.web.authenticated
    @authorized
    async def post(self, job_id: str):
        body = self.json_body()
        rank = body.get("rank") if isinstance(body, dict) else None
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise SpecError("rank", f'send {{"rank": R}} with R a rank >= 0, got {rank!r}')
        kind = fault_kind(body.get("kind", DEFAULT_FAULT_KIND))
        factor = slow_factor(kind, body.get("factor"))
        info = await self.hp.watcher.run_for_job(job_id, self.hp.client.inject_fault, job_id, rank, kind, factor)
        self.reply({"rank": rank, **info})


class LogsHandler(HyperPodHandler):
    """A byte range of the job's (or a rank's) log: ``offset`` (first byte; omitted: the tail)
    and ``length`` (bytes, default :data:`~hyperpod_lab.schedulers.base.DEFAULT_LOG_TAIL`, at
    most :data:`MAX_LOG_BYTES`). Answers ``{"text", "rank", "offset", "end", "size"}``: the
    range served is ``[offset, end)`` of a ``size``-byte log; page on with ``offset=end``."""

    @tornado.web.authenticated
    @authorized
    async def get(self, job_id: str):
        rank = self.int_arg("rank")
        offset = self.int_arg("offset", None, low=0, high=MAX_OFFSET)
        length = self.int_arg("length", DEFAULT_LOG_TAIL, low=0, high=MAX_LOG_BYTES)
        chunk = await self.hp.watcher.run_for_job(job_id, read_log, self.hp.client, job_id, rank, offset, length)
        self.reply({**chunk.to_dict(), "rank": rank})


class EventsHandler(HyperPodHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, job_id: str):
        # the old form, or a token of the server's cursor store (bounded: server/cursors.py)
        cursor = self.hp.watcher.cursors.resolve(job_id, self.get_query_argument("cursor", None))
        limit = self.int_arg("limit", MAX_EVENTS, low=1, high=MAX_EVENTS)
        events, new_cursor, more = await self.hp.watcher.run_for_job(job_id, read_events, self.hp.client, job_id,
                                                                     cursor, limit)
        self.reply({"events": events, "cursor": self.hp.watcher.cursors.issue(job_id, new_cursor), "more": more})


class DiscoverHandler(HyperPodHandler):
    """HyperPod clusters of a region through the SageMaker API (``hyperpod_lab.submit.discovery``): the
    sidebar's refresh. GET lists them; POST ``{"region", "profile", "overwrite"}`` also writes a
    cluster profile per cluster and returns what it wrote. Both need ``execute`` on ``hyperpod``
    (not ``read``/``write``): they spend the server's AWS credentials, and POST rewrites the
    server's ``clusters.toml``."""

    def _args(self, body: dict) -> dict:
        """``region`` and ``profile`` of the body (POST) or query (GET): text or absent. Raises
        SpecError naming the field otherwise."""
        get = (lambda k: body.get(k)) if body else (lambda k: self.get_query_argument(k, None))
        out = {}
        for key, example in (("region", "us-east-1"), ("profile", "default")):
            value = get(key)
            if value is not None and not isinstance(value, str):
                raise SpecError(key, f"must be text, e.g. {example!r}, or left out; got a {type(value).__name__}")
            out[key] = value or None
        return out

    @tornado.web.authenticated
    @authorized("execute")  # it calls AWS with the server's credentials: not for a 'read' role
    async def get(self):
        from hyperpod_lab.submit.discovery import discover_clusters

        found = await self.hp.watcher.run(discover_clusters, **self._args({}))
        self.reply({"clusters": [c.to_dict() for c in found]})

    @tornado.web.authenticated
    @authorized("execute")  # calls AWS with the server's credentials and rewrites clusters.toml, like GET
    async def post(self):
        from hyperpod_lab.submit.discovery import discover_clusters, write_profiles

        body = self.json_body()
        if not isinstance(body, dict):
            raise SpecError("body", 'send {"region": "us-east-1"} (region and profile optional)')
        args, overwrite = self._args(body), body.get("overwrite", False)
        if not isinstance(overwrite, bool):
            raise SpecError("overwrite", f"must be true or false, got {overwrite!r}"[:200])
        found = await self.hp.watcher.run(discover_clusters, **args)
        written = await self.hp.watcher.run(write_profiles, found, overwrite)
        self.reply({"clusters": [c.to_dict() for c in found],
                    "written": [{"name": n, "what": w} for n, w in written]})


class GoodputAdviceHandler(HyperPodHandler):
    """``hyperpod_lab.goodput.advise`` for the submit form: interval and projected goodput."""

    @tornado.web.authenticated
    @authorized
    async def get(self):
        from hyperpod_lab import goodput

        instances = self.int_arg("instances", None, low=1)
        args = {k: self.get_query_argument(k, None) for k in ("failure_rate", "checkpoint_cost_s", "step_time_s")}
        if instances is None or None in args.values():
            raise SpecError("query", "give instances, failure_rate, checkpoint_cost_s and step_time_s")
        try:
            cost, step = float(args["checkpoint_cost_s"]), float(args["step_time_s"])
        except ValueError:
            raise SpecError("query", "checkpoint_cost_s and step_time_s are seconds (numbers)") from None
        self.reply({"advice": goodput.advise(instances, args["failure_rate"], cost, step)})


class JobGoodputHandler(HyperPodHandler):
    """A job's measured goodput and where the lost time went, ``{"measured": ...}`` (the dict
    of ``hyperpod_lab.goodput.measure_from_events``: faults, recoveries and downtime from the job
    facts fold, as in the JobView's ``progress``), from the job's incremental goodput fold
    (``Watcher.goodput``): a tracked job's is read from its tailer's meter without reading any
    event; another job's is brought up to date from its cursor (issue 13, finding 3)."""

    @tornado.web.authenticated
    @authorized
    async def get(self, job_id: str):
        self.reply({"measured": await self.hp.watcher.goodput(job_id)})


class _Pages:
    """The readers of REST event pages, kept between requests (at most ``most``, newest used):
    a request whose cursor is where the last page of a job stopped continues with that page's
    unreturned events and the reader that holds what it parsed, so paging through a job of
    thousands of writers reads and parses each line once (a new reader per page read up to a
    page of every writer file again: 18.3 s for 41,065 events at 2,048 ranks)."""

    def __init__(self, most: int = 32):
        self.most = most
        self._kept: OrderedDict[tuple, tuple[dict[str, int], list, Any]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(job_id: str, cursor: dict[str, int]) -> tuple:
        return job_id, hash(tuple(sorted(cursor.items())))

    def take(self, job_id: str, cursor: dict[str, int]) -> tuple[list, Any] | None:
        with self._lock:
            kept = self._kept.pop(self._key(job_id, cursor), None)
        if kept is None or kept[0] != cursor or getattr(kept[2].files, "alive", True) is False:
            return None
        return kept[1], kept[2]

    def put(self, job_id: str, cursor: dict[str, int], rest: list, reader) -> None:
        with self._lock:
            self._kept[self._key(job_id, cursor)] = (dict(cursor), rest, reader)
            while len(self._kept) > self.most:
                self._kept.popitem(last=False)


_PAGES = _Pages()


def read_events(client, job_id: str, cursor: dict[str, int], limit: int) -> tuple[list[dict], dict[str, int], bool]:
    """Up to ``limit`` events after ``cursor``, the cursor just past the last one returned, and
    whether more may follow at once. Reads at most ``limit`` x :data:`EVENT_PAGE_BYTES_PER_EVENT`
    bytes of each file from the cursor (at least 4 KiB, at most :data:`EVENT_PAGE_MAX_BYTES`),
    never the whole file, and for a job of many files about ``READ_TOTAL_BYTES`` all together
    (:func:`~hyperpod_lab.server.watch.watcher.file_share`; issue 27: a 2,048-rank job's first
    page parsed all its 246,365 events); a request that continues where the last page stopped
    goes on with what that page read and parsed (:class:`_Pages`)."""
    per_file = min(EVENT_PAGE_MAX_BYTES, max(4096, limit * EVENT_PAGE_BYTES_PER_EVENT))
    kept = _PAGES.take(job_id, cursor)
    if kept is not None:
        located, reader = list(kept[0]), kept[1]
        more = True
    else:
        located, reader, more = [], client.event_reader(job_id, cursor), False
    polled = False
    share = file_share(per_file, len(reader.cursor))
    while len(located) <= limit:  # (a kept page's rest is older than anything the reader reads next)
        located += reader.poll_located(max_bytes=share)
        more, polled = reader.more, True
        # a first page (no file known yet) read a little of each file: a job of few files reads
        # on at each one's share (one of many files has had it)
        read, share = share, file_share(per_file, len(reader.cursor))
        if not more or share <= read:
            break
    cur = dict(cursor)
    out = []
    for ev, fname, end in located[:limit]:  # a prefix per file (poll_located keeps file order)
        out.append(json.loads(ev.to_json()))
        cur[fname] = end
    rest = located[limit:]
    if not rest and polled:
        cur = dict(reader.cursor)  # (also past malformed lines it skipped)
    if rest or more:
        _PAGES.put(job_id, cur, rest, reader)
    return out, cur, bool(rest) or more


def read_log(client, job_id: str, rank: int | None, offset: int | None, length: int) -> LogChunk:
    """A byte range of a job's log (see :class:`LogsHandler`); one bounded read."""
    rec = client.get(job_id)
    return client.scheduler(rec.cluster).log_range(rec, rank, offset, length)


def _profile(p) -> dict[str, Any]:
    d = asdict(p)
    d["partition"] = p.defaults.partition
    return d
