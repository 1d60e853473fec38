"""``WS <base_url>hyperpod/jobs/{id}/stream?cursor=...``: a job's events, live.

The server pushes JSON text messages:

* ``{"type": "status", "job": JobView}`` first, on every state change, and right after the
  event that changes the job's ``progress.faults`` (a failure incident opened),
  ``progress.recoveries`` (one recovered; ``progress.last_downtime_s`` then holds its
  downtime, s), ``progress.excluded_nodes`` (a node excluded) or the nodes whose pre-flight
  health checks failed (``progress.health``) — the fold of :mod:`hyperpod_lab.fold.facts`, so a
  client notifies from the server's count instead of counting events itself;
* ``{"type": "event", "event": Event, "cursor": str}`` for each event after ``cursor``
  (history first, then live); reconnecting with the last ``cursor`` resumes with no loss and
  no duplicates (after a crash of the server, a big job's cursor may give the last 0.5 s of
  events again: :mod:`hyperpod_lab.server.cursors`). A cursor is at most 2 KiB whatever the
  rank count (a short token of the server's cursor store for a job of more than 32 event
  files), so each message is of bounded size too;
* ``{"type": "end"}`` once the job is terminal and every event was sent; then the server closes.

All tabs share the job's one :class:`~hyperpod_lab.server.watch.tailer.Tailer`; a socket only holds
its own cursor and its send queue. History is replayed in pages, each written only after the
queue drained below half its cap (``Watcher.send_queue_bytes``); messages are written one at a
time, each after tornado flushed the one before (its write future), so a client that does not
read holds at most the cap here. One that stays at the cap for ``Watcher.stall_timeout_s`` is
closed with code 4008 and a reason starting ``slow consumer``; it reconnects with its last
``cursor`` and loses nothing. Beyond ``Watcher.max_subscribers`` sockets on one job, the upgrade
is answered 429 (``{"error": {"type": "TooManySubscribers", ...}}``), or a socket already
opened is closed with code 1013 and the reason. Authentication is jupyter-server's (token, cookie, identity provider):
``@ws_authenticated`` on ``get`` and the ``execute`` permission on the ``hyperpod`` resource.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web, websocket

from hyperpod_lab.errors import HyperPodLabError
from hyperpod_lab.server.handlers.base import AUTH_RESOURCE, error_body, status_of
from hyperpod_lab.server.watch.tailer import TooManySubscribers

CLOSE_SLOW = 4008  # closed: stayed over the send queue's cap (reconnect with the last cursor)
CLOSE_TOO_MANY = 1013  # "try again later": the job has the most subscribers the server takes


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
            self.hp.client.get(job_id)
            # the old form, or a token of this server's cursor store (bounded: server/cursors.py)
            self.cursor = self.hp.watcher.cursors.resolve(job_id, self.get_query_argument("cursor", None))
            watcher = self.hp.watcher
            if watcher.subscribers(job_id) >= watcher.max_subscribers:
                raise TooManySubscribers(f"job {job_id} has {watcher.subscribers(job_id)} subscribers, the most "
                                         f"this server takes; close a tab or reconnect later")
        except HyperPodLabError as e:
            self.set_status(429 if isinstance(e, TooManySubscribers) else (status_of(e) or 400))
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(error_body(e)))
            return
        res = super().get(job_id)
        if res is not None:
            await res

    async def open(self, job_id: str):  # type: ignore[override]
        super().open(job_id)
        self.sub = None
        self._queue: deque[str] = deque()
        self._queued = 0  # bytes in _queue plus the one message being written
        self._wake = asyncio.Event()
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        try:
            self.sub = await self.hp.watcher.subscribe(job_id, self.cursor, self._send, pending=self._pending,
                                                       close=self._close_slow)
        except TooManySubscribers as e:
            self.close(CLOSE_TOO_MANY, _reason(str(e)))

    def _pending(self) -> int:
        """Bytes handed to this socket and not yet flushed by tornado."""
        return self._queued

    def _send(self, message: dict) -> bool:
        """Queue one message (the watcher holds back while :meth:`_pending` is at its cap)."""
        if self.ws_connection is None or self.ws_connection.is_closing():
            return False
        text = json.dumps(message, default=str)
        self._queue.append(text)
        self._queued += len(text)
        self._wake.set()
        return True

    async def _write_loop(self) -> None:
        """Write queued messages one at a time, each after the one before was flushed."""
        try:
            while True:
                if not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                text = self._queue.popleft()
                try:
                    await self.write_message(text)
                except (websocket.WebSocketClosedError, asyncio.CancelledError):
                    return
                finally:
                    self._queued -= len(text)
                if text.startswith('{"type": "end"'):
                    self.close()
                    return
        except asyncio.CancelledError:
            return

    def _close_slow(self, reason: str) -> None:
        self.close(CLOSE_SLOW, _reason(reason))

    def on_message(self, message):  # the client only listens
        pass

    def on_close(self):
        sub = getattr(self, "sub", None)
        if sub is not None:
            self.hp.watcher.unsubscribe(sub)
        writer = getattr(self, "_writer", None)
        if writer is not None and not writer.done():
            writer.cancel()
        if getattr(self, "_queue", None) is not None:
            self._queue.clear()


def _reason(text: str) -> str:
    """A WebSocket close reason: at most 123 bytes of UTF-8."""
    data = text.encode()
    return data[:123].decode(errors="ignore") if len(data) > 123 else text
