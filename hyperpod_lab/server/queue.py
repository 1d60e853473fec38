"""The queue around the jobs, shared by every tab: one snapshot per cluster per interval (issue 29 item 4).

``GET hyperpod/clusters/<name>/queue`` (:mod:`hyperpod_lab.server.handlers.queue`) answers from
:class:`QueueCache`: a cluster's snapshot (:meth:`hyperpod_lab.schedulers.base.Scheduler.queue_snapshot`;
Slurm: ONE ``squeue`` and ONE ``sinfo`` over the cluster's remote seam) is taken at most once per
``interval_s``, whatever the number of open Labs, tabs or requests: a request within the interval
gets the snapshot already taken, and requests that arrive while one is being taken wait for that
one (they never start a second). sinfo(1), PERFORMANCE: "Do not run sinfo or other Slurm client
commands that send remote procedure calls to slurmctld from loops in shell scripts or other
programs." A failure (cluster unreachable, squeue exiting non-zero) is kept for the interval too,
so a dead login node is not asked once per tab either.

The snapshot runs on the cluster's own worker thread (:meth:`Watcher.run_on`: off the IOLoop, and a
slow cluster holds only its own calls). Everything else here runs on the IOLoop, so the cache needs
no lock. What the panel shows: ``docs/queue.md``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hyperpod_lab.schedulers.base import QueueUnsupported

#: seconds between two snapshots of one cluster (the panel asks every 10 s too); the server's is
#: ``HyperPodLab.queue_interval_s`` (``hyperpod_lab.server``)
DEFAULT_INTERVAL_S = 10.0


class QueueCache:
    """One shared queue snapshot per cluster, taken at most once per ``interval_s``.

    Args:
        watcher: the server's :class:`~hyperpod_lab.server.watch.watcher.Watcher` (its per-cluster
            worker threads run the snapshots; its store names our jobs).
        interval_s: the most often a cluster is asked (s).

    Attributes:
        snapshots: snapshots taken, per cluster (tests and benchmarks read it).
    """

    def __init__(self, watcher, interval_s: float = DEFAULT_INTERVAL_S):
        self.watcher, self.client = watcher, watcher.client
        self.interval_s = float(interval_s)
        self.snapshots: dict[str, int] = {}
        self._entries: dict[str, dict[str, Any]] = {}  # cluster -> {"t", "body" | "error"}
        self._pending: dict[str, asyncio.Future] = {}

    async def get(self, cluster: str) -> dict[str, Any]:
        """The cluster's queue view (see :meth:`_take` for its keys), at most ``interval_s`` old,
        with ``age_s`` (s since it was taken) and ``interval_s``.

        Raises:
            UnknownCluster, ConfigError: no such profile (before anything is run).
            ClusterUnreachable, HostKeyError, RemoteCommandError, TimeoutError: taking the
                snapshot failed (the same error for every request of that interval).
        """
        from hyperpod_lab.submit.clusters import get_profile

        get_profile(cluster)  # UnknownCluster now, never a cached failure
        entry = self._entries.get(cluster)
        if entry is None or time.monotonic() - entry["t"] >= self.interval_s:
            fut = self._pending.get(cluster)
            if fut is None:
                fut = self._pending[cluster] = asyncio.ensure_future(self._refresh(cluster))
            entry = await asyncio.shield(fut)
        if "error" in entry:
            raise entry["error"]
        return {**entry["body"], "age_s": round(time.monotonic() - entry["t"], 3), "interval_s": self.interval_s}

    async def _refresh(self, cluster: str) -> dict[str, Any]:
        try:
            body = await self.watcher.run_on(cluster, self._take, cluster)
            entry: dict[str, Any] = {"t": time.monotonic(), "body": body}
        except Exception as e:  # kept for the interval, raised to every request
            entry = {"t": time.monotonic(), "error": e}
        finally:
            self._pending.pop(cluster, None)
        self._entries[cluster] = entry
        return entry

    def _take(self, cluster: str) -> dict[str, Any]:
        """On the cluster's worker thread: the snapshot, our jobs marked.

        Returns:
            ``{"cluster", "supported": bool, "message": str | None, "fetched_at" (s since the
            epoch), "user", "jobs", "nodes", "partitions", "counts" ({group: nodes})}``. Each job
            gains ``"mine"`` (its user is the login user, or it is one of ours) and ``"job_id"`` (the
            hyperpod-lab id of ours, else None). A backend without a queue view gives
            ``supported: false``, its message and empty lists.
        """
        self.snapshots[cluster] = self.snapshots.get(cluster, 0) + 1
        body: dict[str, Any] = {"cluster": cluster, "supported": True, "message": None, "fetched_at": time.time(),
                                "user": None, "jobs": [], "nodes": [], "partitions": [], "counts": {}}
        try:
            snap = self.client.scheduler(cluster).queue_snapshot()
        except QueueUnsupported as e:
            return {**body, "supported": False, "message": str(e)}
        ours = {r.native_id: r.job_id for r in self.client.store.list() if r.cluster == cluster and r.native_id}
        user = snap.get("user")
        jobs = []
        for job in snap["jobs"]:
            jid = ours.get(job["id"].split("_")[0].split("+")[0])
            jobs.append({**job, "job_id": jid, "mine": jid is not None or (user is not None and job["user"] == user)})
        counts: dict[str, int] = {}
        for node in snap["nodes"]:
            counts[node["group"]] = counts.get(node["group"], 0) + 1
        return {**body, "user": user, "jobs": jobs, "nodes": snap["nodes"], "partitions": snap["partitions"],
                "counts": counts}
