"""``WS <base_url>hyperpod/jobs/{id}/stream?cursor=...``: a job's events, live.

The server pushes JSON text messages:

* ``{"type": "status", "job": JobView}`` first, on every state change, and right after the
  event that changes the job's ``progress.faults`` (a failure incident opened) or
  ``progress.recoveries`` (one recovered; ``progress.last_downtime_s`` then holds its
  downtime, s) — the fold of :mod:`hyperpod_lab.facts`, so a client notifies from the
  server's count instead of counting events itself;
* ``{"type": "event", "event": Event, "cursor": str}`` for each event after ``cursor``
  (history first, then live); reconnecting with the last ``cursor`` resumes with no loss and
  no duplicates;
* ``{"type": "end"}`` once the job is terminal and every event was sent; then the server closes.

All tabs share the job's one :class:`~hyperpod_lab.server.watcher.Tailer`; a socket only holds
its own cursor. Authentication is jupyter-server's (token, cookie, identity provider):
``@ws_authenticated`` on ``get`` and the ``execute`` permission on the ``hyperpod`` resource.
"""

from __future__ import annotations

import json

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web, websocket

from hyperpod_lab.errors import HyperPodLabError
from hyperpod_lab.server.handlers import AUTH_RESOURCE, error_body, status_of
from hyperpod_lab.server.watcher import decode_cursor


class StreamHandler(WebSocketMixin, JupyterHandler, websocket.WebSocketHandler):
    """One browser tab's (or notebook's) subscription to one job's events."""

    auth_resource = AUTH_RESOURCE

    @property
    def hp(self):
        return self.settings["hyperpod_lab"]

    async def pre_get(self) -> None:
        user = self.current_user
        # reading a job's events, as GET .../events does: the same 'read' action
        allowed = await ensure_async(self.authorizer.is_authorized(self, user, "read", AUTH_RESOURCE))
        if not allowed:
            raise web.HTTPError(403)

    @ws_authenticated
    async def get(self, job_id: str):
        await self.pre_get()
        self.job_id = job_id
        try:  # bad input answers before the upgrade, as the REST handlers would
            self.cursor = decode_cursor(self.get_query_argument("cursor", None))
            self.hp.client.get(job_id)
        except HyperPodLabError as e:
            self.set_status(status_of(e) or 400)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(error_body(e)))
            return
        res = super().get(job_id)
        if res is not None:
            await res

    async def open(self, job_id: str):  # type: ignore[override]
        super().open(job_id)
        self.sub = None
        self.sub = await self.hp.watcher.subscribe(job_id, self.cursor, self._send)

    def _send(self, message: dict) -> bool:
        if self.ws_connection is None or self.ws_connection.is_closing():
            return False
        try:
            self.write_message(json.dumps(message, default=str))
        except websocket.WebSocketClosedError:
            return False
        if message.get("type") == "end":
            self.close()
        return True

    def on_message(self, message):  # the client only listens
        pass

    def on_close(self):
        sub = getattr(self, "sub", None)
        if sub is not None:
            self.hp.watcher.unsubscribe(sub)
