"""One fold from a job's events to its facts: steps, loss, checkpoints, faults, recoveries,
downtime, lost time, wall time and status.

Every reader of a job's events that counts or times anything (``client.summarize``, the
goodput measurement, the server's JobView ``progress``, the notebook widget, the in-job
runtime's ``recovery.completed.downtime_s``) goes through :class:`JobFacts`, so "a fault"
and ``downtime_s`` mean one thing everywhere. Standard library only (the runtime, the server
and the client all import it).

Definitions (also in ``docs/events.md``):

* **fault**: one failure *incident*. The first ``fault.detected`` opens it; every further
  ``fault.detected`` while it is open joins it (the survivors' agents reporting the same loss,
  several ranks of one node, the checkpointless survivors' leader naming the lost replica
  group). It stays open until it is **recovered** (a ``recovery.completed``) and then
  **closes** at the first ``step`` event after that ``recovery.completed``; the next
  ``fault.detected`` after the close opens a new incident. A ``recovery.completed`` with no
  open incident (its fault went unreported, e.g. a single node that died with its agent) opens
  and recovers one incident at once, unless it repeats the ``restart_count`` of the last
  incident (a late second report of that one, e.g. the EKS operator's). ``faults`` counts
  incidents; ``fault_events`` counts the raw ``fault.detected`` events.
* **detection time** of a ``fault.detected``: its ``data.detected_at`` (epoch s) when the
  writer noted it (the checkpointless survivors write the event only at the first commit after
  the loss), else the event's ``time``. An incident's detection time is the earliest of its
  events'.
* **recovery**: an incident that got a ``recovery.completed`` (several for one incident, e.g.
  the operator's and rank 0's on EKS, count once). ``recoveries`` counts them.
* **downtime** of an incident, ``downtime_s``: seconds of wall time from its detection time to
  the first completed step after its recovery. The in-job runtime writes
  ``recovery.completed`` at the moment that step completes (``JobContext.step`` of the first
  step after a restart; the checkpointless commit of the first step after a loss), so the fold
  takes the time of any ``recovery.completed`` not written by the EKS ``operator`` as that
  moment; the operator writes it when the pods run again, before any step, so an incident
  recovered only by the operator ends at the next ``step`` event. Incidents with no detection
  time take the writer's own ``downtime_s`` (or None). The writers' ``recovery.completed``
  field ``downtime_s`` is the same quantity as they see it; where they differ (a writer that
  had not read another writer's earlier ``fault.detected``) the fold's value is the one
  reported.
* **lost time**, ``lost_s``: per recovered incident, wall seconds from the last ``step`` event
  before its detection (else the detection) to the end of its downtime: detection lag plus
  downtime. The steps recomputed after a restore are not in it (their time needs the step
  time; ``hyperpod_lab.goodput.measure_from_events`` adds them).
* **wall time**, ``wall_s``: seconds from the first event to the last one folded.
* **node down**: a ``fault.detected`` with ``reason: "node down"`` (writer ``supervisor``: Slurm
  marked the node DOWN) is a fault report like any other: it opens an incident or joins the
  open one. One exception: a node-down report of a node the job already **excluded**
  (``node.excluded``), while no incident is open, opens none: Slurm marks a node DOWN only
  after its timeout, so this is a late report of the incident during which the node was
  excluded (whose ``fault_events`` it joins) or of a node excluded before training
  (pre-flight); ``fault_events`` still counts it. Any other writer's report of such a node
  (an agent still running there until the next placement) opens an incident as usual.
* **pre-flight**: the ``health.checked`` / ``health.failed`` events of the nodes' health
  checks, written before training (re)starts. They are never a fault: a node that fails its
  checks is excluded or the job fails before step 0, with no incident, recovery or downtime.
  A **pre-flight run** is the health events of one ``run_id`` (the supervisor's name of the
  run), else those with no ``started`` or ``step`` event between them; it spans from the earliest ``time - seconds`` of its ``health.checked`` events (each
  node's checks began then) to its newest event; ``preflight_s`` sums the runs' spans.
* **health** of a node: its newest pre-flight run's result: ``ok``, the ``failed`` checks
  with their detail, the ``skipped`` checks, ``seconds``.
* **excluded nodes**: ``node.excluded`` events (writer ``supervisor``), one entry per node in
  the order they were first excluded, with the ``reason`` and ``faults`` of its newest event;
  nodes named in an event's ``excluded`` list and not excluded before come first.
* **hang time**, ``hang_s``: per incident, the largest ``stalled_s`` of its ``fault.detected``
  with ``reason: "hang"`` (the seconds the hung rank had made no progress when the watchdog
  declared it: time lost before the detection); ``hang_s`` sums the incidents'.
* **straggling time**, ``straggle_s``: a ``straggler.detected`` flags its rank from the event on;
  in synchronous training every step then waits for it, so each step completed while a rank is
  flagged costs its *excess*: ``compute_s - median_compute_s`` (the extra compute the other
  ranks wait for in the collective; their step times include that wait, so ``step_s`` and
  ``median_step_s`` are nearly equal), else, without the compute split, ``step_s -
  median_step_s``; with several ranks flagged the largest excess, never a sum. The ``window``
  steps the detection measured before the event were slow too and count once, when the rank is
  first flagged (only what exceeds the excess already charged). A flag ends when an incident
  opens or the job (re)starts (``started``): new processes, and with ``action: exclude`` a new
  node; a rank still slow is flagged again. The runtime writes no event when an episode ends
  without a restart, so a rank that speeds up again stays charged until then (an over-estimate).
  ``straggle_steps`` counts the steps charged; ``stragglers`` lists the ranks flagged now.
* **failure**: the ``job.failed`` event's data (a restart storm: ``reason``, ``restarts``,
  ``fault``, ``requeue``) and its ``time``, or None.

Events are folded in the order given; give them in time order (``EventReader.poll`` does).
"""

