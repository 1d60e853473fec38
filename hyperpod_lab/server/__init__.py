"""hyperpod-lab's jupyter-server extension: REST and WebSocket under ``<base_url>hyperpod/``.

:func:`setup` builds the domain objects once (a :class:`~hyperpod_lab.submit.client.Client` over the
durable JobStore and one :class:`~hyperpod_lab.server.watch.watcher.Watcher`), keeps them in
``web_app.settings["hyperpod_lab"]`` and registers the handlers. The API is described in
``docs/openapi.yaml``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from jupyter_server.utils import url_path_join

from hyperpod_lab.server import redact
from hyperpod_lab.server.watch.watcher import Watcher
from hyperpod_lab.submit.client import Client


@dataclass
class HyperPodApp:
    """What the handlers share: the core client, the watcher, the server's root directory."""

    client: Client
    watcher: Watcher
    root_dir: str


def watcher_settings(server_app) -> dict:
    """The :class:`Watcher` arguments set in Jupyter's config under ``HyperPodLab`` (e.g.
    ``{"HyperPodLab": {"send_queue_bytes": 1048576, "max_subscribers": 64}}`` in
    ``jupyter_server_config.json``), each converted to its default's type; others are ignored."""
    import inspect

    given = dict((getattr(server_app, "config", None) or {}).get("HyperPodLab", {}) or {})
    params = inspect.signature(Watcher.__init__).parameters
    out = {}
    for key, value in given.items():
        p = params.get(key)
        if p is None or key in ("self", "client"):
            server_app.log.warning("hyperpod_lab: unknown setting HyperPodLab.%s ignored", key)
            continue
        out[key] = type(p.default)(value)
    return out


def setup(server_app) -> HyperPodApp:
    """Build the extension's objects and register its routes on ``server_app.web_app``."""
    from hyperpod_lab.server.handlers import handlers

    web_app = server_app.web_app
    redact.install(server_app.log)  # before anything of ours logs
    client = Client()
    watcher = Watcher(client, **watcher_settings(server_app))
    root_dir = os.path.abspath(os.path.expanduser(getattr(server_app, "root_dir", None) or os.getcwd()))
    app = HyperPodApp(client=client, watcher=watcher, root_dir=root_dir)
    web_app.settings["hyperpod_lab"] = app
    base_url = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base_url, path), cls) for path, cls in handlers()])
    try:
        asyncio.get_running_loop()
        watcher.start()
    except RuntimeError:  # no loop yet: start with the server's IOLoop
        from tornado.ioloop import IOLoop

        IOLoop.current().add_callback(watcher.start)
    server_app.log.info("hyperpod_lab: API at %s (job store %s)", url_path_join(base_url, "hyperpod"),
                        client.store.path)
    return app
