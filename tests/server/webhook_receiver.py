"""A webhook receiver on loopback for the alert tests (test helper, not product code): a real
``http.server`` in a thread that records every POST and answers with the next status of a
script (then 200)."""

from __future__ import annotations

import json
import threading

from loopback_http import LoopbackHTTP

TOKEN = "T0TESTSECRET/B0TESTSECRET/xoxTESTWEBHOOKTOKEN1234567890"
"""The secret part of the receiver's URL (what a Slack incoming webhook's path is)."""


class Receiver(LoopbackHTTP):
    """``url`` takes POSTs at ``/services/<TOKEN>``; ``answers`` is consumed one per POST (then
    200). ``posts``: every request as ``(status answered, path, headers, body bytes)``."""

    def __init__(self, answers: list[int] | None = None):
        self.answers = list(answers or [])
        self.posts: list[tuple[int, str, dict, bytes]] = []
        self.lock = threading.Lock()

        def answer(request) -> tuple[int, str, bytes]:
            body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
            with self.lock:
                status = self.answers.pop(0) if self.answers else 200
                self.posts.append((status, request.path, dict(request.headers), body))
            return status, "text/plain", b"ok" if status == 200 else b"try again"

        super().__init__(answer, methods=("POST",))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/services/{TOKEN}"

    def delivered(self) -> list[str]:
        """Texts of the messages answered 200 (``{"text": ...}`` bodies)."""
        with self.lock:
            return [json.loads(b)["text"] for s, _, _, b in self.posts if s == 200]

    def statuses(self) -> list[int]:
        with self.lock:
            return [s for s, _, _, _ in self.posts]
