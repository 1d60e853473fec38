"""Secrets never reach a log line (issue 13, finding 6).

jupyter-server scrubs ``?token=`` from its own access log, but other lines (ours included: a
4xx logs the request URI) printed it raw. :class:`RedactingFilter` rewrites every record that
passes through the server's log handlers: query parameters that carry credentials (``token``,
``auth``, ``key``, ``code``, ``state``, ``xsrf``, ``_xsrf``, ``password``, ``secret``) and
``Authorization`` header values become ``[secret]``. One exception, by design: jupyter-server's
start-up banner ("... is running at", "copy and paste one of these URLs"), which hands a
generated token to the person who started the server.
"""

from __future__ import annotations

import logging
import re

SECRET = "[secret]"
_PARAM = re.compile(r"(?i)(?<![A-Za-z0-9_])((?:_?xsrf|token|auth|key|code|state|password|secret|access_token)=)"
                    r"[^&\s\"'#;,)]+")
_BANNER = ("is running at", "copy and paste one of these URLs", "open this file in a browser")
_HEADER = re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?(?:token|bearer|basic)?\s*)[^\s'\",}]+")


_LITERALS: set[str] = set()  # secrets known by value (add_secret), e.g. a webhook URL


def add_secret(value: str) -> None:
    """Have :func:`redact` replace every occurrence of ``value`` (e.g. a webhook URL, whose path
    is its credential) by :data:`SECRET`. Values under 8 characters are refused (ValueError): they
    would blank out ordinary words."""
    if len(value) < 8:
        raise ValueError("a secret to redact must have at least 8 characters")
    _LITERALS.add(value)


def redact(text: str) -> str:
    """``text`` with credential query parameters, Authorization values and the secrets given to
    :func:`add_secret` replaced by :data:`SECRET` (``GET /x?token=abc&limit=1`` ->
    ``GET /x?token=[secret]&limit=1``)."""
    for s in sorted(_LITERALS, key=len, reverse=True):  # a URL before its path
        if s in text:
            text = text.replace(s, SECRET)
    return _HEADER.sub(lambda m: m.group(1) + SECRET, _PARAM.sub(lambda m: m.group(1) + SECRET, text))


class RedactingFilter(logging.Filter):
    """Rewrites each record's formatted message with :func:`redact` (never drops a record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler's own error path
            return True
        if any(b in message for b in _BANNER):
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def install(*loggers: logging.Logger) -> RedactingFilter:
    """Attach one filter to every handler of ``loggers``, of the root logger and of tornado's
    loggers (a filter on a handler sees records propagated from child loggers too)."""
    flt = RedactingFilter()
    targets = [*loggers, logging.getLogger(), *(logging.getLogger(n) for n in
                                                 ("tornado.access", "tornado.application", "tornado.general"))]
    for lg in targets:
        lg.addFilter(flt)
        for h in lg.handlers:
            if flt not in h.filters:
                h.addFilter(flt)
    return flt
