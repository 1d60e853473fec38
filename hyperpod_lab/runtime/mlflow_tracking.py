"""The job's MLflow run (JobSpec ``tracking: "mlflow"``, ``submit --tracking mlflow``), written by
rank 0 with the ``mlflow`` library's :class:`mlflow.MlflowClient` from rank 0's own events.

The source is rank 0's event writer: every event :meth:`JobContext.emit
<hyperpod_lab.runtime.context.JobContext.emit>` writes on global rank 0 is also handed to
:meth:`MlflowTracking.event`, which only puts it on a bounded queue (``put_nowait``; cost:
``benchmarks/mlflow_overhead.py``, docs/tracking.md); a daemon thread (``hyperpod-mlflow``)
turns the events into MLflow calls, batching what queued up (a round at most every
:data:`BATCH_S`) into ``log_batch`` requests. A slow or down server therefore never stalls a
step: a full queue drops the newest events (:attr:`MlflowTracking.dropped`), and a failing request
prints one warning line to stderr (the rank's log) and is retried at most every
:data:`RETRY_S` seconds; nothing raises into training.

What lands in the run (x = the 0-based step; timestamps are the events'):

====================================== =======================================================
params                                 the JobSpec (``spec.json``) flattened: ``nodes``,
                                       ``resiliency.max_retries``, ``checkpoint.every_steps``...
                                       (lists, dicts and None as JSON text)
tags ``hyperpod_lab.job_id``, ``.job_dir``, ``.cluster``; ``mlflow.runName`` = the spec's name
metric ``loss``, ``steps_per_s``,      every numeric field of each ``step`` event (so at most
``tokens_per_s``, ``lr``...            one point per ``$HYPERPOD_LAB_STEP_EVENT_INTERVAL_S``)
metric ``checkpoint/<tier>``           at each ``checkpoint.saved`` rank 0 emits: the saved step
metric ``fault``                       the incident's number (1, 2...) at the last step reported
                                       before it; tag ``hyperpod_lab.fault.<n>``: its reason,
                                       rank and node (from the ``fault.detected`` events, read
                                       from the job directory when the recovery completes)
metric ``recovery/restart_count``      at ``recovery.completed``, at the first step after the
metric ``recovery/downtime_s``         restart (downtime only when known); tag
                                       ``hyperpod_lab.recoveries``: how many so far
metric ``goodput``, ``goodput/wall_s``, at ``finished``: :func:`hyperpod_lab.goodput.measure_from_events`
``goodput/useful_s``                   over the job's events (when it has step events)
tag ``hyperpod_lab.state``             ``running``; ``succeeded`` (and run status FINISHED) at
                                       rank 0's ``finished``; ``failed`` (status FAILED) when
                                       rank 0 leaves the job with an exception (a restart sets
                                       ``running``/RUNNING again)
====================================== =======================================================

Who knows the end: rank 0 writes ``finished`` and the goodput of a job that succeeds. A job
that ends for good with rank 0 raising is marked ``failed`` by rank 0; one whose rank 0 is
killed (SIGKILL, a lost node) on its last attempt keeps status RUNNING: its final state is only
in the job's events (the submitting side's ``finished`` {status: "failed"}), which is not
forwarded to MLflow.

Checkpointless jobs: global rank 0's events only; while its replica group is out of the quorum
another rank writes the job's ``step`` events, and those steps are not logged.

One run per job: the first start creates it and writes :attr:`JobPaths.mlflow_run
<hyperpod_lab.jobdir.JobPaths.mlflow_run>` (``mlflow-run.json``) atomically; every later start
of rank 0 (torchrun restarting it, a Slurm requeue) logs to that run. Should rank 0 die between
creating the run and writing the file, the next start finds the run by its
``hyperpod_lab.job_id`` tag. Steps recomputed after a restart are logged again at the same x
(MLflow keeps both points; TensorBoard's file purges them, see
:mod:`hyperpod_lab.runtime.tensorboard`).

The experiment is ``$MLFLOW_EXPERIMENT_NAME`` of the job's environment (``--env
MLFLOW_EXPERIMENT_NAME=...``), else :data:`DEFAULT_EXPERIMENT`, created when missing. Credentials
come from MLflow's own variables (``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_USERNAME`` /
``MLFLOW_TRACKING_PASSWORD``: pass them with ``--secret-env``). In rank 0's process this module
sets, unless already set, ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` = 2,
``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` = 1 and ``MLFLOW_HTTP_REQUEST_TIMEOUT`` = 30 (MLflow's
defaults, 7 retries x 2 s backoff and 120 s, would hold a request to a down server for minutes).
See docs/tracking.md.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import sys
import threading
import time
from typing import Any

from hyperpod_lab.atomicfile import write_json_atomic
from hyperpod_lab.events import Event, EventKind, incident_events
from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.spec import TRACKING_MLFLOW, JobSpec

DEFAULT_EXPERIMENT = "hyperpod-lab"
"""The MLflow experiment of a job whose environment sets no ``MLFLOW_EXPERIMENT_NAME``."""
MAX_QUEUE = 10_000
"""Events waiting for the thread; beyond, new ones are dropped (counted in ``dropped``)."""
BATCH_S = 1.0
"""Seconds the thread collects events after a request before the next one (at once for
:meth:`MlflowTracking.sync` and :meth:`~MlflowTracking.close`): at most about one request a
second, however often the job writes events."""
RETRY_S = 30.0
"""Seconds after a failed request before the thread tries the server again (events wait queued)."""
CLOSE_TIMEOUT_S = 10.0
"""Seconds :meth:`MlflowTracking.close` waits for the queued events to reach the server."""
FAIL_TIMEOUT_S = 5.0
"""Seconds :meth:`MlflowTracking.failed` waits (an exception on rank 0: the restart should not wait)."""
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
TAG_PREFIX = "hyperpod_lab."
MAX_PARAM_CHARS = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH (3.x)
MAX_TAG_CHARS = 8000  # mlflow.utils.validation.MAX_TAG_VAL_LENGTH
MAX_METRICS_PER_BATCH = 1000  # mlflow.utils.validation.MAX_METRICS_PER_BATCH
MAX_PARAMS_TAGS_PER_BATCH = 100  # mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
_BAD_KEY_CHARS = re.compile(r"[^\w\-./ ]")  # MLflow keys: alphanumerics, _ - . / and space


def flatten(spec: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The JobSpec dict as MLflow params: nested keys joined with ``.``, strings as they are,
    everything else (numbers, booleans, None, lists, dicts) as JSON text, at most
    :data:`MAX_PARAM_CHARS` characters each."""
    out: dict[str, str] = {}
    for key, value in spec.items():
        name = prefix + str(key)
        if isinstance(value, dict) and value and name in ("resiliency", "checkpoint", "elastic"):
            out.update(flatten(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            out[name] = text[:MAX_PARAM_CHARS]
    return out


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _key(name: str) -> str:
    return _BAD_KEY_CHARS.sub("_", str(name))[:250]


def start(spec: JobSpec | None, job_dir: str, job_id: str, global_rank: int,
          is_restart: bool) -> "MlflowTracking | None":
    """The tracker of this process: on global rank 0 of a job whose spec has
    ``tracking="mlflow"``, else None (nothing imported, nothing started)."""
    if spec is None or spec.tracking != TRACKING_MLFLOW or global_rank != 0 or not spec.tracking_uri:
        return None
    return MlflowTracking(spec, job_dir, job_id, is_restart=is_restart)


class MlflowTracking:
    """Rank 0's MLflow run, fed from a bounded queue by a thread of its own.

    Args:
        spec: the job's spec (``tracking_uri`` set: :meth:`JobSpec.validate` resolved it at submit).
        job_dir: the job directory (``mlflow-run.json``, the events for faults and goodput).
        job_id: the job's id (the run's ``hyperpod_lab.job_id`` tag).
        is_restart: not the job's first start (the run is resumed: status RUNNING again).
        max_queue: events that may wait; retry_s: seconds between tries of a failing server.

    Attributes:
        run_id: the run's id once the thread opened it, else None.
        error: the first failure's text (``ExceptionType: message``), or None.
        dropped: events dropped (queue full, or failed requests).
    """

    def __init__(self, spec: JobSpec, job_dir: str, job_id: str, *, is_restart: bool = False,
                 max_queue: int = MAX_QUEUE, retry_s: float = RETRY_S):
        for name, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
        self.spec, self.uri = spec, str(spec.tracking_uri)
        self.paths = JobPaths(job_dir, join=os.path.join)
        self.job_id, self.is_restart, self.retry_s = job_id, is_restart, retry_s
        self.run_id: str | None = None
        self.error: str | None = None
        self.dropped = 0
        self._client: Any = None
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._closing = threading.Event()
        self._wake = threading.Event()  # sync() or close(): send without waiting out BATCH_S
        self._last_sent = 0.0  # monotonic time of the last batch handled
        self._failing = False  # the last request failed
        self._retry_at = 0.0  # monotonic time of the next try while failing
        self._recoveries = 0
        self._closed = False
        self._close_timeout_s = CLOSE_TIMEOUT_S
        self._warned = threading.Lock()  # held for good by the one warning
        self._thread = threading.Thread(target=self._run, name="hyperpod-mlflow", daemon=True)
        self._thread.start()

    # ---- the training thread's side: never blocks, never raises ----------------------------
    def event(self, ev: Event, step: int | None = None) -> None:
        """Queue one of rank 0's events; ``step``: the last step completed when it was emitted
        (None before the first), the x of the recovery marker."""
        self._put(("event", ev, step))

    def failed(self, exc: BaseException) -> None:
        """Rank 0 leaves the job with ``exc``: queue tag ``failed`` (status FAILED); the
        :meth:`close` that follows then waits at most :data:`FAIL_TIMEOUT_S` seconds. A restart
        marks the run running again. ``SystemExit`` with status 0 or None (``sys.exit()`` in the
        script) is no failure."""
        if not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self._put(("failed", f"{type(exc).__name__}: {exc}"[:MAX_TAG_CHARS]))
            self._close_timeout_s = FAIL_TIMEOUT_S

    def sync(self, timeout_s: float = 60.0) -> bool:
        """Wait until everything queued before this call was sent (or dropped). False on timeout."""
        done = threading.Event()
        if not self._put(("sync", done)):
            return False
        self._wake.set()
        return done.wait(timeout_s)

    def close(self, timeout_s: float | None = None) -> bool:
        """Send what is queued (unless the server is failing: then drop it) and stop the thread,
        waiting at most ``timeout_s`` seconds (None: :data:`CLOSE_TIMEOUT_S`, after
        :meth:`failed` :data:`FAIL_TIMEOUT_S`); past that the thread is left to the process's exit
        (a daemon) with the warning that events were not sent. Idempotent: a second call does not
        wait. Returns whether the thread ended."""
        if self._closed:
            return not self._thread.is_alive()
        self._closed = True
        timeout_s = self._close_timeout_s if timeout_s is None else timeout_s
        self._closing.set()
        self._put(("close",))
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._warn(f"the server at {self.uri} did not answer within {timeout_s:g} s; the events still "
                       f"queued are not sent")
            return False
        return True

    def _warn(self, text: str) -> None:
        """Print the one warning line of this tracker to stderr (the rank's log); later ones are dropped."""
        if self._warned.acquire(blocking=False):
            print(f"hyperpod-lab: warning: MLflow tracking: {text}; training goes on", file=sys.stderr, flush=True)

    def _put(self, item: tuple) -> bool:
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    # ---- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            from mlflow import MlflowClient  # mlflow-skinny has it; ~1.5 s to import, off the training thread

            self._client = MlflowClient(tracking_uri=self.uri)
        except Exception as e:  # not installed (the spec check missed it), a bad URI scheme
            self._fail(e)
            self._client = None
        while True:
            try:
                first = self._queue.get(timeout=1.0)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            self._wake.clear()
            items = self._drain([first])
            if not any(item[0] in ("sync", "close") for item in items) and not self._closing.is_set():
                delay = self._last_sent + BATCH_S - time.monotonic()
                if delay > 0:  # collect a little longer: fewer requests
                    self._wake.wait(delay)
                items = self._drain(items)
            if self._failing and not self._closing.is_set():  # wait out the retry period (events queue up)
                self._closing.wait(max(0.0, self._retry_at - time.monotonic()))
            stop = self._handle(items)
            self._last_sent = time.monotonic()
            for item in items:
                if item[0] == "sync":
                    item[1].set()
            if stop:
                return

    def _drain(self, items: list[tuple]) -> list[tuple]:
        """``items`` plus everything queued now (at most the queue's bound)."""
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items

    def _handle(self, items: list[tuple]) -> bool:
        """Send ``items``; True when one of them is the close request."""
        stop = any(item[0] == "close" for item in items)
        work = [item for item in items if item[0] in ("event", "failed")]
        if not work:
            return stop
        if self._client is None or (self._failing and (stop or self._closing.is_set())):
            self.dropped += len(work)  # no client, or closing while the server fails: do not wait for it
            return stop
        try:
            self._open_run()
            self._send(work)
            self._failing = False
        except Exception as e:  # the server is down or refuses: report once, training goes on
            self.dropped += len(work)
            self._fail(e)
        return stop

    def _fail(self, e: BaseException) -> None:
        self._failing = True
        self._retry_at = time.monotonic() + self.retry_s
        if self.error is None:
            self.error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
            self._warn(f"{self.uri} failed ({self.error}); events are dropped while it fails (tried again every "
                       f"{self.retry_s:g} s)")

    def _open_run(self) -> None:
        """The job's run: from ``mlflow-run.json``, else the run tagged with this job's id, else a
        new one (the file written at once). Its params are logged when it has none yet (a start
        that died before logging them leaves them to the next). On a restart its status goes
        back to RUNNING."""
        if self.run_id is not None:
            return
        client = self._client
        saved = _read_json(self.paths.mlflow_run)
        run_id = saved.get("run_id") if isinstance(saved.get("run_id"), str) else None
        if run_id is None:
            exp_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
            exp = client.get_experiment_by_name(exp_name)
            if exp is None:
                try:
                    exp_id = client.create_experiment(exp_name)
                except Exception:  # another job created it meanwhile
                    exp = client.get_experiment_by_name(exp_name)
                    if exp is None:
                        raise
                    exp_id = exp.experiment_id
            else:
                exp_id = exp.experiment_id
            if "'" not in self.job_id:
                found = client.search_runs([exp_id], f"tags.`{TAG_PREFIX}job_id` = '{self.job_id}'", max_results=1)
                run_id = found[0].info.run_id if found else None
            if run_id is None:
                run = client.create_run(exp_id, run_name=self.spec.name, tags={
                    TAG_PREFIX + "job_id": self.job_id, TAG_PREFIX + "job_dir": self.paths.folder,
                    TAG_PREFIX + "cluster": self.spec.cluster, TAG_PREFIX + "state": "running"})
                run_id = run.info.run_id
            write_json_atomic(self.paths.mlflow_run, {"run_id": run_id, "experiment_id": exp_id,
                                                      "tracking_uri": self.uri})
        run = client.get_run(run_id)
        if not run.data.params:
            self._log_params(run_id)
        if run.info.status != "RUNNING":  # a restart after rank 0 marked it failed or finished
            client.update_run(run_id, status="RUNNING")
            client.set_tag(run_id, TAG_PREFIX + "state", "running")
        self.run_id = run_id

    def _log_params(self, run_id: str) -> None:
        from mlflow.entities import Param

        params = [Param(_key(k), v) for k, v in flatten(self.spec.to_dict()).items()]
        for i in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(run_id, params=params[i:i + MAX_PARAMS_TAGS_PER_BATCH])

    def _send(self, work: list[tuple]) -> None:
        from mlflow.entities import Metric, RunTag

        metrics: list[Metric] = []
        tags: dict[str, str] = {}
        status: str | None = None
        for item in work:
            if item[0] == "failed":
                tags[TAG_PREFIX + "state"], tags[TAG_PREFIX + "error"], status = "failed", item[1], "FAILED"
                continue
            ev, step = item[1], item[2]
            ms = int(ev.time * 1000)
            kind, data = ev.kind, ev.data
            if kind == EventKind.STEP.value and isinstance(data.get("step"), int):
                metrics += [Metric(_key(k), num, ms, data["step"]) for k, v in data.items()
                            if k != "step" and (num := _number(v)) is not None]
            elif kind == EventKind.CHECKPOINT_SAVED.value and isinstance(data.get("step"), int):
                metrics.append(Metric(_key(f"checkpoint/{data.get('tier')}"), float(data["step"]), ms, data["step"]))
            elif kind == EventKind.RECOVERY_COMPLETED.value:
                self._recoveries += 1
                x = step if step is not None else (data.get("restored_step") or 0)
                metrics.append(Metric("recovery/restart_count", float(data.get("restart_count") or 0), ms, x))
                if _number(data.get("downtime_s")) is not None:
                    metrics.append(Metric("recovery/downtime_s", float(data["downtime_s"]), ms, x))
                tags[TAG_PREFIX + "recoveries"] = str(self._recoveries)
                metrics += self._fault_marker(tags)
            elif kind == EventKind.FINISHED.value:
                state = str(data.get("status") or "succeeded")
                tags[TAG_PREFIX + "state"] = state
                status = "FINISHED" if state == "succeeded" else "FAILED"
                metrics += self._goodput(ms, data.get("steps"))
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[i:i + MAX_METRICS_PER_BATCH])
        if tags:
            runtags = [RunTag(k, v[:MAX_TAG_CHARS]) for k, v in tags.items()]
            self._client.log_batch(self.run_id, tags=runtags)
        if status is not None:
            self._client.set_terminated(self.run_id, status=status)

    def _job_events(self) -> list[Event]:
        """The job's incidents and rank 0's steps (:func:`hyperpod_lab.events.incident_events`, all
        of rank 0's file): not the other ranks' files, whose checkpoints the fault marker and the
        goodput do not need."""
        return incident_events(self.paths.folder, rank0_tail_bytes=None)

    def _fault_marker(self, tags: dict[str, str]) -> list:
        """The newest failure incident (the job facts fold) as metric ``fault`` = its number at
        the last step reported before it, and tag ``hyperpod_lab.fault.<n>``."""
        from mlflow.entities import Metric

        from hyperpod_lab.fold.facts import fold

        events = self._job_events()
        incidents = fold(events).incidents
        if not incidents:
            return []
        n, inc = len(incidents), incidents[-1]
        t0 = inc.get("detected_at") or 0.0
        faults = [e for e in events if e.kind == EventKind.FAULT_DETECTED.value and e.time >= t0]
        if faults:
            d = faults[0].data
            what = [str(d.get("reason") or "fault")] + [f"{k} {d[k]}" for k in ("rank", "node", "signal") if d.get(k)
                                                         is not None]
            tags[f"{TAG_PREFIX}fault.{n}"] = "; ".join(what)
        x = inc.get("last_step") if isinstance(inc.get("last_step"), int) else 0
        return [Metric("fault", float(n), int(t0 * 1000), x)]

    def _goodput(self, ms: int, steps: Any) -> list:
        from mlflow.entities import Metric

        from hyperpod_lab.goodput.measure import measure_from_events

        try:
            m = measure_from_events(self._job_events())
        except Exception:  # no step events: nothing to measure
            return []
        x = int(steps) - 1 if isinstance(steps, int) and steps > 0 else 0
        return [Metric(name, float(v), ms, x) for name, v in (("goodput", m.get("goodput")),
                                                              ("goodput/wall_s", m.get("wall_s")),
                                                              ("goodput/useful_s", m.get("useful_s")))
                if _number(v) is not None]


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
