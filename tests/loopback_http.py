"""A real HTTP server on loopback for tests (test helper, not product code): ``http.server``'s
``ThreadingHTTPServer`` on ``127.0.0.1`` (a free port) in a daemon thread, every request of the
given methods answered by a function. Used by the alert tests' webhook receiver
(``tests/server/webhook_receiver.py``) and the heal transport's hostile peer
(``tests/runtime/test_heal_transport.py``)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class LoopbackHTTP:
    """Serve ``answer(request)`` for every request whose method is in ``methods``.

    Args:
        answer: called in a server thread with the ``BaseHTTPRequestHandler`` of the request
            (``.path``, ``.headers``, ``.rfile`` for a body); returns ``(status, content type,
            body bytes)``, sent as the response.
        methods: HTTP methods answered (others get ``http.server``'s 501).

    Attributes:
        port: the TCP port on 127.0.0.1 it listens on.
    """

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler], tuple[int, str, bytes]],
                 methods: tuple[str, ...] = ("GET",)):
        def respond(handler: BaseHTTPRequestHandler) -> None:
            status, content_type, body = answer(handler)
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.end_headers()
            handler.wfile.write(body)

        handler = type("Handler", (BaseHTTPRequestHandler,),
                       {**{f"do_{m}": respond for m in methods}, "log_message": lambda self, *args: None})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving and close the listening socket."""
        self.server.shutdown()
        self.server.server_close()
