"""Alerts when away (issue 29, item 3): the user's notification rules, evaluated by the Jupyter
server over the job facts fold, sent to an outgoing webhook (Slack-compatible JSON).

The rules live in one TOML file, ``c.HyperPodLab.alerts_file`` (default ``alerts.toml`` beside
the cluster config, ``$HYPERPOD_LAB_CONFIG``'s directory or ``~/.config/hyperpod-lab/``)::

    [webhook]
    url_env = "HYPERPOD_LAB_WEBHOOK_URL"   # the server's environment variable holding the URL, or
    # url = "https://hooks.slack.com/services/T000/B000/XXXX"   (then keep the file mode 0600)
    timeout_s = 10        # one POST's timeout (s)
    retries = 5           # retries of a failed POST (HTTP 5xx, 408, 429, no answer); 4xx: none
    backoff_s = 1.0       # first retry after this (s), doubling, at most max_backoff_s
    max_backoff_s = 60.0
    queue = 100           # alerts waiting to be sent, at most (more wait for the next evaluation)

    [[rules]]
    on = "job_failed"                      # the job ended in state 'failed'

    [[rules]]
    on = "fault"                           # a failure incident opened
    clusters = ["hp-slurm"]                # optional: only these cluster profiles

    [[rules]]
    on = "slow_recovery"
    seconds = 300                          # an incident still down (or recovered) after this

    [[rules]]
    on = "low_goodput"
    percent = 80                           # a finished job's goodput below this

    [[rules]]
    on = "straggler"                       # a rank flagged as a straggler

A cluster profile may send its jobs' alerts elsewhere: ``alerts_webhook_url_env = "NAME"`` in
its ``[clusters.X]`` table names an environment variable of the Jupyter server that holds the
URL (:func:`profile_webhook_url`); that cluster's alerts go there instead of ``[webhook]``'s
(which stays required: the other clusters' URL, and the timeouts and retries of every POST). The
profile is read when an alert is sent, so a changed clusters.toml applies without a restart; a
variable that is not set fails that alert (logged, naming the variable and the fix).

Each rule may have a ``name`` (default: its ``on``); two rules need two names. An alert is one
rule and one occurrence (a job, an incident, a flagged rank): it is sent once. What was sent is
kept in ``alerts-sent.json`` in the data directory (``$HYPERPOD_LAB_DATA_DIR``), so a restarted
server sends nothing twice; occurrences before the file was first made (the server's first start
with rules) are never sent. A POST that failed is retried ``retries`` times with exponential
backoff; then the alert is recorded as failed and not sent again. A POST that timed out after the
receiver took it is retried too: such a receiver can get a message twice.

A webhook URL (its path is the credential; the file's or a profile's) is never logged nor written anywhere: it is given
to :func:`hyperpod_lab.server.redact.add_secret`, so every log line through the server's handlers
shows ``[secret]`` instead, and no error message of this module contains it. Messages carry
the job's name, id, cluster and the numbers of the rule, never its spec, environment or logs; a
scheduler's reason is passed through :func:`~hyperpod_lab.server.redact.redact`.

Everything blocking (the POSTs, their backoff, writing the sent file) runs in one daemon thread,
never on the IOLoop; the watcher's hooks (``on_status``, ``after_fold``) only evaluate the rules
over facts already in memory and put alerts in the bounded queue.

The open Lab shows the same alerts as JupyterLab notifications: every alert queued for the webhook
is also kept, numbered, in memory (the newest :data:`MAX_FIRED`), and ``GET hyperpod/alerts?after=N``
(:meth:`Alerts.fired_after`) answers those after number ``N``; the Lab remembers the keys it showed,
so each is shown once.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import stat
import threading
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from hyperpod_lab.atomicfile import write_atomic
from hyperpod_lab.errors import ConfigError
from hyperpod_lab.server import redact
from hyperpod_lab.submit.clusters import config_path, data_dir, get_profile, load_profiles
from hyperpod_lab.submit.jobs import JobStatus

log = logging.getLogger("hyperpod_lab.server")

RULE_KINDS = ("job_failed", "fault", "slow_recovery", "low_goodput", "straggler")
SENT_FILE = "alerts-sent.json"
MAX_SENT = 10000  # alerts remembered; older ones move the start time (state["since"]) past them
MAX_TEXT = 1000   # characters of one message
MAX_FIRED = 200   # fired alerts kept in memory for the Lab (GET hyperpod/alerts)
_NO_RETRY = frozenset(range(400, 500)) - {408, 429}


def default_path() -> str:
    """``alerts.toml`` beside the cluster config file."""
    return os.path.join(os.path.dirname(config_path()), "alerts.toml")


@dataclass
class Rule:
    """One notification rule. ``on``: one of :data:`RULE_KINDS`; ``seconds`` (slow_recovery, s),
    ``percent`` (low_goodput, 0-100); ``clusters``: only these profiles (None: all)."""

    name: str
    on: str
    seconds: float | None = None
    percent: float | None = None
    clusters: tuple[str, ...] | None = None

    def applies(self, cluster: str) -> bool:
        return self.clusters is None or cluster in self.clusters


@dataclass
class Webhook:
    """Where and how alerts go. ``url`` is secret: never logged, never in an error."""

    url: str = field(repr=False)
    timeout_s: float = 10.0
    retries: int = 5
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    queue: int = 100


@dataclass
class AlertSettings:
    """The alerts file: its rules and webhook."""

    path: str
    rules: list[Rule]
    webhook: Webhook


def _bad(path: str, what: str) -> ConfigError:
    return ConfigError(f"alerts file {path}: {what} (see docs/alerts.md)")


def _number(path: str, where: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise _bad(path, f"{where} must be a number from {lo:g} to {hi:g}, not {value!r}")
    return float(value)


def _is_webhook_url(url: str) -> bool:
    """Whether ``url`` (stripped) is an http(s) URL with a host."""
    parts = urlsplit(url.strip())
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _check_url(path: str, url: Any, source: str) -> str:
    if not isinstance(url, str):
        raise _bad(path, f"{source} must be a string")
    if not _is_webhook_url(url):
        # the value is not shown: it may hold the credential
        raise _bad(path, f"{source} is not an http(s) URL with a host (value not shown)")
    return url.strip()


def load_settings(path: str | None = None, environ: dict[str, str] | None = None) -> AlertSettings | None:
    """Read the alerts file at ``path`` (default :func:`default_path`).

    Returns:
        the settings, or None when the file does not exist (alerts off).

    Raises:
        ConfigError: unreadable TOML, an unknown rule kind or key, a missing threshold, no
            webhook URL, or ``url_env`` naming an unset variable; the message names the file,
            the field and the fix, never the URL's value.
    """
    path = os.path.abspath(os.path.expanduser(path or default_path()))
    environ = os.environ if environ is None else environ
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        return None
    except tomllib.TOMLDecodeError as e:
        raise _bad(path, f"not valid TOML ({e})") from None
    except OSError as e:
        raise _bad(path, f"cannot be read ({e.strerror})") from None
    unknown = set(doc) - {"webhook", "rules"}
    if unknown:
        raise _bad(path, f"unknown section(s) {sorted(unknown)}: only [webhook] and [[rules]]")
    wh = doc.get("webhook")
    if not isinstance(wh, dict):
        raise _bad(path, "no [webhook] section: set url_env (or url) there")
    keys = {"url", "url_env", "timeout_s", "retries", "backoff_s", "max_backoff_s", "queue"}
    if set(wh) - keys:
        raise _bad(path, f"[webhook] has unknown key(s) {sorted(set(wh) - keys)}; known: {sorted(keys)}")
    if ("url" in wh) == ("url_env" in wh):
        raise _bad(path, "[webhook] needs exactly one of url_env (an environment variable's name) and url")
    if "url_env" in wh:
        name = wh["url_env"]
        if not isinstance(name, str) or not name or name not in environ:
            raise _bad(path, f"[webhook] url_env: the environment variable {name!r} is not set in the Jupyter "
                             "server's environment; export it before starting the server")
        url = _check_url(path, environ[name], f"the environment variable {name}")
    else:
        url = _check_url(path, wh["url"], "[webhook] url")
        try:
            if os.stat(path).st_mode & (stat.S_IRGRP | stat.S_IROTH):
                log.warning("hyperpod_lab: %s holds a webhook URL and other users can read it: chmod 600 it, "
                            "or use url_env", path)
        except OSError:
            pass
    hook = Webhook(url=url,
                   timeout_s=_number(path, "[webhook] timeout_s", wh.get("timeout_s", 10.0), 0.1, 300),
                   retries=int(_number(path, "[webhook] retries", wh.get("retries", 5), 0, 20)),
                   backoff_s=_number(path, "[webhook] backoff_s", wh.get("backoff_s", 1.0), 0.0, 3600),
                   max_backoff_s=_number(path, "[webhook] max_backoff_s", wh.get("max_backoff_s", 60.0), 0.0, 3600),
                   queue=int(_number(path, "[webhook] queue", wh.get("queue", 100), 1, 100000)))
    raw = doc.get("rules", [])
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise _bad(path, "rules must be [[rules]] tables")
    rules: list[Rule] = []
    for i, r in enumerate(raw):
        where = f"rule {i + 1}"
        on = r.get("on")
        if on not in RULE_KINDS:
            raise _bad(path, f"{where}: on = {on!r}; one of {list(RULE_KINDS)}")
        allowed = {"name", "on", "clusters"} | ({"seconds"} if on == "slow_recovery" else set()) | (
            {"percent"} if on == "low_goodput" else set())
        if set(r) - allowed:
            raise _bad(path, f"{where} ({on}): unknown key(s) {sorted(set(r) - allowed)}; known: {sorted(allowed)}")
        name = r.get("name", on)
        if not isinstance(name, str) or not name or "|" in name:
            raise _bad(path, f"{where}: name must be a non-empty string without '|'")
        if any(x.name == name for x in rules):
            raise _bad(path, f"{where}: a second rule named {name!r}; give each rule its own name")
        clusters = r.get("clusters")
        if clusters is not None and (not isinstance(clusters, list) or not all(isinstance(c, str) for c in clusters)):
            raise _bad(path, f"{where}: clusters must be a list of cluster profile names")
        seconds = percent = None
        if on == "slow_recovery":
            if "seconds" not in r:
                raise _bad(path, f"{where} (slow_recovery): set seconds, the longest acceptable downtime")
            seconds = _number(path, f"{where} seconds", r["seconds"], 0, 30 * 86400)
        if on == "low_goodput":
            if "percent" not in r:
                raise _bad(path, f"{where} (low_goodput): set percent, the lowest acceptable goodput (0-100)")
            percent = _number(path, f"{where} percent", r["percent"], 0, 100)
        rules.append(Rule(name=name, on=on, seconds=seconds, percent=percent,
                          clusters=tuple(clusters) if clusters is not None else None))
    return AlertSettings(path=path, rules=rules, webhook=hook)


# ---- the rules over the facts -------------------------------------------------------------
def _hide(url: str) -> None:
    """Have every log line through the redacting filter show ``[secret]`` for ``url`` and for
    its path and query (the credential), wherever they appear."""
    redact.add_secret(url)
    parts = urlsplit(url)
    secret_part = parts.path + ("?" + parts.query if parts.query else "")
    if len(secret_part) >= 8:
        redact.add_secret(secret_part)


def profile_webhook_url(cluster: str, environ: dict[str, str] | None = None) -> str | None:
    """The webhook URL a cluster profile gives its jobs' alerts: the value of the server's
    environment variable named by the profile's ``alerts_webhook_url_env``; None when the
    profile sets none (or there is no such profile: ``[webhook]``'s URL applies). The URL is
    given to the redactor before it is returned.

    Raises:
        ConfigError: the variable is not set, or holds no http(s) URL; the message names the
            cluster, the variable and the fix, never the value.
    """
    try:
        prof = get_profile(cluster)
    except Exception:  # UnknownCluster, a malformed config: the file's URL
        return None
    name = getattr(prof, "alerts_webhook_url_env", None)
    if not name:
        return None
    environ = os.environ if environ is None else environ
    where = f"cluster profile '{cluster}' in {config_path()}"
    if not environ.get(name):
        raise ConfigError(f"{where}: alerts_webhook_url_env names {name}, which is not set in the Jupyter server's "
                          f"environment; export it before starting the server, or remove the setting")
    if not _is_webhook_url(environ[name]):
        raise ConfigError(f"{where}: the environment variable {name} (alerts_webhook_url_env) is not an http(s) URL "
                          f"with a host (value not shown)")
    url = environ[name].strip()
    _hide(url)
    return url


@dataclass
class Alert:
    """One occurrence of one rule: ``key`` (``rule|job|what``, the dedupe key), the message
    ``text``, ``at`` (epoch s: when it occurred) and the job's ``cluster`` (whose profile may
    name its own webhook; "" for none)."""

    key: str
    text: str
    at: float
    cluster: str = ""


def _get(facts: Any, name: str, default: Any = None) -> Any:
    """A fact from a :class:`~hyperpod_lab.fold.facts.JobFacts` or its ``to_dict()``."""
    if isinstance(facts, dict):
        return facts.get(name, default)
    return getattr(facts, name, default)


def _label(job: Any) -> str:
    name = getattr(job, "name", None) or getattr(job, "job_id", "?")
    return f"job {name} ({job.job_id}) on {job.cluster}"


def _clean(text: str) -> str:
    text = redact.redact(text)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"


def evaluate(rules: list[Rule], job: Any, facts: Any = None, goodput: float | None = None,
             now: float | None = None) -> list[Alert]:
    """The alerts ``rules`` give for one job now.

    Args:
        rules: the rules.
        job: its :class:`~hyperpod_lab.submit.jobs.JobRecord` (``job_id``, ``name``, ``cluster``,
            ``status``, ``exit_code``, ``reason``, ``updated_at``).
        facts: its facts (:class:`~hyperpod_lab.fold.facts.JobFacts` or its ``to_dict()``), or
            None (then only ``job_failed``).
        goodput: the finished job's goodput, a fraction 0-1 (``GoodputMeter.result()["goodput"]``),
            or None (no ``low_goodput`` alert).
        now: epoch s (default now), for an incident still down.
    """
    now = time.time() if now is None else now
    out: list[Alert] = []
    incidents = list(_get(facts, "incidents") or []) if facts is not None else []
    for rule in rules:
        if not rule.applies(job.cluster):
            continue
        key = f"{rule.name}|{job.job_id}|"
        if rule.on == "job_failed" and job.status == JobStatus.FAILED.value:
            failure = _get(facts, "failure") if facts is not None else None
            why = []
            if job.exit_code is not None:
                why.append(f"exit code {job.exit_code}")
            if isinstance(failure, dict) and failure.get("reason"):
                why.append(f"runtime: {failure['reason']}")
            if job.reason:
                why.append(f"scheduler: {job.reason}")
            text = f"hyperpod-lab: {_label(job)} failed" + (f" ({'; '.join(why)})" if why else "")
            out.append(Alert(key + "failed", _clean(text), float(job.updated_at)))
        elif rule.on == "fault":
            for i, inc in enumerate(incidents):
                at = inc.get("detected_at") or inc.get("recovered_at")
                if at is None:
                    continue
                text = (f"hyperpod-lab: {_label(job)}: fault {i + 1} detected"
                        + (f" after step {inc['last_step']}" if inc.get("last_step") is not None else ""))
                out.append(Alert(key + f"incident:{i}", _clean(text), float(at)))
        elif rule.on == "slow_recovery":
            for i, inc in enumerate(incidents):
                det = inc.get("detected_at")
                down = inc.get("downtime_s")
                if inc.get("end_at") is not None and isinstance(down, (int, float)):
                    if down > rule.seconds:
                        text = (f"hyperpod-lab: {_label(job)}: fault {i + 1} took {down:.1f} s to recover "
                                f"(rule {rule.name}: over {rule.seconds:g} s)")
                        out.append(Alert(key + f"incident:{i}", _clean(text), float(inc["end_at"])))
                elif inc.get("end_at") is None and det is not None and now - det > rule.seconds:
                    text = (f"hyperpod-lab: {_label(job)}: fault {i + 1} not recovered after {now - det:.0f} s "
                            f"(rule {rule.name}: over {rule.seconds:g} s)")
                    out.append(Alert(key + f"incident:{i}", _clean(text), float(det)))
        elif rule.on == "low_goodput" and goodput is not None and goodput * 100.0 < rule.percent:
            at = _get(facts, "last_time") if facts is not None else None
            text = (f"hyperpod-lab: {_label(job)} ended with goodput {goodput * 100:.1f} % "
                    f"(rule {rule.name}: below {rule.percent:g} %)")
            out.append(Alert(key + "goodput", _clean(text), float(at if at is not None else job.updated_at)))
        elif rule.on == "straggler" and facts is not None:
            for s in _get(facts, "stragglers") or []:
                at = s.get("time")
                if at is None:
                    continue
                where = f" on {s['node']}" if s.get("node") else ""
                excess = s.get("excess_s")
                text = (f"hyperpod-lab: {_label(job)}: rank {s.get('rank')}{where} is a straggler"
                        + (f" ({excess:.2f} s a step slower)" if isinstance(excess, (int, float)) else ""))
                out.append(Alert(key + f"straggler:{s.get('rank')}:{at}", _clean(text), float(at)))
    for a in out:
        a.cluster = job.cluster
    return out


# ---- delivery -----------------------------------------------------------------------------
class _Retry(Exception):
    pass


class Alerts:
    """The server's alerts: the watcher's observer (rules evaluated on its loop) and the one
    sender thread (POSTs with retries, the sent file).

    Args:
        settings: the alerts file's content.
        sent_path: the sent file (default ``<data dir>/alerts-sent.json``).
        watcher: the server's :class:`~hyperpod_lab.server.watch.watcher.Watcher` (its tailers'
            facts and saved progress), or None (then the hooks see what they are given only).

    Attributes:
        state: ``{"since": epoch s, "sent": {key: {"at", "done", "result"}}}`` (the sent file).
        attempts, delivered, failed, dropped: POSTs made, alerts delivered, alerts given up,
            alerts not queued because the queue was full (they are queued again at the next
            evaluation).
    """

    def __init__(self, settings: AlertSettings, sent_path: str | None = None, watcher: Any = None):
        self.watcher = watcher
        self.settings, self.rules, self.hook = settings, settings.rules, settings.webhook
        _hide(self.hook.url)
        self.sent_path = sent_path or os.path.join(data_dir(), SENT_FILE)
        self.lock = threading.Lock()
        self.state = self._load()
        self.pending: set[str] = set()
        self.queue: queue.Queue = queue.Queue(maxsize=self.hook.queue)
        self.attempts = self.delivered = self.failed = self.dropped = 0
        self._stop = threading.Event()
        self._jobs: dict[str, Any] = {}  # job id -> JobRecord at the last status tick
        self._settled: set[str] = set()  # terminal jobs with no tailer, evaluated once (saved facts)
        self._thread: threading.Thread | None = None
        self._seq = 0  # number of the last fired alert (the Lab's cursor)
        self.epoch = time.time()  # this server's numbering: a new one after a restart
        self.fired: collections.deque[dict] = collections.deque(maxlen=MAX_FIRED)

    # ---- the sent file ------------------------------------------------------------------
    def _load(self) -> dict:
        try:
            with open(self.sent_path) as f:
                state = json.load(f)
            if isinstance(state, dict) and isinstance(state.get("sent"), dict) and isinstance(
                    state.get("since"), (int, float)):
                return state
            log.warning("hyperpod_lab: %s is not an alerts sent file: starting a new one", self.sent_path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            log.warning("hyperpod_lab: %s unreadable (%s): starting a new one", self.sent_path, e)
        state = {"since": time.time(), "sent": {}}
        self._save(state)
        return state

    def _save(self, state: dict) -> None:
        try:
            os.makedirs(os.path.dirname(self.sent_path), exist_ok=True)
            write_atomic(self.sent_path, json.dumps(state, sort_keys=True), mode=0o600)
        except OSError as e:
            log.warning("hyperpod_lab: alerts sent file not saved (%s): a restarted server may send them again", e)

    # ---- the watcher's hooks (IOLoop thread) ----------------------------------------------
    def on_status(self, recs: list, poll_s: dict[str, float]) -> None:
        """After a status tick: failed jobs, and incidents still down (``slow_recovery``)."""
        self._jobs = {r.job_id: r for r in recs}
        w = self.watcher
        for r in recs:
            t = w.tailers.get(r.job_id) if w is not None else None
            if t is None and r.state.is_terminal():
                if r.job_id in self._settled:
                    continue  # nothing changes for it any more
                self._settled.add(r.job_id)
            facts = t.progress if t is not None else (w.progress.get(r.job_id) if w is not None else None)
            self.offer(evaluate(self.rules, r, facts))

    def before_fold(self, tailer) -> None:
        return None

    def after_fold(self, tailer, before, located: list, first: bool) -> None:
        """After a batch of a job's events: its fault, recovery, straggler and (once the job is
        complete) goodput rules."""
        rec = self._jobs.get(tailer.job_id)
        if rec is None:
            return  # not seen by a status tick yet: the next one evaluates it
        goodput = None
        if tailer.complete and tailer.meter is not None and any(r.on == "low_goodput" for r in self.rules):
            try:
                goodput = tailer.meter.result().get("goodput")
            except Exception:  # no steps: nothing to judge
                goodput = None
        self.offer(evaluate(self.rules, rec, tailer.progress, goodput=goodput))

    # ---- queueing -----------------------------------------------------------------------
    def offer(self, alerts: list[Alert]) -> int:
        """Queue the alerts not sent, not queued and not older than the sent file; returns how
        many were queued. A full queue leaves the rest for the next evaluation."""
        n = 0
        with self.lock:
            since, sent = self.state["since"], self.state["sent"]
            for a in alerts:
                if a.at < since or a.key in sent or a.key in self.pending:
                    continue
                try:
                    self.queue.put_nowait(a)
                except queue.Full:
                    self.dropped += 1
                    continue
                self.pending.add(a.key)
                self._fire(a)
                n += 1
        return n

    def _fire(self, alert: Alert) -> None:
        """Keep a queued alert, numbered, for the Lab (called with ``lock`` held)."""
        rule, job_id = alert.key.split("|", 2)[:2]
        on = next((r.on for r in self.rules if r.name == rule), rule)
        self._seq += 1
        self.fired.append({"seq": self._seq, "key": alert.key, "rule": rule, "on": on, "job_id": job_id,
                           "cluster": alert.cluster, "text": alert.text, "at": alert.at})

    def fired_after(self, after: int) -> dict:
        """The alerts fired (queued for the webhook) after number ``after``, oldest first, as the
        Lab reads them: ``{"alerts": [{"seq", "key", "rule", "on", "job_id", "cluster", "text",
        "at" (epoch s)}], "next": the number to ask after next time, "epoch": when this numbering
        began (epoch s)}``. Only the newest :data:`MAX_FIRED` are kept; numbers start again at 1
        when the server restarts (a new ``epoch``; an ``after`` above the last number gets every
        kept alert)."""
        with self.lock:
            if after > self._seq:
                after = 0  # a cursor of the server before a restart
            return {"alerts": [dict(a) for a in self.fired if a["seq"] > after], "next": self._seq,
                    "epoch": self.epoch}

    def start(self) -> "Alerts":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hyperpod-lab-alerts", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # ---- the sender thread ----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                alert = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            result = self._deliver(alert)
            if result is None:  # stopping: it stays unsent
                with self.lock:
                    self.pending.discard(alert.key)
                continue
            with self.lock:
                self.pending.discard(alert.key)
                self.state["sent"][alert.key] = {"at": alert.at, "done": time.time(), "result": result}
                self._trim()
                snapshot = json.loads(json.dumps(self.state))
            self._save(snapshot)

    def _trim(self) -> None:
        sent = self.state["sent"]
        if len(sent) <= MAX_SENT:
            return
        oldest = sorted(sent.items(), key=lambda kv: kv[1].get("at", 0.0))[:len(sent) - MAX_SENT]
        for key, v in oldest:
            del sent[key]
            # an occurrence at or before a forgotten one is never sent again
            self.state["since"] = max(self.state["since"], float(v.get("at", 0.0)) + 1e-6)

    def _post(self, body: bytes, url: str) -> int:
        req = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "hyperpod-lab-alerts"})
        try:
            with urllib.request.urlopen(req, timeout=self.hook.timeout_s) as r:
                r.read(65536)
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def _deliver(self, alert: Alert) -> str | None:
        """POST one alert with retries. Returns ``"delivered"``, ``"failed: ..."``, or None when
        the sender is stopping."""
        body = json.dumps({"text": alert.text}).encode()
        try:
            url = (profile_webhook_url(alert.cluster) if alert.cluster else None) or self.hook.url
        except ConfigError as e:
            self.failed += 1
            log.error("hyperpod_lab: alert %s not sent: %s", alert.key, e)
            return f"failed: {e}"
        tries = self.hook.retries + 1
        why = ""
        for attempt in range(tries):
            self.attempts += 1
            try:
                status = self._post(body, url)
                if 200 <= status < 300:
                    self.delivered += 1
                    return "delivered"
                why = f"HTTP {status}"
                if status in _NO_RETRY:
                    break
            except (OSError, ValueError) as e:  # URLError, timeouts, connection resets
                why = redact.redact(f"{type(e).__name__}: {getattr(e, 'reason', e)}")
            if attempt + 1 < tries:
                wait = min(self.hook.backoff_s * (2 ** attempt), self.hook.max_backoff_s)
                log.warning("hyperpod_lab: webhook [secret] did not take alert %s (%s, attempt %d of %d): "
                            "retrying in %.1f s", alert.key, why, attempt + 1, tries, wait)
                if self._stop.wait(wait):
                    return None
        self.failed += 1
        log.error("hyperpod_lab: alert %s not delivered to the webhook [secret] after %d attempt(s) (%s): "
                  "given up, it is not sent again", alert.key, attempt + 1, why)
        return f"failed: {why}"


def _check_profiles() -> None:
    """Resolve every profile's ``alerts_webhook_url_env`` once at start: its URL is redacted from
    then on, and an unset variable is logged now (naming it and the fix), not first at an alert."""
    try:
        names = [n for n, p in load_profiles().items() if getattr(p, "alerts_webhook_url_env", None)]
    except ConfigError:
        return  # the cluster config's own error is reported where it is used
    for name in names:
        try:
            profile_webhook_url(name)
        except ConfigError as e:
            log.error("hyperpod_lab: alerts of cluster '%s' cannot be sent: %s", name, e)


def setup_alerts(path: str | None, watcher) -> Alerts | None:
    """The server's :class:`Alerts` from the alerts file at ``path`` (default
    :func:`default_path`), observing ``watcher`` and started; None when there is no file or it is
    malformed (logged as an error naming the file and the fix: the server runs without alerts)."""
    try:
        settings = load_settings(path)
    except ConfigError as e:
        log.error("hyperpod_lab: alerts are off: %s", e)
        return None
    if settings is None:
        log.info("hyperpod_lab: no alerts file at %s: alerts are off", path or default_path())
        return None
    if not any(isinstance(f, redact.RedactingFilter) for f in log.filters):
        log.addFilter(redact.RedactingFilter())  # records of this logger itself, whatever handler takes them
    alerts = Alerts(settings, watcher=watcher)
    _check_profiles()
    watcher.observers.append(alerts)
    log.info("hyperpod_lab: %d alert rule(s) from %s, sent to the webhook [secret]", len(settings.rules),
             settings.path)
    return alerts.start()