from __future__ import annotations

from typing import Any, Iterable

from hyperpod_lab.events import HEALTH_WRITER_PREFIX, OPERATOR_WRITER, Event, EventKind, FaultReason, writer_node

# the kinds the fold compares, as plain strings (an Enum member's .value costs an attribute lookup
# per event on the hot path)
(_STEP, _STARTED, _FAULT, _RECOVERED, _SAVED, _RESTORED, _FINISHED, _HEALTH_CHECKED, _HEALTH_FAILED, _NODE_EXCLUDED,
 _STRAGGLER, _JOB_FAILED) = (k.value for k in (
    EventKind.STEP, EventKind.STARTED, EventKind.FAULT_DETECTED, EventKind.RECOVERY_COMPLETED, EventKind.CHECKPOINT_SAVED,
    EventKind.CHECKPOINT_RESTORED, EventKind.FINISHED, EventKind.HEALTH_CHECKED, EventKind.HEALTH_FAILED,
    EventKind.NODE_EXCLUDED, EventKind.STRAGGLER_DETECTED, EventKind.JOB_FAILED))

#: characters of a health check's ``detail`` kept in the facts (the JobView carries them)
MAX_DETAIL = 300


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _detail(x: Any) -> str | None:
    if x is None:
        return None
    s = str(x)
    return s if len(s) <= MAX_DETAIL else s[:MAX_DETAIL - 1] + "…"


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    """Seconds shared by the intervals ``[a0, a1]`` and ``[b0, b1]``."""
    return max(0.0, min(a1, b1) - max(a0, b0))


def _total_steps_from_spec(spec: dict) -> int | None:
    """The script's ``--steps N`` (or ``--steps=N``) argument in a JobSpec dict, else None."""
    args = list(spec.get("args") or [])
    for i, a in enumerate(args):
        if a == "--steps" and i + 1 < len(args) and str(args[i + 1]).isdigit():
            return int(args[i + 1])
        if isinstance(a, str) and a.startswith("--steps=") and a[8:].isdigit():
            return int(a[8:])
    return None


