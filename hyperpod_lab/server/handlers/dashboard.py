"""``GET hyperpod/jobs/<id>/dashboard``: what the Lab's job dashboard draws (issue 18).

The answer is :meth:`hyperpod_lab.fold.aggregate.JobAggregate.summary` of the job's events: one
lane per node (its ranks' spans and marks merged; issue 27), the ranks' own lanes of the one node
asked for (``?node=<lane name>``), the compact timeline and the step series downsampled to at
most ``points`` points: its size grows with the nodes, not the ranks. The aggregate is folded by the server's watcher as it reads the job's
events (:meth:`hyperpod_lab.server.watch.watcher.Watcher.dashboard`), so a request for a tracked job
reads no event file. Contract: ``docs/openapi.yaml``; what the dashboard shows: ``docs/dashboard.md``.
"""

from __future__ import annotations

import tornado.web
from jupyter_server.auth.decorator import authorized

from hyperpod_lab.errors import SpecError
from hyperpod_lab.server.handlers.base import HyperPodHandler

#: the most series points a request may ask for (and the default)
MAX_POINTS = 4000
DEFAULT_POINTS = 1000
#: the longest ``node`` a request may name (characters)
MAX_NODE_CHARS = 256


class DashboardHandler(HyperPodHandler):
    """``GET hyperpod/jobs/<id>/dashboard?points=N&node=NAME`` -> ``{"job_id", "t0", "t1" (s
    since the epoch; null before any event), "steps" (highest step + 1, or null), "ranks" (how
    many), "nodes" (the node lanes' names), "events" (folded so far), "partial" (true: more
    events wait unread; ask again), "lanes" ("job" and one per node), "expanded" (null, or
    ``{"node", "lanes": {"<rank>": lane}}``: the ranks of ``node``), "timeline", "series"
    ({step, loss, steps_per_s, t, width, points})}``. A request reads for at most ~2 s (a long
    job's first fold takes several requests).
    ``points``: 2..4000 (default 1000); anything else is a 400 naming ``points``. ``node``: one
    of ``nodes`` (at most 256 characters); a name that is no node lane of the job once its
    events are all read is a 400 naming ``node``. 404 for an unknown job."""

    @tornado.web.authenticated
    @authorized
    async def get(self, job_id: str):
        points = self.int_arg("points", DEFAULT_POINTS, low=2, high=MAX_POINTS)
        node = self.get_query_argument("node", None) or None
        if node is not None and len(node) > MAX_NODE_CHARS:
            raise SpecError("node", f"is {len(node)} characters long; a node lane's name has at most {MAX_NODE_CHARS}")
        body = await self.hp.watcher.dashboard(job_id, points, node=node)
        if node is not None and body["expanded"] is None and not body["partial"]:
            raise SpecError("node", f"{node!r} is not one of the job's {len(body['nodes'])} node lanes "
                                    f"(ask for one of the reply's 'nodes')")
        self.reply({"job_id": job_id, **body})
