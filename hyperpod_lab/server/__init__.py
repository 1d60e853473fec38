"""hyperpod-lab's jupyter-server extension: REST and WebSocket under ``<base_url>hyperpod/``.

:func:`setup` builds the domain objects once (a :class:`~hyperpod_lab.submit.client.Client` over the
durable JobStore and one :class:`~hyperpod_lab.server.watch.watcher.Watcher`), keeps them in
``web_app.settings["hyperpod_lab"]`` and registers the handlers. The API is described in
``docs/openapi.yaml``. The watcher also feeds the extension's Prometheus metrics on the server's
``/metrics`` (:mod:`hyperpod_lab.server.metrics`, ``docs/metrics.md``) and the user's alert rules
(:mod:`hyperpod_lab.server.alerts`, ``docs/alerts.md``).
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass, field

from jupyter_server.utils import url_path_join
from traitlets import Bool, Float, List, TraitError, Unicode, validate
from traitlets.config import Config, LoggingConfigurable

from hyperpod_lab.server import redact
from hyperpod_lab.server.alerts import Alerts, setup_alerts
from hyperpod_lab.server.metrics import ServerMetrics, server_metrics
from hyperpod_lab.server.queue import QueueCache
from hyperpod_lab.server.watch.watcher import Watcher
from hyperpod_lab.submit.client import Client

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class HyperPodLab(LoggingConfigurable):
    """The server extension's settings (trust, metrics, alerts), read from Jupyter's config under ``HyperPodLab``
    (``jupyter_server_config.json``/``.py`` or ``--HyperPodLab.<name>=...``). The same section
    also holds the :class:`Watcher` arguments (:func:`watcher_settings`)."""

    secret_env_allowlist = List(Unicode(), default_value=[], help="""
        Names of this server's environment variables that a REST submission (``POST
        hyperpod/jobs``) may pass to a job as ``secret_env``; the job then gets their values
        from the server's environment (on every backend: local, Slurm, EKS). Default empty:
        no ``secret_env`` over REST (403 NotAllowed naming the variable and this setting),
        because the caller of the REST API need not be the server's owner and would otherwise
        read the server's own credentials (e.g. AWS_SECRET_ACCESS_KEY) from inside a job.
        Submissions from a notebook kernel or the CLI (the magics, ``Client``) are not
        affected: there ``secret_env`` comes from the submitting process's own environment.
        Example: ``c.HyperPodLab.secret_env_allowlist = ["HF_TOKEN", "WANDB_API_KEY"]``.
        """).tag(config=True)

    alerts_file = Unicode("", help="""
        The user's notification rules and webhook (TOML, ``docs/alerts.md``). Empty (default):
        ``alerts.toml`` beside the cluster config file. No file: no alerts.
        """).tag(config=True)

    metrics = Bool(True, help="""
        Add the extension's metrics (jobs by state, fault-detection latency, recovery downtime,
        event lag, status poll time; ``docs/metrics.md``) to the server's ``/metrics``.
        """).tag(config=True)

    queue_interval_s = Float(10.0, min=1.0, help="""
        Seconds between two snapshots of a cluster's queue (one squeue and one sinfo, shared by
        every tab; ``docs/queue.md``).
        """).tag(config=True)

    @validate("secret_env_allowlist")
    def _valid_names(self, proposal):
        bad = [n for n in proposal["value"] if not _ENV_NAME.fullmatch(n)]
        if bad:
            raise TraitError(f"HyperPodLab.secret_env_allowlist: {bad!r} are not environment variable names "
                             "(letters, digits and _, not starting with a digit)")
        return proposal["value"]


def trust_settings(server_app) -> HyperPodLab:
    """The :class:`HyperPodLab` settings of ``server_app``'s config (its traits only: the other
    keys of the section are the watcher's). Raises TraitError for a malformed value."""
    section = (getattr(server_app, "config", None) or {}).get("HyperPodLab", {}) or {}
    mine = {k: v for k, v in section.items() if k in HyperPodLab.class_trait_names(config=True)}
    return HyperPodLab(config=Config({"HyperPodLab": mine}), log=server_app.log)


@dataclass
class HyperPodApp:
    """What the handlers share: the core client, the watcher, the server's root directory, and the
    names :attr:`HyperPodLab.secret_env_allowlist` lets a REST submission pass as ``secret_env``."""

    client: Client
    watcher: Watcher
    root_dir: str
    secret_env_allowlist: frozenset[str] = field(default_factory=frozenset)
    metrics: ServerMetrics | None = None
    alerts: Alerts | None = None
    queue: QueueCache | None = None


def watcher_settings(server_app) -> dict:
    """The :class:`Watcher` arguments set in Jupyter's config under ``HyperPodLab`` (e.g.
    ``{"HyperPodLab": {"send_queue_bytes": 1048576, "max_subscribers": 64}}`` in
    ``jupyter_server_config.json``), each converted to its default's type; others are ignored."""
    import inspect

    given = dict((getattr(server_app, "config", None) or {}).get("HyperPodLab", {}) or {})
    params = inspect.signature(Watcher.__init__).parameters
    out = {}
    for key, value in given.items():
        if key in HyperPodLab.class_trait_names(config=True):
            continue  # a trust setting (trust_settings)
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
    trust = trust_settings(server_app)
    client = Client()
    watcher = Watcher(client, **watcher_settings(server_app))
    root_dir = os.path.abspath(os.path.expanduser(getattr(server_app, "root_dir", None) or os.getcwd()))
    metrics = server_metrics() if trust.metrics else None
    if metrics is not None:
        watcher.observers.append(metrics)
    alerts = setup_alerts(trust.alerts_file or None, watcher)
    app = HyperPodApp(client=client, watcher=watcher, root_dir=root_dir,
                      secret_env_allowlist=frozenset(trust.secret_env_allowlist), metrics=metrics, alerts=alerts,
                      queue=QueueCache(watcher, trust.queue_interval_s))
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