def event_dict(ev: Event) -> dict[str, Any]:
    """The event as its JSON object (what ``last_event`` and WebSocket messages carry): the
    fields of :meth:`Event.to_json`, its ``data`` the event's own (not copied: read it, do not
    change it)."""
    return {"data": ev.data, "job_id": ev.job_id, "kind": ev.kind, "seq": ev.seq, "time": ev.time, "v": ev.v,
            "writer": ev.writer}


def _new_incident(detected_at: float | None, last_step: int | None, last_step_time: float | None) -> dict[str, Any]:
    return {"detected_at": detected_at, "fault_events": 0, "last_step": last_step,
            "last_step_time": last_step_time, "recovered_at": None, "end_at": None, "closed": False,
            "downtime_s": None, "reported_downtime_s": None, "lost_s": None, "restored_step": None,
            "restored_from": None, "resumed_step": None, "restart_count": None, "restore_s": 0.0,
            "hang_s": 0.0}


class JobFacts:
    """A job's facts, folded incrementally from its events (definitions: module docstring).

    Attributes (all in :meth:`to_dict`; times are epoch seconds, durations seconds):
        step: last completed 0-based step (a ``step`` event's ``step``; ``finished.steps - 1``), or None.
        total_steps: a ``step`` event's ``total_steps`` metric, else the script's ``--steps N``, or None.
        steps: steps done: ``finished.steps``, else the highest ``step`` seen + 1 (0 before any).
        loss, steps_per_s: of the newest ``step`` event (``loss`` becomes ``finished.final_loss``).
        first_loss, last_loss: loss of the first and newest ``step`` events; final_loss: ``finished.final_loss``.
        last_event: the newest event as its JSON object, or None.
        checkpoints, restores: ``checkpoint.saved`` / ``checkpoint.restored`` events (every rank's, every tier's).
        faults: failure incidents; fault_events: ``fault.detected`` events.
        recoveries: incidents recovered.
        downtime_s: total downtime of the recovered incidents whose downtime is known (0.0 at first).
        last_downtime_s: downtime of the newest recovered incident, or None.
        downtimes_s: downtime per recovered incident, in order (None where unknown).
        lost_s: total lost time of the recovered incidents (detection lag + downtime).
        incidents: one dict per incident (oldest first): ``detected_at``, ``fault_events``,
            ``last_step`` / ``last_step_time`` (newest ``step`` event before it opened),
            ``recovered_at`` (first ``recovery.completed``), ``end_at`` (first completed step after
            the recovery), ``closed``, ``downtime_s``, ``reported_downtime_s`` (the writer's field),
            ``lost_s``, ``restored_step``, ``restored_from``, ``resumed_step``, ``restart_count``,
            ``restore_s`` (slowest ``checkpoint.restored.seconds`` while it was open).
        first_time, started_time, last_time: first event, first ``started``, newest event (or None).
        last_step_time: time of the newest ``step`` event, or None.
        wall_s: ``last_time - first_time`` (0.0 before any event).
        status: ``finished.status``, or None before ``finished``.
        excluded_nodes: one dict per excluded node, in order: ``node``, ``reason``, ``faults``
            (faults counted on it, as the supervisor wrote), ``time`` (first excluded),
            ``incident`` (index in ``incidents`` of the incident open then, or None).
        health: ``{node: {"ok", "failed": {check: detail}, "skipped": [check], "seconds",
            "time", "run"}}``, each node's newest pre-flight result (``run``: index in
            ``preflight_runs``), nodes in the order first checked.
        preflight_runs: one dict per pre-flight run: ``run_id``, ``start``, ``end`` (epoch s), ``nodes``
            (``health.checked`` events), ``failed`` (nodes whose checks failed).
        preflight_s: total seconds of the pre-flight runs (0.0 before any).
        hang_s: seconds lost to hangs before their detection (0.0 before any; each incident's
            ``hang_s`` too).
        straggle_s, straggle_steps: seconds lost to stragglers and the steps they slowed.
        stragglers: the ranks flagged now: ``[{rank, node, score, step_s, median_step_s,
            excess_s, time, action}]``.
        failure: ``job.failed``'s data plus its ``time``, or None.

    Args:
        saved: a :meth:`to_dict` result to continue from (the server keeps them in its store);
            keys it lacks take their initial values.
        spec: the job's JobSpec dict, for ``total_steps`` from its ``--steps N``.
    """

    def __init__(self, saved: dict | None = None, spec: dict | None = None):
        d = dict(saved or {})
        self.step: int | None = d.get("step")
        self.total_steps: int | None = d.get("total_steps", _total_steps_from_spec(spec or {}))
        self.max_step: int | None = d.get("max_step", self.step)
        self.finished_steps: int | None = d.get("finished_steps")
        self.loss = d.get("loss")
        self.steps_per_s = d.get("steps_per_s")
        self.first_loss = d.get("first_loss")
        self.last_loss = d.get("last_loss")
        self.final_loss = d.get("final_loss")
        self._last_event: dict | None = d.get("last_event")
        self._last_ev: Event | None = None  # the newest event, made a dict only when asked for
        self.checkpoints = int(d.get("checkpoints", 0))
        self.restores = int(d.get("restores", 0))
        self.faults = int(d.get("faults", 0))
        self.fault_events = int(d.get("fault_events", self.faults))
        self.recoveries = int(d.get("recoveries", 0))
        self.incidents: list[dict[str, Any]] = [dict(i) for i in d.get("incidents") or []]
        self.first_time: float | None = d.get("first_time")
        self.started_time: float | None = d.get("started_time")
        self.last_time: float | None = d.get("last_time")
        self.last_step_time: float | None = d.get("last_step_time")
        self.status: str | None = d.get("status")
        self.excluded_nodes: list[dict[str, Any]] = [dict(x) for x in d.get("excluded_nodes") or []]
        self.health: dict[str, dict[str, Any]] = {str(k): dict(v) for k, v in (d.get("health") or {}).items()}
        self.preflight_runs: list[dict[str, Any]] = [dict(r) for r in d.get("preflight_runs") or []]
        # the newest run takes more health events: no started nor step event came since its last
        self.preflight_open = bool(d.get("preflight_open", False))
        self.straggle_s = float(d.get("straggle_s") or 0.0)
        self.straggle_steps = int(d.get("straggle_steps") or 0)
        self.stragglers: list[dict[str, Any]] = [dict(x) for x in d.get("stragglers") or []]
        self.straggle_mark: int | None = d.get("straggle_mark")  # step the straggling was charged up to
        self.failure: dict[str, Any] | None = dict(d["failure"]) if d.get("failure") else None
        # a summary saved before incidents were kept: keep its totals
        self._saved_downtime = float(d.get("downtime_s") or 0.0) if not self.incidents else 0.0

    # ---- the fold ---------------------------------------------------------------------
    @property
    def open_incident(self) -> dict[str, Any] | None:
        """The incident not yet closed (detected, or recovered and awaiting its first step), or None."""
        if self.incidents and not self.incidents[-1]["closed"]:
            return self.incidents[-1]
        return None

    @property
    def incident_detected_at(self) -> float | None:
        """Detection time (epoch s) of the open incident, or None: where a ``recovery.completed``
        written now starts its ``downtime_s``."""
        inc = self.open_incident
        return None if inc is None else inc["detected_at"]

    @property
    def last_event(self) -> dict | None:
        """The newest event as its JSON object (:func:`event_dict`), or None."""
        if self._last_ev is not None:
            self._last_event, self._last_ev = event_dict(self._last_ev), None
        return self._last_event

    @last_event.setter
    def last_event(self, value: dict | None) -> None:
        self._last_event, self._last_ev = value, None

    def update(self, ev: Event) -> None:
        """Fold one event in (events in time order)."""
        t = float(ev.time)
        self._last_ev = ev
        self.first_time = t if self.first_time is None else min(self.first_time, t)
        self.last_time = t if self.last_time is None else max(self.last_time, t)
        d, kind = ev.data, ev.kind
        if kind == _STEP:
            self.preflight_open = False
            self._on_step(ev, t)
        elif kind == _STARTED:
            self.preflight_open = False
            self.stragglers = []  # new processes: a rank still slow is flagged again
            if self.started_time is None:
                self.started_time = t
        elif kind == _SAVED:
            self.checkpoints += 1
        elif kind == _RESTORED:
            self.restores += 1
            inc = self.open_incident
            secs = _num(d.get("seconds"))
            if inc is not None and secs is not None:
                inc["restore_s"] = max(inc["restore_s"], secs)
        elif kind == _FAULT:
            self._on_fault(ev, t)
        elif kind == _RECOVERED:
            self._on_recovered(ev, t)
        elif kind in (_HEALTH_CHECKED, _HEALTH_FAILED):
            self._on_health(ev, t)
        elif kind == _NODE_EXCLUDED:
            self._on_excluded(ev, t)
        elif kind == _STRAGGLER:
            self._on_straggler(ev, t)
        elif kind == _JOB_FAILED:
            self.failure = {**{k: v for k, v in d.items() if k in ("reason", "restarts", "fault", "requeue",
                                                                    "criterion", "exit_code")},
                            "time": t, "writer": ev.writer}
        elif kind == _FINISHED:
            steps = _int(d.get("steps"))
            if steps is not None and steps > 0:
                self.step = steps - 1
                self.finished_steps = steps
            if d.get("final_loss") is not None:
                self.loss = self.final_loss = d["final_loss"]
            self.status = d.get("status", self.status)

    def _on_step(self, ev: Event, t: float) -> None:
        d = ev.data
        self.step = d.get("step", self.step)
        s = _int(d.get("step"))
        if s is not None:
            self.max_step = s if self.max_step is None else max(self.max_step, s)
            if self.stragglers and self.straggle_mark is not None and s > self.straggle_mark:
                n = s - self.straggle_mark
                self.straggle_s += n * max(x["excess_s"] for x in self.stragglers)
                self.straggle_steps += n
            self.straggle_mark = s
        self.loss = d.get("loss", self.loss)
        self.steps_per_s = d.get("steps_per_s", self.steps_per_s)
        if _int(d.get("total_steps")) is not None:
            self.total_steps = d["total_steps"]
        if "loss" in d:
            if self.first_loss is None:
                self.first_loss = d["loss"]
            self.last_loss = d["loss"]
        inc = self.open_incident
        if inc is not None and inc["recovered_at"] is not None:
            if inc["end_at"] is None:  # recovered by the operator only: this is the first step
                self._end(inc, t)
            inc["closed"] = True
        self.last_step_time = t

    def _on_fault(self, ev: Event, t: float) -> None:
        self.fault_events += 1
        at = _num(ev.data.get("detected_at"))
        at = t if at is None else at
        inc = self.open_incident
        late = inc is None and ev.data.get("reason") == FaultReason.NODE_DOWN
        excluded = self._excluded_entry(ev.data.get("node")) if late else None
        if excluded is not None:  # Slurm's late word on a node the job left: no new incident
            k = excluded.get("incident")
            if isinstance(k, int) and 0 <= k < len(self.incidents):
                self.incidents[k]["fault_events"] += 1
            return
        if inc is None:
            inc = _new_incident(at, self.step, self.last_step_time)
            self.incidents.append(inc)
            self.faults += 1
            self.stragglers = []  # the recovery restarts the ranks (or replaces the node)
        elif inc["detected_at"] is None or at < inc["detected_at"]:
            inc["detected_at"] = at
            if inc["end_at"] is not None:
                self._end(inc, inc["end_at"], again=True)
        inc["fault_events"] += 1
        stalled = _num(ev.data.get("stalled_s"))
        if ev.data.get("reason") == FaultReason.HANG and stalled is not None and stalled > 0:
            inc["hang_s"] = max(inc.get("hang_s") or 0.0, stalled)
        rc = _int(ev.data.get("restart_count"))
        if rc is not None and inc["restart_count"] is None:
            inc["restart_count"] = rc

    def _on_recovered(self, ev: Event, t: float) -> None:
        d = ev.data
        rc = _int(d.get("restart_count"))
        inc = self.open_incident
        if inc is None:
            last = self.incidents[-1] if self.incidents else None
            if last is not None and rc is not None and last["restart_count"] == rc and last["recovered_at"] is not None:
                return  # a late second report of the last incident's recovery
            inc = _new_incident(None, self.step, self.last_step_time)
            self.incidents.append(inc)
            self.faults += 1
        runtime = ev.writer != OPERATOR_WRITER
        if inc["recovered_at"] is None:
            inc["recovered_at"] = t
            self.recoveries += 1
        for k in ("restored_step", "restored_from", "resumed_step"):
            if d.get(k) is not None and (runtime or inc[k] is None):
                inc[k] = d[k]
        if rc is not None and (runtime or inc["restart_count"] is None):
            inc["restart_count"] = rc
        if runtime and inc["reported_downtime_s"] is None:
            inc["reported_downtime_s"] = _num(d.get("downtime_s"))
        if runtime and inc["end_at"] is None:
            self._end(inc, t)
        elif not runtime and inc["reported_downtime_s"] is None and inc["detected_at"] is None:
            inc["reported_downtime_s"] = _num(d.get("downtime_s"))

    def _node_of(self, ev: Event) -> str | None:
        node = ev.data.get("node")
        if isinstance(node, str) and node:
            return node
        return writer_node(ev.writer, (HEALTH_WRITER_PREFIX,))

    def _on_health(self, ev: Event, t: float) -> None:
        """A node's pre-flight result (``health.checked``) or one failed check (``health.failed``):
        the node's health and the pre-flight run; never an incident."""
        d = ev.data
        node = self._node_of(ev)
        secs = _num(d.get("seconds")) if ev.kind == _HEALTH_CHECKED else None
        begin = t - secs if secs is not None and secs > 0 else t
        rid = d.get("run_id") if isinstance(d.get("run_id"), (str, int)) else None
        last = self.preflight_runs[-1] if self.preflight_runs else None
        if last is not None and rid is not None and last.get("run_id") is not None:
            joins = last["run_id"] == rid  # the supervisor names each run
        else:
            joins = last is not None and self.preflight_open
        if joins:
            run = last
            run["start"], run["end"] = min(run["start"], begin), max(run["end"], t)
            if run.get("run_id") is None:
                run["run_id"] = rid
        else:
            run = {"run_id": rid, "start": begin, "end": t, "nodes": 0, "failed": 0}
            self.preflight_runs.append(run)
        self.preflight_open = True
        idx = len(self.preflight_runs) - 1
        if node is None:
            return
        cur = self.health.get(node)
        same_run = cur is not None and cur.get("run") == idx
        was_ok = cur.get("ok") is not False if same_run else True
        if ev.kind == _HEALTH_CHECKED:
            run["nodes"] += 1
            checks = d.get("checks") if isinstance(d.get("checks"), dict) else {}
            failed = {str(k): _detail(c.get("detail")) for k, c in checks.items()
                      if isinstance(c, dict) and c.get("status") == "failed"}
            skipped = [str(k) for k, c in checks.items() if isinstance(c, dict) and c.get("status") == "skipped"]
            if same_run:  # its health.failed events came first: keep their checks too
                failed = {**cur["failed"], **failed}
            ok = d.get("ok") if isinstance(d.get("ok"), bool) else not failed
            ok = ok and not failed
            rec = {"ok": ok, "failed": failed, "skipped": skipped, "seconds": secs, "time": t, "run": idx}
        else:
            check = str(d.get("check") or "unknown")
            rec = dict(cur) if same_run else {"ok": False, "failed": {}, "skipped": [], "seconds": None,
                                              "time": t, "run": idx}
            rec["failed"] = {**rec["failed"], check: _detail(d.get("detail"))}
            rec["ok"] = False
        if was_ok and rec["ok"] is False:
            run["failed"] += 1
        self.health[node] = rec

    def _excluded_entry(self, node: Any) -> dict[str, Any] | None:
        if not isinstance(node, str):
            return None
        return next((x for x in self.excluded_nodes if x["node"] == node), None)

    def _on_excluded(self, ev: Event, t: float) -> None:
        """``node.excluded``: the job's next placements avoid the node; never an incident."""
        d = ev.data
        node = self._node_of(ev)
        inc = self.open_incident
        at = len(self.incidents) - 1 if inc is not None else None
        for other in d.get("excluded") or []:
            if isinstance(other, str) and other != node and self._excluded_entry(other) is None:
                self.excluded_nodes.append({"node": other, "reason": None, "faults": None, "time": t,
                                            "incident": at})
        if node is None:
            return
        entry = self._excluded_entry(node)
        if entry is None:
            entry = {"node": node, "reason": None, "faults": None, "time": t, "incident": at}
            self.excluded_nodes.append(entry)
        if d.get("reason") is not None:
            entry["reason"] = _detail(d["reason"])
        if _int(d.get("faults")) is not None:
            entry["faults"] = d["faults"]

    def _on_straggler(self, ev: Event, t: float) -> None:
        """``straggler.detected``: its rank is flagged (see the module doc: straggling time)."""
        d = ev.data
        step_s, median = _num(d.get("step_s")), _num(d.get("median_step_s"))
        compute, median_compute = _num(d.get("compute_s")), _num(d.get("median_compute_s"))
        if compute is not None and median_compute is not None:
            excess = max(0.0, compute - median_compute)  # what the other ranks wait for, each step
        elif step_s is not None and median is not None:
            excess = max(0.0, step_s - median)
        else:
            return
        rank = d.get("rank")
        entry = next((x for x in self.stragglers if x["rank"] == rank), None)
        if entry is None:
            window = _int(d.get("window"))
            current = max((x["excess_s"] for x in self.stragglers), default=0.0)
            if window is not None and window > 0 and excess > current:
                self.straggle_s += window * (excess - current)  # the slow steps the detection measured
                self.straggle_steps += window if not self.stragglers else 0
            entry = {"rank": rank, "time": t}
            self.stragglers.append(entry)
        entry.update({"node": d.get("node"), "score": _num(d.get("score")), "step_s": step_s,
                      "median_step_s": median, "excess_s": excess, "action": d.get("action")})
        if self.straggle_mark is None:
            self.straggle_mark = _int(self.step)

    def _end(self, inc: dict[str, Any], t: float, again: bool = False) -> None:
        """The incident's first completed step after recovery is at ``t``: its downtime and lost time."""
        inc["end_at"] = t
        if inc["detected_at"] is not None:
            inc["downtime_s"] = max(0.0, t - inc["detected_at"])
        else:
            inc["downtime_s"] = inc["reported_downtime_s"]
        start = inc["last_step_time"] if inc["last_step_time"] is not None else inc["detected_at"]
        if start is not None:
            inc["lost_s"] = max(0.0, t - start)
        elif inc["downtime_s"] is not None:
            inc["lost_s"] = inc["downtime_s"]

    # ---- derived facts ----------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Steps done: ``finished.steps``, else the highest step seen + 1 (0 before any)."""
        if self.finished_steps is not None:
            return self.finished_steps
        return (self.max_step if self.max_step is not None else -1) + 1

    @property
    def downtimes_s(self) -> list[float | None]:
        """Downtime (s) of each recovered incident whose first step after recovery came, in order
        (None where no detection time nor a written ``downtime_s`` was known)."""
        return [i["downtime_s"] for i in self.incidents if i["recovered_at"] is not None and i["end_at"] is not None]

    @property
    def downtime_s(self) -> float:
        """Total downtime of the recovered incidents, seconds (unknown ones count 0)."""
        return self._saved_downtime + sum(x for x in self.downtimes_s if x is not None)

    @property
    def last_downtime_s(self) -> float | None:
        """Downtime of the newest recovered incident (s), or None."""
        ds = self.downtimes_s
        return ds[-1] if ds else None

    @property
    def lost_s(self) -> float:
        """Total lost time of the recovered incidents (detection lag + downtime), seconds."""
        return sum(i["lost_s"] for i in self.incidents if i["end_at"] is not None and i["lost_s"] is not None)

    @property
    def hang_s(self) -> float:
        """Seconds lost to hangs before their detection (the incidents' ``hang_s``)."""
        return sum(float(i.get("hang_s") or 0.0) for i in self.incidents)

    @property
    def preflight_s(self) -> float:
        """Total seconds of the pre-flight runs (each from its first check's start to its newest event)."""
        return sum(max(0.0, r["end"] - r["start"]) for r in self.preflight_runs)

    @property
    def wall_s(self) -> float:
        """Seconds from the first event folded to the newest (0.0 before any)."""
        return 0.0 if self.first_time is None else self.last_time - self.first_time

    def to_dict(self) -> dict[str, Any]:
        """Every fact, JSON-serialisable; ``JobFacts(saved=d)`` continues the fold from it.

        The JobView ``progress`` keys the server and the widgets read: ``step``,
        ``total_steps``, ``loss``, ``steps_per_s``, ``last_event``, ``faults``, ``recoveries``,
        ``downtime_s`` (number, total seconds) and ``last_downtime_s`` (number or null).
        """
        return {"step": self.step, "total_steps": self.total_steps, "loss": self.loss,
                "steps_per_s": self.steps_per_s, "last_event": self.last_event,
                "faults": self.faults, "recoveries": self.recoveries,
                "downtime_s": self.downtime_s, "last_downtime_s": self.last_downtime_s,
                "fault_events": self.fault_events, "downtimes_s": self.downtimes_s, "lost_s": self.lost_s,
                "steps": self.steps, "max_step": self.max_step, "finished_steps": self.finished_steps,
                "first_loss": self.first_loss, "last_loss": self.last_loss, "final_loss": self.final_loss,
                "checkpoints": self.checkpoints, "restores": self.restores, "status": self.status,
                "first_time": self.first_time, "started_time": self.started_time, "last_time": self.last_time,
                "last_step_time": self.last_step_time, "wall_s": self.wall_s,
                "incidents": [dict(i) for i in self.incidents],
                "excluded_nodes": [dict(x) for x in self.excluded_nodes],
                "health": {k: {**v, "failed": dict(v["failed"]), "skipped": list(v["skipped"])}
                           for k, v in self.health.items()},
                "preflight_runs": [dict(r) for r in self.preflight_runs], "preflight_open": self.preflight_open,
                "preflight_s": self.preflight_s, "hang_s": self.hang_s, "straggle_s": self.straggle_s,
                "straggle_steps": self.straggle_steps, "stragglers": [dict(x) for x in self.stragglers],
                "straggle_mark": self.straggle_mark, "failure": dict(self.failure) if self.failure else None}


def fold(events: Iterable[Event], spec: dict | None = None) -> JobFacts:
    """The facts of ``events`` (folded in time order, ties by writer and sequence number).

    Args:
        events: a job's :class:`~hyperpod_lab.events.Event` objects, any order.
        spec: the job's JobSpec dict (for ``total_steps``), optional.
    """
    facts = JobFacts(spec=spec)
    for ev in sorted(events, key=lambda e: (e.time, e.writer, e.seq)):
        facts.update(ev)
    return facts
