"""A webhook receiver on loopback for the alert tests (test helper, not product code): a real
``http.server`` in a thread that records every POST and answers with the next status of a
script (then 200)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "T0TESTSECRET/B0TESTSECRET/xoxTESTWEBHOOKTOKEN1234567890"
"""The secret part of the receiver's URL (what a Slack incoming webhook's path is)."""


class Receiver:
    """``url`` takes POSTs at ``/services/<TOKEN>``; ``answers`` is consumed one per POST (then
    200). ``posts``: every request as ``(status answered, path, headers, body bytes)``."""

    def __init__(self, answers: list[int] | None = None):
        self.answers = list(answers or [])
        self.posts: list[tuple[int, str, dict, bytes]] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with owner.lock:
                    status = owner.answers.pop(0) if owner.answers else 200
                    owner.posts.append((status, self.path, dict(self.headers), body))
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"try again")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/services/{TOKEN}"

    def delivered(self) -> list[str]:
        """Texts of the messages answered 200 (``{"text": ...}`` bodies)."""
        with self.lock:
            return [json.loads(b)["text"] for s, _, _, b in self.posts if s == 200]

    def statuses(self) -> list[int]:
        with self.lock:
            return [s for s, _, _, _ in self.posts]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
