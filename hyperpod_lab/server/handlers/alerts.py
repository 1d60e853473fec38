"""``GET hyperpod/alerts?after=N``: the alerts the user's rules fired, for the open Lab's
notifications (issue 29 item 3, ``docs/alerts.md``). Contract: ``docs/openapi.yaml``."""

from __future__ import annotations

import tornado.web
from jupyter_server.auth.decorator import authorized

from hyperpod_lab.server.handlers.base import MAX_OFFSET, HyperPodHandler


class AlertsHandler(HyperPodHandler):
    """``GET hyperpod/alerts?after=N`` -> ``{"enabled", "alerts", "next", "epoch"}``: the alerts
    fired after number ``N`` (default 0: every one kept), oldest first, each ``{"seq", "key",
    "rule", "on", "job_id", "cluster", "text", "at"}`` (:meth:`hyperpod_lab.server.alerts.Alerts.
    fired_after`); ask with ``after=next`` the next time. Without an alerts file (or with a
    malformed one) ``enabled`` is false and the list empty. 400 for an ``after`` that is not a
    whole number from 0."""

    @tornado.web.authenticated
    @authorized
    def get(self):
        after = self.int_arg("after", 0, 0, MAX_OFFSET)
        alerts = self.hp.alerts
        if alerts is None:
            self.reply({"enabled": False, "alerts": [], "next": 0, "epoch": 0})
            return
        self.reply({"enabled": True, **alerts.fired_after(after)})
