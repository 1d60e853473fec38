"""``GET hyperpod/clusters/<name>/queue``: the queue around the jobs (issue 29 item 4, ``docs/queue.md``).

Every user's pending and running jobs (ours marked, with the reason they wait and their place among
the pending jobs of their partition), the nodes by state with their reasons, and the partitions:
:class:`~hyperpod_lab.server.queue.QueueCache`'s snapshot, taken at most once per interval per
cluster whatever the number of tabs (Slurm: one ``squeue`` and one ``sinfo``). Contract:
``docs/openapi.yaml``.
"""

from __future__ import annotations

import tornado.web
from jupyter_server.auth.decorator import authorized

from hyperpod_lab.server.handlers.base import HyperPodHandler


class QueueHandler(HyperPodHandler):
    """``GET hyperpod/clusters/<name>/queue`` -> ``{"cluster", "supported", "message", "fetched_at"
    (s since the epoch), "age_s", "interval_s" (s), "user", "jobs", "nodes", "partitions",
    "counts"}`` (:meth:`hyperpod_lab.server.queue.QueueCache._take`). A cluster without a queue view
    (local, EKS) answers 200 with ``supported: false`` and a message saying the view is Slurm-only.
    404 for an unknown cluster; 502 when the login node cannot be reached or squeue/sinfo fail; 504
    when they time out. Job names, users and node reasons are other users' text: render it as text."""

    @tornado.web.authenticated
    @authorized
    async def get(self, name: str):
        self.reply(await self.hp.queue.get(name))
