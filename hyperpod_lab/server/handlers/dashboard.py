"""``GET hyperpod/jobs/<id>/dashboard``: what the Lab's job dashboard draws (issue 18).

The answer is :meth:`hyperpod_lab.fold.aggregate.JobAggregate.summary` of the job's events: the
per-rank lanes (spans and marks), the compact timeline and the step series downsampled to at
most ``points`` points. The aggregate is folded by the server's watcher as it reads the job's
events (:meth:`hyperpod_lab.server.watch.watcher.Watcher.dashboard`), so a request for a tracked job
reads no event file. Contract: ``docs/openapi.yaml``; what the dashboard shows: ``docs/dashboard.md``.
"""

from __future__ import annotations

import tornado.web
from jupyter_server.auth.decorator import authorized

from hyperpod_lab.server.handlers.base import HyperPodHandler

#: the most series points a request may ask for (and the default)
MAX_POINTS = 4000
DEFAULT_POINTS = 1000


class DashboardHandler(HyperPodHandler):
    """``GET hyperpod/jobs/<id>/dashboard?points=N`` -> ``{"job_id", "t0", "t1" (s since the
    epoch; null before any event), "steps" (highest step + 1, or null), "ranks", "events"
    (folded so far), "partial" (true: more events wait unread; ask again), "lanes",
    "timeline", "series" ({step, loss, steps_per_s, t, width, points})}``. A request reads for
    at most ~2 s (a long job's first fold takes several requests).
    ``points``: 2..4000 (default 1000); anything else is a 400 naming ``points``. 404 for an
    unknown job."""

    @tornado.web.authenticated
    @authorized
    async def get(self, job_id: str):
        points = self.int_arg("points", DEFAULT_POINTS, low=2, high=MAX_POINTS)
        body = await self.hp.watcher.dashboard(job_id, points)
        self.reply({"job_id": job_id, **body})
