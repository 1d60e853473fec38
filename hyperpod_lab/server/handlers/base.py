"""The base of every REST handler under ``<base_url>hyperpod/``: authentication, authorization,
JSON bodies and the one mapping of domain errors to HTTP statuses.

Thin: each handler parses its input, calls the core (``Client``) or the :class:`Watcher` and
writes JSON. Every method is ``@tornado.web.authenticated`` and ``@authorized`` on the
``hyperpod`` auth resource; POSTs need jupyter-server's XSRF token. Domain errors become HTTP
statuses in one place, :meth:`HyperPodHandler.write_error`, with the body
``{"error": {"type", "message", "field"?}}``.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.base.handlers import APIHandler

from hyperpod_lab.errors import (
    ClusterUnreachable,
    ConfigError,
    EnvironmentMismatch,
    HostKeyError,
    HyperPodLabError,
    JobStateError,
    NotAllowed,
    RemoteCommandError,
    SpecError,
    UnknownCluster,
    UnknownJob,
)
from hyperpod_lab.server.redact import redact

AUTH_RESOURCE = "hyperpod"
MAX_EVENTS = 10000
EVENT_PAGE_BYTES_PER_EVENT = 1024  # bytes read per event asked for (of each file), for GET events
EVENT_PAGE_MAX_BYTES = 4 << 20  # most bytes GET events reads of one file
MAX_LOG_BYTES = 4 << 20  # most bytes of a log one GET logs returns
MAX_OFFSET = 1 << 62

#: domain error -> HTTP status (the one mapping; the first matching class wins)
STATUS_OF: list[tuple[type, int]] = [
    (SpecError, 400), (ConfigError, 400), (NotAllowed, 403),
    (UnknownCluster, 404), (UnknownJob, 404),
    (JobStateError, 409), (EnvironmentMismatch, 409),
    (ClusterUnreachable, 502), (HostKeyError, 502), (RemoteCommandError, 502),
    (TimeoutError, 504),
    (HyperPodLabError, 500),
]


def status_of(error: BaseException) -> int | None:
    for cls, code in STATUS_OF:
        if isinstance(error, cls):
            return code
    return None


def error_body(error: BaseException) -> dict[str, Any]:
    body: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if isinstance(error, SpecError):
        body["field"] = error.field
    return {"error": body}


class HyperPodHandler(APIHandler):
    """Base of every REST handler: the shared objects, JSON I/O and the error mapping."""

    auth_resource = AUTH_RESOURCE

    @property
    def hp(self):
        """The :class:`hyperpod_lab.server.HyperPodApp` built at extension load."""
        return self.settings["hyperpod_lab"]

    def json_body(self) -> Any:
        """The request body as JSON. Raises SpecError("body") when it is not JSON."""
        try:
            return json.loads(self.request.body or b"{}")
        except (ValueError, UnicodeDecodeError) as e:
            raise SpecError("body", f"is not valid JSON ({e})") from None
        except RecursionError:
            raise SpecError("body", "is nested too deeply to be a request") from None

    def int_arg(self, name: str, default: int | None = None, low: int = 0, high: int | None = None) -> int | None:
        raw = self.get_query_argument(name, None)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise SpecError(name, f"must be a whole number, got {raw!r}") from None
        if value < low or (high is not None and value > high):
            raise SpecError(name, f"must be between {low} and {high if high is not None else 'any'}, got {value}")
        return value

    def reply(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload, default=str))

    def log_exception(self, typ, value, tb):
        if value is not None and status_of(value) is not None and status_of(value) < 500:
            self.log.info("hyperpod_lab: %s %s -> %s: %s", self.request.method, redact(self.request.uri),
                          status_of(value), value)
            return
        super().log_exception(typ, value, tb)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        code = status_of(exc) if exc is not None else None
        if code is None:
            return super().write_error(status_code, **kwargs)
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(error_body(exc)))
