"""The REST and WebSocket routes under ``<base_url>hyperpod/`` (``docs/openapi.yaml``): one module
per group of resources, each handler a thin :class:`~hyperpod_lab.server.handlers.base.HyperPodHandler`."""

from __future__ import annotations

from hyperpod_lab.server.handlers.alerts import AlertsHandler
from hyperpod_lab.server.handlers.dashboard import DashboardHandler
from hyperpod_lab.server.handlers.envparity import EnvDiffHandler, EnvExportHandler
from hyperpod_lab.server.handlers.jobs import (
    CancelHandler,
    ClusterHandler,
    ClustersHandler,
    DiscoverHandler,
    EventsHandler,
    FaultsHandler,
    GoodputAdviceHandler,
    JobGoodputHandler,
    JobHandler,
    JobsHandler,
    LogsHandler,
)
from hyperpod_lab.server.handlers.logtriage import LogTriageHandler
from hyperpod_lab.server.handlers.queue import QueueHandler
from hyperpod_lab.server.handlers.stream import StreamHandler


def handlers() -> list[tuple[str, type]]:
    """``(path relative to <base_url>, handler)``; the WebSocket comes from ``stream``."""
    job = r"hyperpod/jobs/(?P<job_id>[^/]+)"
    return [
        (r"hyperpod/clusters", ClustersHandler),
        (r"hyperpod/clusters/(?P<name>[^/]+)", ClusterHandler),
        (r"hyperpod/clusters/(?P<name>[^/]+)/env", EnvDiffHandler),
        (r"hyperpod/clusters/(?P<name>[^/]+)/env/export", EnvExportHandler),
        (r"hyperpod/clusters/(?P<name>[^/]+)/queue", QueueHandler),
        (r"hyperpod/jobs", JobsHandler),
        (job, JobHandler),
        (job + r"/cancel", CancelHandler),
        (job + r"/faults", FaultsHandler),
        (job + r"/logs", LogsHandler),
        (job + r"/logs/triage", LogTriageHandler),
        (job + r"/events", EventsHandler),
        (job + r"/stream", StreamHandler),
        (job + r"/goodput", JobGoodputHandler),
        (job + r"/dashboard", DashboardHandler),
        (r"hyperpod/goodput/advice", GoodputAdviceHandler),
        (r"hyperpod/discover", DiscoverHandler),
        (r"hyperpod/alerts", AlertsHandler),
    ]
