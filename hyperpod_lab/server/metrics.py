"""The extension's Prometheus metrics on the Jupyter server's own ``/metrics`` (issue 29, item 2).

jupyter-server already serves ``<base_url>metrics`` with ``prometheus_client``'s default registry
(``PrometheusMetricsHandler``; it asks for the server's token unless
``ServerApp.authenticate_prometheus`` is False). :class:`ServerMetrics` adds, per cluster profile
(label ``cluster``):

* ``hyperpod_lab_jobs{cluster, state}`` (gauge): the job store's jobs by state (pending,
  running, completed, failed, cancelled, unknown) at the watcher's last status tick.
* ``hyperpod_lab_faults_total`` / ``hyperpod_lab_recoveries_total`` (counters): failure incidents
  and recovered incidents, as the job facts fold counts them (:mod:`hyperpod_lab.fold.facts`:
  several ``fault.detected`` of one loss are one incident).
* ``hyperpod_lab_fault_detection_latency_seconds`` (histogram): per incident, its detection time
  minus the time of the job's last ``step`` event before it (the fold's ``detected_at -
  last_step_time``): the time the job made no progress before the fault was reported, an upper
  bound of the detection latency (it includes up to one step). Incidents before the first step
  have none.
* ``hyperpod_lab_recovery_downtime_seconds`` (histogram): per recovered incident, the fold's
  ``downtime_s`` (detection to the first completed step after the recovery).
* ``hyperpod_lab_event_lag_seconds`` (histogram): for each event, the server's wall clock when it
  read the event minus the event's ``time`` (written by the job's host: clock skew between the
  hosts adds to it). A job's history (every read until one finds nothing more: read in
  bounded pages) is not counted.
* ``hyperpod_lab_status_poll_seconds`` (histogram): wall time of one batched status refresh of a
  cluster (one ``squeue``/``sacct`` for all its jobs, ``Watcher._refresh_cluster``).

Incidents are counted by the process that reads their events: a server restarted with a job's
saved progress does not count that job's earlier incidents again (Prometheus sees the counters
reset, as for any restart).

The metrics never read a file or a cluster when scraped: the watcher pushes to them from its
loops (:meth:`ServerMetrics.on_status`, :meth:`ServerMetrics.after_fold`).
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from hyperpod_lab.submit.jobs import JobStatus

#: seconds: detection latency and downtime span a killed process (seconds) to a replaced node (minutes)
LATENCY_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
DOWNTIME_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
POLL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)

_STATES = tuple(s.value for s in JobStatus)
_BY_REGISTRY: dict[int, "ServerMetrics"] = {}


class _JobsCollector:
    """``hyperpod_lab_jobs{cluster, state}`` from the counts the last status tick left."""

    def __init__(self, owner: "ServerMetrics"):
        self.owner = owner

    def describe(self):
        return [GaugeMetricFamily("hyperpod_lab_jobs", "Jobs in the job store by cluster and state",
                                  labels=["cluster", "state"])]

    def collect(self):
        g = GaugeMetricFamily("hyperpod_lab_jobs", "Jobs in the job store by cluster and state",
                              labels=["cluster", "state"])
        counts = dict(self.owner.job_counts)  # replaced whole by on_status: no lock needed
        for cluster in sorted({c for c, _ in counts}):
            for state in _STATES:  # every state, zeros included: a series does not vanish
                g.add_metric([cluster, state], counts.get((cluster, state), 0))
        yield g


class ServerMetrics:
    """The extension's metrics in ``registry`` (default: the one jupyter-server serves). One per
    registry and process: :func:`server_metrics` returns it.

    Attributes:
        job_counts: ``{(cluster, state): jobs}`` at the last status tick.
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY):
        self.job_counts: dict[tuple[str, str], int] = {}
        labels = ["cluster"]

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry)

        self.faults = Counter("hyperpod_lab_faults", "Failure incidents read (job facts fold)", labels,
                              registry=registry)
        self.recoveries = Counter("hyperpod_lab_recoveries", "Failure incidents recovered (job facts fold)", labels,
                                  registry=registry)
        self.detection = histogram("hyperpod_lab_fault_detection_latency_seconds",
                                   "Seconds from the last step event before an incident to its detection",
                                   LATENCY_BUCKETS)
        self.downtime = histogram("hyperpod_lab_recovery_downtime_seconds",
                                  "Seconds from an incident's detection to the first step after its recovery",
                                  DOWNTIME_BUCKETS)
        self.lag = histogram("hyperpod_lab_event_lag_seconds",
                             "Seconds from an event's time (its writer's clock) to the server reading it", LAG_BUCKETS)
        self.poll = histogram("hyperpod_lab_status_poll_seconds",
                              "Seconds of one batched status refresh (squeue/sacct) of a cluster's jobs", POLL_BUCKETS)
        registry.register(_JobsCollector(self))

    # ---- the watcher's hooks (IOLoop thread) --------------------------------------------
    def on_status(self, recs: Iterable[Any], poll_s: dict[str, float]) -> None:
        """After a status tick: ``recs`` (JobRecords, every job of the store) and the seconds each
        cluster's refresh took (``{cluster: s}``, the clusters refreshed in this tick)."""
        counts: dict[tuple[str, str], int] = {}
        for r in recs:
            key = (r.cluster, r.status)
            counts[key] = counts.get(key, 0) + 1
        self.job_counts = counts
        for cluster, secs in poll_s.items():
            self.poll.labels(cluster).observe(secs)

    def before_fold(self, tailer) -> tuple[int, int]:
        """What the incidents were before a batch of events: (incidents, ended incidents)."""
        incs = tailer.progress.incidents
        return len(incs), sum(1 for i in incs if i["end_at"] is not None)

    def after_fold(self, tailer, before: tuple[int, int], located: list, first: bool,
                   now: float | None = None) -> None:
        """After ``located`` (``(Event, file, end)`` triples, possibly none) were folded into
        ``tailer.progress``: count the incidents that opened or ended in them, and the events' lag
        unless this was the tailer's ``first`` read."""
        cluster = tailer.cluster
        now = time.time() if now is None else now
        if not first and located and not getattr(tailer, "history", False):
            lag = self.lag.labels(cluster)
            for ev, _, _ in located:
                lag.observe(max(0.0, now - float(ev.time)))
        n_before, ended_before = before
        incs = tailer.progress.incidents
        for inc in incs[n_before:]:
            self.faults.labels(cluster).inc()
            if inc["detected_at"] is not None and inc["last_step_time"] is not None:
                self.detection.labels(cluster).observe(max(0.0, inc["detected_at"] - inc["last_step_time"]))
        ended = [i for i in incs if i["end_at"] is not None]
        for inc in ended[ended_before:]:
            self.recoveries.labels(cluster).inc()
            if isinstance(inc["downtime_s"], (int, float)):
                self.downtime.labels(cluster).observe(inc["downtime_s"])


def server_metrics(registry: CollectorRegistry = REGISTRY) -> ServerMetrics:
    """The process's :class:`ServerMetrics` of ``registry``, made on first use (a second
    registration of the same names would raise ``ValueError: Duplicated timeseries``)."""
    m = _BY_REGISTRY.get(id(registry))
    if m is None:
        m = _BY_REGISTRY[id(registry)] = ServerMetrics(registry)
    return m
