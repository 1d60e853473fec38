"""One aggregation of a job's events for every view of it: the Lab's dashboard, the notebook
widget, the server's ``GET hyperpod/jobs/<id>/dashboard``.

:class:`JobAggregate` folds events one by one (``fold(ev)``) into state whose size is bounded by
the job's *shape* (lanes, spans, incidents, buckets), never by its number of steps:

* **timeline** (:meth:`JobAggregate.timeline`): the incidents and checkpoint runs, one line
  each, the same for every view (see there).
* **lanes**: one per rank (``"0"``, ``"1"``, ...) plus ``"job"`` for job-level events. Each lane
  holds *spans* (a run of step events, a run of checkpoints of one tier) and *marks* (faults,
  hangs, recoveries, stragglers, health failures, node exclusions, elastic scaling, restores).
  A run of steps or checkpoints is one span with a count, never one entry per step.
* **series**: step -> loss and steps/s in a multi-resolution bucket array (``max_buckets``
  buckets of ``width`` steps; when a step falls past the last bucket, neighbouring buckets merge
  and ``width`` doubles). Each bucket keeps its minimum and maximum, so peaks survive any
  downsampling.

Events may come in any order across writers (each writer's own events are in its file's
order, as :class:`~hyperpod_lab.events.EventReader` returns them). Standard library only: the
runtime, the server and the notebook widget all import it.

Units: times are seconds since the epoch (``t``, ``t0``, ``t1``), steps are 0-based training
steps, ``steps_per_s`` is steps per second.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

from hyperpod_lab.events import RANK_WRITER_PREFIX, Event, EventKind, FaultReason, stopped_ranks, writer_node

__all__ = ["JobAggregate", "mark_label", "MARK_CATEGORIES", "KIND_TONES"]

#: 2: the nodes' ``health.checked`` results (``checks``) are kept for the timeline;
#: 3: each rank's node (``rank_node``) and the ranks per node (``per_node``) are kept for the node lanes
STATE_VERSION = 3

#: ranks per lane of ranks whose node no event named, when the job's events do not say how many
#: ranks a node runs (``submitted``'s ``procs_per_node``, else ``started``'s ``world_size / nodes``)
DEFAULT_RANKS_PER_NODE = 8

#: marks kept per node lane in a summary (after merging its ranks' marks); faults and hangs are
#: kept first, the rest are counted in the lane's ``dropped_marks``
NODE_MARKS = 64
MAX_NODE_RANKS = 64
"""Ranks of one node's ``checkpoint.saved`` (``ranks``) whose lanes get its span; the rest are
left out (a node has 8 ranks in the production shape; the list is the runtime's, not a user's)."""

#: a tier and step restored by several ranks within this many seconds of the first is one
#: timeline line (one incident's restore); later it is a new line (another incident's)
RESTORE_WINDOW_S = 60.0

#: event kind -> the mark category the views colour by (fault.detected with ``reason: "hang"``
#: is category ``hang``)
MARK_CATEGORIES: dict[str, str] = {
    EventKind.FAULT_DETECTED.value: "fault",
    EventKind.RECOVERY_STARTED.value: "recovery",
    EventKind.RECOVERY_COMPLETED.value: "recovery",
    EventKind.RECOVERY_FALLBACK.value: "recovery",
    EventKind.CHECKPOINT_RESTORED.value: "restore",
    EventKind.CHECKPOINT_CORRUPT.value: "checkpoint-error",
    EventKind.CHECKPOINT_FAILED.value: "checkpoint-error",
    EventKind.STRAGGLER_DETECTED.value: "straggler",
    EventKind.HEALTH_FAILED.value: "health",
    EventKind.NODE_EXCLUDED.value: "exclusion",
    EventKind.ELASTIC_SCALED.value: "scaling",
    EventKind.JOB_FAILED.value: "fault",
    EventKind.STARTED.value: "lifecycle",
    EventKind.SUBMITTED.value: "lifecycle",
    EventKind.FINISHED.value: "lifecycle",
}

#: event kind -> the tone every view colours it by (the notebook widget's colours, the CLI's
#: styles: ``hyperpod_lab.notebook.widgets``, ``hyperpod_lab.cli.render``); a kind not listed
#: has no tone of its own
KIND_TONES: dict[str, str] = {
    EventKind.FAULT_DETECTED.value: "fault", EventKind.JOB_FAILED.value: "job-failed",
    EventKind.HEALTH_FAILED.value: "failed", EventKind.CHECKPOINT_CORRUPT.value: "warning",
    EventKind.CHECKPOINT_FAILED.value: "warning", EventKind.STRAGGLER_DETECTED.value: "warning",
    EventKind.NODE_EXCLUDED.value: "excluded", EventKind.RECOVERY_STARTED.value: "recovering",
    EventKind.RECOVERY_COMPLETED.value: "recovered", EventKind.RECOVERY_FALLBACK.value: "recovering",
    EventKind.CHECKPOINT_SAVED.value: "checkpoint", EventKind.CHECKPOINT_RESTORED.value: "restore",
    EventKind.HEALTH_CHECKED.value: "health", EventKind.FINISHED.value: "end",
}

#: kinds that end the open spans of the lanes they touch (the next step/checkpoint starts a new span)
#: (recovery.completed is written at the first step after a recovery: that step's run is already new)
_BREAKS = {EventKind.FAULT_DETECTED.value, EventKind.RECOVERY_STARTED.value, EventKind.ELASTIC_SCALED.value,
           EventKind.JOB_FAILED.value}
#: kinds that are marks on the job lane whoever wrote them (they describe the whole job)
_JOB_LEVEL = {EventKind.RECOVERY_STARTED.value, EventKind.RECOVERY_COMPLETED.value, EventKind.ELASTIC_SCALED.value,
              EventKind.JOB_FAILED.value, EventKind.SUBMITTED.value, EventKind.FINISHED.value,
              EventKind.NODE_EXCLUDED.value}
#: kinds listed by :meth:`JobAggregate.timeline` (besides the checkpoint spans)
_TIMELINE = {EventKind.FAULT_DETECTED.value, EventKind.RECOVERY_COMPLETED.value, EventKind.RECOVERY_FALLBACK.value,
             EventKind.STRAGGLER_DETECTED.value, EventKind.HEALTH_FAILED.value, EventKind.NODE_EXCLUDED.value,
             EventKind.ELASTIC_SCALED.value, EventKind.JOB_FAILED.value, EventKind.CHECKPOINT_RESTORED.value,
             EventKind.CHECKPOINT_CORRUPT.value, EventKind.CHECKPOINT_FAILED.value, EventKind.FINISHED.value}


def _ranks_text(ranks: list[int]) -> str:
    """``"ranks 0, 1"``, ``"ranks 0-63"``, ``"ranks 0-3, 6"``: runs of 3 or more consecutive ranks as a range."""
    parts: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.extend([f"{rs[i]}-{rs[j]}"] if j - i >= 2 else [str(r) for r in rs[i:j + 1]])
        i = j + 1
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(parts)


#: ranks a timeline entry of :meth:`JobAggregate.summary` lists (``rank_count`` says how many in all)
SUMMARY_RANKS = 64


def _bounded_ranks(e: dict) -> dict:
    """A timeline entry with at most ``SUMMARY_RANKS`` of its ``ranks`` (plus ``rank_count``)."""
    ranks = e.get("ranks")
    if isinstance(ranks, list) and len(ranks) > SUMMARY_RANKS:
        return {**e, "ranks": ranks[:SUMMARY_RANKS], "rank_count": len(ranks)}
    return e


def _with_ranks(label: str, ranks: list[int]) -> str:
    """The label, with `` · ranks ...`` when it is about more than one rank."""
    return f"{label} · {_ranks_text(ranks)}" if len(set(ranks)) > 1 else label


def _health_ok(d: dict) -> bool:
    """Whether a ``health.checked`` result passed: ``ok`` not False and no check ``failed``."""
    checks = d.get("checks") if isinstance(d.get("checks"), dict) else {}
    return d.get("ok") is not False and not any(isinstance(c, dict) and c.get("status") == "failed"
                                                for c in checks.values())


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _int(x: Any) -> int | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and math.isfinite(x) and x == int(x):
        return int(x)
    return None


def _secs(x: Any) -> str:
    v = _num(x)
    return f"{v:.3g} s" if v is not None else "? s"


def _node_of(ev: Event) -> str | None:
    node = ev.data.get("node")
    if node:
        return str(node)
    return writer_node(ev.writer)


class _Fields(dict):
    """An event's data for ``str.format_map``: a missing field reads ``None``, as ``d.get`` does."""

    def __missing__(self, key: str) -> None:
        return None


#: the labels that only name the event's fields (the others are composed in :func:`mark_label`)
_LABELS = {
    EventKind.RECOVERY_FALLBACK.value: "fallback: replica group {replica_group} restored {tier} step {step}",
    EventKind.CHECKPOINT_RESTORED.value: "restored {tier} step {step}",
    EventKind.CHECKPOINT_CORRUPT.value: "corrupt {tier} checkpoint step {step}: {reason}",
    EventKind.CHECKPOINT_FAILED.value: "{tier} checkpoint step {step} failed: {reason}",
    EventKind.CHECKPOINT_SAVED.value: "checkpoint {tier} step {step}",
    EventKind.ELASTIC_SCALED.value: ("scaled {old_world_size} -> {new_world_size} ranks at step {step}"
                                     " (accumulation {old_accumulation_steps} -> {accumulation_steps})"),
    EventKind.JOB_FAILED.value: "job failed: {reason} ({restarts} restarts; no requeue)",
    EventKind.FINISHED.value: "finished: {status}",
    EventKind.STARTED.value: "started ({world_size} ranks)",
    EventKind.SUBMITTED.value: "submitted to {cluster}",
}


def mark_label(ev: Event) -> str:
    """One human line for a mark or timeline entry: what happened, where (rank, node), how long."""
    d, k = ev.data, ev.kind
    if k == EventKind.FAULT_DETECTED.value:
        if d.get("reason") == FaultReason.NODE_DOWN:
            ranks = d.get("rank") if isinstance(d.get("rank"), list) else [d.get("rank")]
            which = f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"
            return f"fault: node {d.get('node')} down (Slurm: {d.get('slurm_state') or 'DOWN'}), {which}"
        if d.get("reason") == FaultReason.HANG:
            section = f" in section {d.get('section')}" if d.get("section") else ""
            return f"hang: rank {d.get('rank')} on {d.get('node')} made no progress for {_secs(d.get('stalled_s'))}{section}"
        stopped = stopped_ranks(d)[:MAX_NODE_RANKS]
        then = f"; its agent stopped {_ranks_text(stopped)}" if stopped else ""
        return f"fault: rank {d.get('rank')} on {d.get('node')} ({d.get('signal') or d.get('reason')}){then}"
    if k == EventKind.RECOVERY_STARTED.value:
        return f"recovery started on {_node_of(ev) or '?'} ({d.get('reason') or 'restart'})"
    if k == EventKind.RECOVERY_COMPLETED.value:
        down = _num(d.get("downtime_s"))
        took = f" in {down:.1f} s" if down is not None else ""
        step = _int(d.get("restored_step"))
        step = _int(d.get("resumed_step")) if step is None else step
        at = "" if step is None else f" (step {step})"
        if d.get("mode") == "checkpointless":
            return f"recovered{took} from the live replicas{at}"
        if d.get("restored_from") in (None, "none"):
            return f"recovered{took} from step 0 (no checkpoint yet)"
        return f"recovered{took} from {d.get('restored_from')}{at}"
    if k == EventKind.HEALTH_CHECKED.value:
        checks = d.get("checks") if isinstance(d.get("checks"), dict) else {}
        if not _health_ok(d):
            failed = [n for n, c in checks.items() if isinstance(c, dict) and c.get("status") == "failed"]
            return f"health checks failed on {_node_of(ev) or '?'}: {', '.join(failed) or '?'} ({_secs(d.get('seconds'))})"
        return f"health checks passed on {_node_of(ev) or '?'} ({len(checks)} checks, {_secs(d.get('seconds'))})"
    if k == EventKind.HEALTH_FAILED.value:
        detail = f" — {d.get('detail')}" if d.get("detail") else ""
        return f"health check failed on {_node_of(ev) or '?'}: {d.get('check')}{detail}"
    if k == EventKind.NODE_EXCLUDED.value:
        faults = d.get("faults")
        counted = f" ({faults} fault{'' if faults == 1 else 's'})" if isinstance(faults, int) and faults else ""
        return f"{_node_of(ev) or '?'} excluded: {d.get('reason') or 'no reason given'}{counted}"
    if k == EventKind.STRAGGLER_DETECTED.value:
        score = _num(d.get("score"))
        times = f"{score:.2g}x" if score is not None else "?x"
        return (f"straggler: rank {d.get('rank')} on {d.get('node')} is {times} slower "
                f"({_secs(d.get('step_s'))} a step vs {_secs(d.get('median_step_s'))}; {d.get('action') or 'report'})")
    template = _LABELS.get(k)
    return template.format_map(_Fields(d)) if template else k


def _writer_rank(writer: str) -> int | None:
    if writer.startswith(RANK_WRITER_PREFIX):
        try:
            return int(writer[len(RANK_WRITER_PREFIX):])
        except ValueError:
            return None
    return None


class JobAggregate:
    """The one fold of a job's events into lanes, a compact timeline and a downsampled series.

    Args:
        max_buckets: buckets of the step series (memory: O(max_buckets)); a power of two >= 16.
        max_spans: spans kept per lane; beyond it the oldest two neighbouring spans of a kind
            merge (their counts add up).
        max_marks: marks kept per lane; beyond it marks are counted (``dropped_marks``) but not kept.
        state: a :meth:`to_state` dict to resume from (then the other arguments come from it).

    Attributes:
        t0, t1: time of the first and last event folded (s since the epoch; None before any).
        steps: highest step seen + 1 (None before any step event).
        events: events folded.
        ranks: ranks seen (sorted list from :attr:`ranks_sorted`).

    Raises:
        ValueError: ``state`` of another version, or bad arguments.
    """

    def __init__(self, max_buckets: int = 2048, max_spans: int = 512, max_marks: int = 2000,
                 state: dict | None = None):
        if state is not None:
            self._load(state)
            return
        if max_buckets < 16 or max_buckets & (max_buckets - 1):
            raise ValueError(f"max_buckets {max_buckets} must be a power of two >= 16")
        self.max_buckets, self.max_spans, self.max_marks = max_buckets, max_spans, max_marks
        self.t0: float | None = None
        self.t1: float | None = None
        self.steps: int | None = None
        self.events = 0
        self.dropped_marks = 0
        self.ranks: set[int] = set()
        self._lanes: dict[str, dict] = {}      # lane -> {"spans": [...], "marks": [...]}
        self._open: dict[str, dict] = {}       # "lane|kind|tier" -> the span still growing
        self._breaks: dict[str, float] = {}    # "*" -> time of the last span-breaking event
        self._checks: list[dict] = []          # the nodes' health.checked results (timeline entries)
        self._rank_node: dict[int, str] = {}   # rank -> its node, as the events named it
        self._node_group: dict[str, int] = {}  # node -> its replica group (checkpointless), as events named it
        self.per_node: int | None = None       # ranks per node, as submitted/started said
        self._node_view: tuple[int, dict] | None = None  # (events folded, node lanes) of the last summary
        self.width = 1                         # steps per bucket
        self._buckets: list[list | None] = [None] * max_buckets

    # ---- folding ------------------------------------------------------------------------
    def fold(self, ev: Event) -> None:
        """Fold one event (any kind of schema v1; unknown data fields are ignored)."""
        self.events += 1
        t = ev.time
        self.t0 = t if self.t0 is None or t < self.t0 else self.t0
        self.t1 = t if self.t1 is None or t > self.t1 else self.t1
        wr = _writer_rank(ev.writer)
        if wr is not None:
            self.ranks.add(wr)
        k, d = ev.kind, ev.data
        self._learn_node(ev, wr)
        if k == EventKind.STEP.value:
            step = _int(d.get("step"))
            if step is None:
                return
            self.steps = step + 1 if self.steps is None else max(self.steps, step + 1)
            lane = str(wr) if wr is not None else "job"
            self._span(lane, "step", None, t, step)
            self._bucket(step, t, _num(d.get("loss")), _num(d.get("steps_per_s")))
            return
        if k == EventKind.CHECKPOINT_SAVED.value:
            step = _int(d.get("step"))
            if step is None:
                return
            rank = _int(d.get("rank"))
            lane = str(wr if wr is not None else rank) if (wr is not None or rank is not None) else "job"
            ranks = d.get("ranks")  # a node's one memory event: its ranks (runtime/checkpoint/node_saves.py)
            lanes = [str(_int(r)) for r in ranks[:MAX_NODE_RANKS] if _int(r) is not None] \
                if isinstance(ranks, list) and rank is None else []
            for lane in lanes or [lane]:
                self._span(lane, "checkpoint", str(d.get("tier") or "?"), t, step)
            return
        if k == EventKind.HEALTH_CHECKED.value:
            self._check(ev)
            return
        if k not in MARK_CATEGORIES:
            return
        lanes = self._mark_lanes(ev, wr)
        for lane in lanes:
            self._mark(lane, ev)
        if k == EventKind.FAULT_DETECTED.value and (stopped := stopped_ranks(d)):
            self._stopped_marks(ev, stopped)
        if k in _BREAKS:  # a fault, recovery or rescale ends every lane's runs
            self._breaks["*"] = max(self._breaks.get("*", t), t)

    def _learn_node(self, ev: Event, wr: int | None) -> None:
        """Note the node of the rank(s) an event names with a ``node`` (a memory checkpoint, a
        restore, a fault, a straggler; a node-down fault names all its ranks), and the ranks
        per node from ``submitted`` (``procs_per_node``) or ``started`` (``world_size / nodes``)."""
        d = ev.data
        if ev.kind in (EventKind.SUBMITTED.value, EventKind.STARTED.value):
            ppn = _int(d.get("procs_per_node"))
            ws, nodes = _int(d.get("world_size")), _int(d.get("nodes"))
            if ppn is None and ws and nodes and ws % nodes == 0:
                ppn = ws // nodes
            if ppn and ppn > 0 and (self.per_node is None or ev.kind == EventKind.SUBMITTED.value):
                self.per_node = ppn
            return
        node = d.get("node")
        if not isinstance(node, str) or not node or ev.kind in _JOB_LEVEL:
            return
        group = _int(d.get("replica_group"))
        if group is not None and len(self._node_group) < 100_000:
            self._node_group[node] = group
        r = d.get("rank")
        ranks = [_int(x) for x in r] if isinstance(r, list) else [_int(r) if r is not None else wr]
        for x in ranks:
            if x is not None and x >= 0:
                self._rank_node[x] = node

    def _mark_lanes(self, ev: Event, wr: int | None) -> list[str]:
        """The lanes a mark goes to: the rank(s) it names (``data.rank``: int or list), else
        the writing rank, else the job lane; job-level kinds always go to the job lane."""
        if ev.kind in _JOB_LEVEL:
            return ["job"]
        r = ev.data.get("rank")
        if isinstance(r, list):
            ranks = [x for x in (_int(v) for v in r) if x is not None]
            if ranks:
                for x in ranks:
                    self.ranks.add(x)
                return [str(x) for x in ranks]
        ri = _int(r)
        if ri is not None:
            self.ranks.add(ri)
            return [str(ri)]
        if wr is not None:
            return [str(wr)]
        return ["job"]

    def _lane(self, lane: str) -> dict:
        ln = self._lanes.get(lane)
        if ln is None:
            ln = self._lanes[lane] = {"spans": [], "marks": []}
        return ln

    def _span(self, lane: str, kind: str, tier: str | None, t: float, step: int) -> None:
        key = f"{lane}|{kind}|{tier or ''}"
        sp = self._open.get(key)
        brk = self._breaks.get("*", -math.inf)
        if sp is not None and step > sp["step1"] and not (sp["t1"] <= brk < t):
            sp["t1"], sp["step1"] = max(sp["t1"], t), step
            sp["count"] += 1
            return
        if sp is not None and sp["step0"] <= step <= sp["step1"] and sp["t0"] <= t <= sp["t1"]:
            sp["count"] += 1  # a late duplicate inside the run
            return
        sp = {"kind": kind, "t0": t, "t1": t, "step0": step, "step1": step, "count": 1}
        if tier is not None:
            sp["tier"] = tier
        self._open[key] = sp
        spans = self._lane(lane)["spans"]
        spans.append(sp)
        if len(spans) > self.max_spans:
            self._merge_oldest(spans, kind, tier)

    def _merge_oldest(self, spans: list[dict], kind: str, tier: str | None) -> None:
        same = [i for i, s in enumerate(spans) if s["kind"] == kind and s.get("tier") == tier]
        if len(same) < 2:
            spans.pop(0)
            return
        a, b = spans[same[0]], spans[same[1]]
        a.update(t0=min(a["t0"], b["t0"]), t1=max(a["t1"], b["t1"]), step0=min(a["step0"], b["step0"]),
                 step1=max(a["step1"], b["step1"]), count=a["count"] + b["count"])
        del spans[same[1]]
        for key, sp in list(self._open.items()):
            if sp is b:
                self._open[key] = a

    def _mark(self, lane: str, ev: Event) -> None:
        marks = self._lane(lane)["marks"]
        if len(marks) >= self.max_marks:
            self.dropped_marks += 1
            return
        d = ev.data
        cat = MARK_CATEGORIES[ev.kind]
        if ev.kind == EventKind.FAULT_DETECTED.value and d.get("reason") == FaultReason.HANG:
            cat = "hang"
        m: dict[str, Any] = {"kind": ev.kind, "cat": cat, "t": ev.time, "rank": None if lane == "job" else int(lane),
                             "label": mark_label(ev), "writer": ev.writer, "seq": ev.seq}
        node = _node_of(ev)
        if node:
            m["node"] = node
        for f in ("step", "restored_step", "tier", "reason", "downtime_s", "score"):
            v = d.get(f)
            if isinstance(v, (str, int, float)) and not isinstance(v, bool):
                m[f] = v
        if isinstance(d.get("root_cause"), bool):  # a fault caused by another rank's is False
            m["root_cause"] = d["root_cause"]
        marks.append(m)

    def _stopped_marks(self, ev: Event, stopped: list[int]) -> None:
        """A mark on each lane of ``stopped_ranks`` (the ranks a node's agent stopped because
        the event's rank failed, :meth:`hyperpod_lab.node.launch.AgentEvents.worker_failed`; at
        most :data:`MAX_NODE_RANKS`): ``root_cause: false``, ``stopped_by`` (the failed rank),
        a consequence as a per-rank event of one was. The timeline lists the event once."""
        first = _int(ev.data.get("rank"))
        node = _node_of(ev)
        for ri in stopped[:MAX_NODE_RANKS]:
            if ri == first:
                continue
            self.ranks.add(ri)
            marks = self._lane(str(ri))["marks"]
            if len(marks) >= self.max_marks:
                self.dropped_marks += 1
                continue
            m: dict[str, Any] = {"kind": ev.kind, "cat": MARK_CATEGORIES[ev.kind], "t": ev.time, "rank": ri,
                                 "label": f"stopped by its agent: rank {first} failed" + (f" on {node}" if node else ""),
                                 "writer": ev.writer, "seq": ev.seq, "reason": "SIGTERM (stopped by its agent)",
                                 "root_cause": False, "stopped_by": first}
            if node:
                m["node"] = node
            marks.append(m)

    def _check(self, ev: Event) -> None:
        """Keep a node's pre-flight result (``health.checked``) as a timeline entry (not a lane
        mark); counted in ``dropped_marks`` beyond ``max_marks``."""
        if len(self._checks) >= self.max_marks:
            self.dropped_marks += 1
            return
        ok = _health_ok(ev.data)
        c: dict[str, Any] = {"kind": ev.kind, "cat": "health", "t": ev.time, "rank": None, "label": mark_label(ev),
                             "writer": ev.writer, "seq": ev.seq, "ok": ok}
        node = _node_of(ev)
        if node:
            c["node"] = node
        self._checks.append(c)

    def _bucket(self, step: int, t: float, loss: float | None, sps: float | None) -> None:
        if step < 0:
            return
        while step // self.width >= self.max_buckets:
            self._halve()
        i = step // self.width
        b = self._buckets[i]
        # [count, step_lo, step_hi, t_last, loss_min, step@min, loss_max, step@max, sps_min, sps_max, loss_last]
        if b is None:
            self._buckets[i] = [1, step, step, t, loss, step, loss, step, sps, sps, loss]
            return
        b[0] += 1
        b[1], b[2] = min(b[1], step), max(b[2], step)
        if t >= b[3]:
            b[3] = t
            if loss is not None:
                b[10] = loss
        if loss is not None:
            if b[4] is None or loss < b[4]:
                b[4], b[5] = loss, step
            if b[6] is None or loss > b[6]:
                b[6], b[7] = loss, step
        if sps is not None:
            b[8] = sps if b[8] is None else min(b[8], sps)
            b[9] = sps if b[9] is None else max(b[9], sps)

    @staticmethod
    def _merge(a: list | None, b: list | None) -> list | None:
        if a is None or b is None:
            return a if b is None else b
        out = list(a)
        out[0] = a[0] + b[0]
        out[1], out[2] = min(a[1], b[1]), max(a[2], b[2])
        if b[3] >= a[3]:
            out[3], out[10] = b[3], b[10] if b[10] is not None else a[10]
        if b[4] is not None and (a[4] is None or b[4] < a[4]):
            out[4], out[5] = b[4], b[5]
        if b[6] is not None and (a[6] is None or b[6] > a[6]):
            out[6], out[7] = b[6], b[7]
        out[8] = b[8] if a[8] is None else (a[8] if b[8] is None else min(a[8], b[8]))
        out[9] = b[9] if a[9] is None else (a[9] if b[9] is None else max(a[9], b[9]))
        return out

    def _halve(self) -> None:
        bs = self._buckets
        n = len(bs)
        self._buckets = [self._merge(bs[2 * i], bs[2 * i + 1]) for i in range(n // 2)] + [None] * (n // 2)
        self.width *= 2

    # ---- views ----------------------------------------------------------------------------
    @property
    def ranks_sorted(self) -> list[int]:
        """Ranks seen, ascending."""
        return sorted(self.ranks)

    def lanes(self) -> dict[str, dict]:
        """``{lane: {"spans": [...], "marks": [...]}}`` with lane ``"job"`` and one per rank
        (``"0"``, ``"1"``, ...; every rank seen, even without spans or marks).

        A span is ``{kind: "step"|"checkpoint", t0, t1 (s since the epoch), step0, step1 (first
        and last step), count (events in it), tier (checkpoints: memory/peer/persistent/s3/...)}``;
        a run ends at a step that does not follow (a restart went back) or after a fault,
        recovery or rescale. A mark is ``{kind (event kind), cat (fault/hang/recovery/restore/
        straggler/health/exclusion/scaling/checkpoint-error/lifecycle), t, rank (None on the job
        lane), label, writer, seq, node?, step?, restored_step?, tier?, reason?, downtime_s?,
        score?, root_cause? (bool: False for a fault another rank's caused)}``. Spans and marks are sorted by time.
        """
        out: dict[str, dict] = {"job": {"spans": [], "marks": []}}
        for r in self.ranks_sorted:
            out[str(r)] = {"spans": [], "marks": []}
        for lane, ln in self._lanes.items():
            out[lane] = {"spans": sorted((dict(s) for s in ln["spans"]), key=lambda s: (s["t0"], s["step0"])),
                         "marks": sorted((dict(m) for m in ln["marks"]), key=lambda m: (m["t"], m["seq"]))}
        return out

    def node_of(self, rank: int, _blocks: dict[int, set[str]] | None = None) -> str:
        """The lane ``rank`` is drawn on by default: its node's name as the events named it (a
        memory checkpoint, a restore, a fault, ...); else, when the other ranks of its block of
        :attr:`per_node` ranks (``DEFAULT_RANKS_PER_NODE`` when the events do not say; the
        ranks one node runs, as torchrun numbers them node by node) were all named on one node,
        that node; else ``"ranks A-B"``, its block."""
        node = self._rank_node.get(rank)
        if node is not None:
            return node
        ppn = self.per_node or DEFAULT_RANKS_PER_NODE
        if _blocks is None:
            _blocks = self._blocks()
        named = _blocks.get(rank // ppn)
        if named is not None and len(named) == 1:
            return next(iter(named))
        a = rank // ppn * ppn
        return f"ranks {a}-{a + ppn - 1}"

    def _blocks(self) -> dict[int, set[str]]:
        """Block of ``per_node`` ranks -> the nodes its ranks were named on."""
        ppn = self.per_node or DEFAULT_RANKS_PER_NODE
        blocks: dict[int, set[str]] = {}
        for r, n in self._rank_node.items():
            blocks.setdefault(r // ppn, set()).add(n)
        return blocks

    def _breaks_sorted(self) -> list[float]:
        """Times of the span-breaking marks (a fault, recovery, rescale, job failure), ascending."""
        return sorted({m["t"] for ln in self._lanes.values() for m in ln["marks"] if m["kind"] in _BREAKS})

    def _nodes_view(self) -> dict[str, Any]:
        """``{"order": [node lane names, by lowest rank], "ranks": {node: [ranks]}, "lanes":
        {"job" | node: lane}}``, built once per change (the events folded) and kept."""
        if self._node_view is not None and self._node_view[0] == self.events:
            return self._node_view[1]
        ranks: dict[str, list[int]] = {}
        blocks = self._blocks()
        for r in self.ranks_sorted:
            ranks.setdefault(self.node_of(r, blocks), []).append(r)
        breaks = self._breaks_sorted()
        lanes = {"job": self._job_lane()}
        for node, rs in ranks.items():
            lanes[node] = self._merged_lane(node, rs, breaks)
        view = {"order": list(ranks), "ranks": ranks, "lanes": lanes}
        self._node_view = (self.events, view)
        return view

    def _job_lane(self) -> dict:
        ln = self._lanes.get("job", {"spans": [], "marks": []})
        return {"spans": sorted((dict(s) for s in ln["spans"]), key=lambda s: (s["t0"], s["step0"])),
                "marks": sorted((dict(m) for m in ln["marks"]), key=lambda m: (m["t"], m["seq"]))}

    def _merged_lane(self, node: str, ranks: list[int], breaks: list[float]) -> dict:
        """One node's lane: its ranks' spans merged per kind and tier (runs that overlap, or
        follow with no span break between them, are one span: ``count`` adds up, ``ranks``
        counts the ranks in it) and its ranks' marks merged (one event on several of its ranks,
        or the same label within ``RESTORE_WINDOW_S``, is one mark with ``ranks``; labels of
        several ranks end in `` · ranks ...``), at most ``NODE_MARKS`` marks (faults and hangs
        first; ``dropped_marks`` counts the others)."""
        def broken(a: float, b: float) -> bool:
            i = bisect.bisect_left(breaks, a)
            return i < len(breaks) and breaks[i] < b

        by_key: dict[tuple, list[tuple[dict, int]]] = {}
        marks: dict[tuple, dict] = {}
        for r in ranks:
            ln = self._lanes.get(str(r))
            if ln is None:
                continue
            for sp in ln["spans"]:
                by_key.setdefault((sp["kind"], sp.get("tier")), []).append((sp, r))
            for m in ln["marks"]:
                key = (m["writer"], m["seq"], "stopped_by" in m)  # the stopped ranks' marks apart from the event's own
                got = marks.get(key)
                if got is None:
                    marks[key] = got = dict(m, ranks=[])
                got["ranks"].append(r)
        spans: list[dict] = []
        for (kind, tier), group in by_key.items():
            group.sort(key=lambda x: (x[0]["t0"], x[0]["step0"]))
            cur: dict | None = None
            members: set[int] = set()
            for sp, r in group:
                if cur is not None and (sp["t0"] <= cur["t1"] or not broken(cur["t1"], sp["t0"])):
                    cur.update(t1=max(cur["t1"], sp["t1"]), step0=min(cur["step0"], sp["step0"]),
                               step1=max(cur["step1"], sp["step1"]), count=cur["count"] + sp["count"])
                    members.add(r)
                    cur["ranks"] = len(members)
                    continue
                cur = {"kind": kind, "t0": sp["t0"], "t1": sp["t1"], "step0": sp["step0"], "step1": sp["step1"],
                       "count": sp["count"], "ranks": 1}
                if tier is not None:
                    cur["tier"] = tier
                members = {r}
                spans.append(cur)
        spans.sort(key=lambda x: (x["t0"], x["step0"]))
        merged: list[dict] = []
        same: dict[tuple, dict] = {}  # (kind, label) -> its latest merged mark
        for m in sorted(marks.values(), key=lambda m: (m["t"], m["seq"])):
            key = (m["kind"], m["label"])
            first = same.get(key)
            if first is not None and m["t"] - first["t"] <= RESTORE_WINDOW_S:
                first["ranks"].extend(x for x in m["ranks"] if x not in first["ranks"])
                continue
            same[key] = m
            merged.append(m)
        for m in merged:
            m["ranks"].sort()
            m["rank"] = m["ranks"][0]
            if len(m["ranks"]) > 1:
                m["label"] = _with_ranks(m["label"], m["ranks"])
        dropped = 0
        if len(merged) > NODE_MARKS:
            first_kept = sorted(merged, key=lambda m: (m["cat"] not in ("fault", "hang"), m["t"]))[:NODE_MARKS]
            dropped = len(merged) - NODE_MARKS
            merged = sorted(first_kept, key=lambda m: (m["t"], m["seq"]))
        faults = sum(1 for m in merged if m["cat"] in ("fault", "hang"))
        return {"spans": spans[-self.max_spans:], "marks": merged, "ranks": _ranks_text(ranks),
                "rank_count": len(ranks), "faults": faults, "dropped_marks": dropped,
                "replica_group": self._node_group.get(node)}

    def node_lanes(self) -> dict[str, dict]:
        """``{lane: {"spans", "marks", ...}}``: the lane ``"job"`` (as in :meth:`lanes`) and one
        per node (:meth:`node_of`), in the order of their lowest rank. A node's lane merges its
        ranks' lanes: spans ``{kind, t0, t1, step0, step1, count (events of all its ranks),
        ranks (how many ranks the run spans), tier?}``; marks as :meth:`lanes`' with ``ranks``
        (the node's ranks it is about; ``rank`` the lowest; a label about several ranks ends in
        `` · ranks 8-15``), e.g. ``"fault: rank 1337 on n167 (exception)"``; plus ``ranks``
        (``"ranks 8-15"``), ``rank_count``, ``faults`` (fault and hang marks kept) and
        ``dropped_marks`` (beyond ``NODE_MARKS``) and ``replica_group`` (a checkpointless job's
        group on that node, as its events name it with the node: a fault, a replica restore;
        else None). Size: O(nodes x (spans + NODE_MARKS))."""
        return self._nodes_view()["lanes"]

    def nodes_line(self, most: int = 8) -> str | None:
        """One line about the job's nodes for a summary (the notebook widget's header, the CLI's
        ``nodes`` row): ``"256 nodes x 8 ranks; faults on n167 (rank 1337)"``, the nodes whose
        lanes have fault or hang marks (at most ``most``, then ``+N more``), or ``"...; no
        faults"``; ``"3 nodes, 20 ranks"`` when their sizes differ. None before any rank."""
        view = self._nodes_view()
        if not view["order"]:
            return None
        sizes = {len(rs) for rs in view["ranks"].values()}
        n = len(view["order"])
        per = sizes.pop() if len(sizes) == 1 else None
        head = (f"{n} node{'' if n == 1 else 's'} x {per} rank{'' if per == 1 else 's'}" if per is not None
                else f"{n} nodes, {len(self.ranks)} ranks")
        hit = []
        for node in view["order"]:
            ranks = sorted({r for m in view["lanes"][node]["marks"] if m["cat"] in ("fault", "hang")
                            for r in m.get("ranks") or [m["rank"]]})
            if ranks:
                hit.append(f"{node} ({_ranks_text(ranks)})")
        if not hit:
            return f"{head}; no faults"
        more = f", +{len(hit) - most} more" if len(hit) > most else ""
        return f"{head}; faults on {', '.join(hit[:most])}{more}"

    def node_ranks(self, node: str) -> list[int]:
        """The ranks drawn on ``node``'s lane (:meth:`node_of`), ascending; [] for no such lane."""
        return list(self._nodes_view()["ranks"].get(node, []))

    def timeline(self) -> list[dict]:
        """The compact timeline, sorted by time: the lines both the Lab's dashboard and the
        notebook widget show, as they come.

        * **checkpoint runs**: one entry per tier per run between two span breaks (a fault,
          ``recovery.started``, a rescale, ``job.failed``): all ranks' spans of that tier with no
          break between them (or overlapping in time) are one line, so one checkpoint saved by
          two ranks a few ms apart is one line. ``{kind: "checkpoint", cat: "checkpoint", tier,
          t, t1 (s since the epoch), step0, step1, count (checkpoints the rank that saved most
          saved in it), ranks, label}``, label e.g. ``"checkpoint peer steps 4-40 (x19) · ranks
          0, 1"`` (`` · ranks ...`` when more than one rank; 3+ consecutive ranks as ``0-63``).
        * **incidents**: one entry per fault, hang, recovery (completed, fallback), straggler,
          health failure, node exclusion, rescale, checkpoint error and the job's end: a mark
          (``{kind, cat, t, rank, label, writer, seq, ...}``, see :meth:`lanes`); a mark on several
          lanes (a node-down fault naming its ranks) is listed once. A fault another rank's
          caused (``root_cause: false``: a rank torchrun stopped because another failed) is not
          listed (it stays a mark of its lane): the root cause's line is the incident.
        * **restores**: one entry per tier and step restored within ``RESTORE_WINDOW_S`` (60 s)
          of its first restore, whatever the number of ranks: the first rank's mark with
          ``ranks`` (all that restored it) and e.g. ``"restored memory step 40 · ranks 0, 1"``.
        * **pre-flight health checks**: one entry per node's ``health.checked`` result
          ``{kind: "health.checked", cat: "health", t, rank: None, node, ok (bool), label,
          writer, seq}``, e.g. ``"health checks passed on n1 (6 checks, 1.2 s)"``.

        Size: O(spans + marks + checks) kept, never one entry per step.
        """
        entries: list[dict] = []
        breaks = self._breaks_sorted()

        def broken(a: float, b: float) -> bool:  # a span break at a <= t < b
            i = bisect.bisect_left(breaks, a)
            return i < len(breaks) and breaks[i] < b

        by_tier: dict[str, list[tuple[dict, str]]] = {}
        for lane, ln in self._lanes.items():
            for s in ln["spans"]:
                if s["kind"] == "checkpoint":
                    by_tier.setdefault(s.get("tier", "?"), []).append((s, lane))
        for tier, spans in by_tier.items():
            spans.sort(key=lambda x: (x[0]["t0"], x[0]["step0"]))
            groups: list[list[tuple[dict, str]]] = []
            end = -math.inf
            for s, lane in spans:
                if groups and (s["t0"] <= end or not broken(end, s["t0"])):
                    groups[-1].append((s, lane))
                    end = max(end, s["t1"])
                else:
                    groups.append([(s, lane)])
                    end = s["t1"]
            for group in groups:
                ss = [g[0] for g in group]
                per_lane: dict[str, int] = {}
                for s, lane in group:
                    per_lane[lane] = per_lane.get(lane, 0) + s["count"]
                e = {"kind": "checkpoint", "cat": "checkpoint", "tier": tier, "t": min(x["t0"] for x in ss),
                     "t1": max(x["t1"] for x in ss), "step0": min(x["step0"] for x in ss),
                     "step1": max(x["step1"] for x in ss), "count": max(per_lane.values()),
                     "ranks": sorted({int(lane) for lane in per_lane if lane != "job"})}
                steps = f"step {e['step0']}" if e["step0"] == e["step1"] else f"steps {e['step0']}-{e['step1']}"
                e["label"] = _with_ranks(f"checkpoint {tier} {steps} (x{e['count']})", e["ranks"])
                entries.append(e)
        marks: dict[tuple[str, int], dict] = {}
        for ln in self._lanes.values():
            for m in ln["marks"]:
                if m["kind"] in _TIMELINE and "stopped_by" not in m:  # (a stopped rank's mark: its event's line)
                    marks.setdefault((m["writer"], m["seq"]), m)
        restores: dict[tuple, dict] = {}  # (tier, step) -> its latest restore line
        for m in sorted(marks.values(), key=lambda m: (m["t"], m["seq"])):
            if m["kind"] == EventKind.FAULT_DETECTED.value and m.get("root_cause") is False:
                continue
            e = dict(m)
            if m["kind"] == EventKind.CHECKPOINT_RESTORED.value:
                key = (m.get("tier"), m.get("step"))
                first = restores.get(key)
                if first is not None and m["t"] - first["t"] <= RESTORE_WINDOW_S:
                    if m["rank"] is not None and m["rank"] not in first["ranks"]:
                        first["ranks"].append(m["rank"])
                    continue
                e["ranks"] = [m["rank"]] if m["rank"] is not None else []
                restores[key] = e
            entries.append(e)
        for e in entries:
            if e["kind"] == EventKind.CHECKPOINT_RESTORED.value:
                e["ranks"].sort()
                e["label"] = _with_ranks(e["label"], e["ranks"])
        entries.extend(dict(c) for c in self._checks)
        entries.sort(key=lambda e: (e["t"], e.get("seq", -1)))
        return entries

    def series(self, max_points: int = 2000) -> dict[str, Any]:
        """Step -> loss and steps/s, downsampled to at most ``max_points`` points (>= 2).

        Neighbouring buckets are grouped so that at most ``max_points // 2`` groups remain; each
        group gives its lowest and highest loss at the steps they came at (in step order; one
        point when they coincide), so a peak or a dip of one step survives. ``steps_per_s`` at
        those two points is the group's minimum and maximum rate, in the same order as the loss.

        Returns:
            ``{"step": [int], "loss": [float|None], "steps_per_s": [float|None], "t": [s since
            the epoch], "width": steps per bucket, "points": len(step)}``.
        """
        max_points = max(2, int(max_points))
        full = [b for b in self._buckets if b is not None]
        group = max(1, math.ceil(len(full) / max(1, max_points // 2)))
        steps: list[int] = []
        loss: list[float | None] = []
        sps: list[float | None] = []
        ts: list[float] = []
        for i in range(0, len(full), group):
            b = None
            for x in full[i:i + group]:
                b = self._merge(b, x)
            assert b is not None
            if b[4] is None:  # no loss in it: one point at its last step
                steps.append(b[2])
                loss.append(None)
                sps.append(b[9])
                ts.append(b[3])
                continue
            lo, hi = (b[5], b[4]), (b[7], b[6])
            first, second = (lo, hi) if lo[0] <= hi[0] else (hi, lo)
            rates = (b[8], b[9]) if first is lo else (b[9], b[8])
            steps.append(first[0])
            loss.append(first[1])
            sps.append(rates[0])
            ts.append(b[3])
            if second[0] != first[0]:
                steps.append(second[0])
                loss.append(second[1])
                sps.append(rates[1])
                ts.append(b[3])
            elif rates[0] != rates[1] and b[1] != b[2]:
                # one loss value all through (min == max): the rate's other extreme at the
                # bucket's other end, with that same loss
                other = b[2] if first[0] != b[2] else b[1]
                at = len(steps) if other > first[0] else len(steps) - 1
                steps.insert(at, other)
                loss.insert(at, first[1])
                sps.insert(at, rates[1])
                ts.insert(at, b[3])
        return {"step": steps, "loss": loss, "steps_per_s": sps, "t": ts, "width": self.width, "points": len(steps)}

    def summary(self, max_points: int = 2000, node: str | None = None) -> dict[str, Any]:
        """Everything a dashboard draws, sized by nodes, not ranks: ``{t0, t1, steps, ranks
        (how many ranks were seen), nodes (the node lanes' names, by lowest rank), events,
        dropped_marks, lanes (:meth:`node_lanes`: "job" and one per node), expanded, timeline,
        series}`` (see :meth:`timeline`, :meth:`series`); a timeline entry about more than
        ``SUMMARY_RANKS`` ranks lists the first of them in ``ranks`` and all in ``rank_count``
        (its label names them all, as ``ranks 0-2047``).

        Args:
            max_points: most series points.
            node: a node lane's name (from ``nodes``) to expand: ``expanded`` is then ``{"node",
                "lanes": {"<rank>": lane}}`` with that node's ranks' own lanes (as :meth:`lanes`);
                None (or a name that is no lane) gives ``expanded: None``.
        """
        view = self._nodes_view()
        expanded = None
        if node is not None and node in view["ranks"]:
            per_rank = self.lanes_of(view["ranks"][node])
            expanded = {"node": node, "lanes": per_rank}
        return {"t0": self.t0, "t1": self.t1, "steps": self.steps, "ranks": len(self.ranks),
                "nodes": list(view["order"]), "events": self.events, "dropped_marks": self.dropped_marks,
                "lanes": {k: dict(v) for k, v in view["lanes"].items()}, "expanded": expanded,
                "timeline": [_bounded_ranks(e) for e in self.timeline()], "series": self.series(max_points)}

    def lanes_of(self, ranks: list[int]) -> dict[str, dict]:
        """:meth:`lanes` of these ranks only (``{"<rank>": {"spans", "marks"}}``, every one even
        without spans or marks)."""
        out: dict[str, dict] = {}
        for r in sorted(ranks):
            ln = self._lanes.get(str(r), {"spans": [], "marks": []})
            out[str(r)] = {"spans": sorted((dict(s) for s in ln["spans"]), key=lambda s: (s["t0"], s["step0"])),
                           "marks": sorted((dict(m) for m in ln["marks"]), key=lambda m: (m["t"], m["seq"]))}
        return out

    # ---- state ----------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """A JSON-able dict of the whole fold (saved beside a reader's cursor);
        :meth:`from_state` resumes it. Size: O(lanes x (max_spans + max_marks) + max_marks (the
        nodes' health checks) + max_buckets)."""
        lanes = {}
        open_ids = {}
        for lane, ln in self._lanes.items():
            lanes[lane] = {"spans": [dict(s) for s in ln["spans"]], "marks": [dict(m) for m in ln["marks"]]}
            for i, s in enumerate(ln["spans"]):
                open_ids[id(s)] = (lane, i)
        return {"v": STATE_VERSION, "max_buckets": self.max_buckets, "max_spans": self.max_spans,
                "max_marks": self.max_marks, "t0": self.t0, "t1": self.t1, "steps": self.steps,
                "events": self.events, "dropped_marks": self.dropped_marks, "ranks": self.ranks_sorted,
                "lanes": lanes, "open": {k: list(open_ids[id(s)]) for k, s in self._open.items() if id(s) in open_ids},
                "breaks": dict(self._breaks), "checks": [dict(c) for c in self._checks], "width": self.width,
                "rank_node": {str(r): n for r, n in self._rank_node.items()}, "per_node": self.per_node,
                "node_group": dict(self._node_group),
                "buckets": {str(i): b for i, b in enumerate(self._buckets) if b is not None}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "JobAggregate":
        """The aggregate :meth:`to_state` saved. Raises ValueError for another state version
        (e.g. 1, saved before the health checks were kept): fold the job's events again (the
        server's watcher then does, from the start of the job's events)."""
        return cls(state=state)

    def _load(self, s: dict[str, Any]) -> None:
        if not isinstance(s, dict) or s.get("v") != STATE_VERSION:
            raise ValueError(f"aggregate state version {s.get('v') if isinstance(s, dict) else None!r} is not "
                             f"{STATE_VERSION}; fold the job's events again")
        self.max_buckets, self.max_spans, self.max_marks = int(s["max_buckets"]), int(s["max_spans"]), int(s["max_marks"])
        self.t0, self.t1, self.steps = s["t0"], s["t1"], s["steps"]
        self.events, self.dropped_marks = int(s["events"]), int(s.get("dropped_marks", 0))
        self.ranks = set(int(r) for r in s["ranks"])
        self._lanes = {lane: {"spans": [dict(x) for x in ln["spans"]], "marks": [dict(x) for x in ln["marks"]]}
                       for lane, ln in s["lanes"].items()}
        self._open = {}
        for key, (lane, i) in s.get("open", {}).items():
            try:
                self._open[key] = self._lanes[lane]["spans"][int(i)]
            except (KeyError, IndexError):
                pass
        self._breaks = {k: float(v) for k, v in s.get("breaks", {}).items()}
        self._checks = [dict(c) for c in s.get("checks", [])]
        self._rank_node = {int(r): str(n) for r, n in s.get("rank_node", {}).items()}
        self._node_group = {str(n): int(g) for n, g in s.get("node_group", {}).items()}
        self.per_node = s.get("per_node")
        self._node_view = None
        self.width = int(s["width"])
        self._buckets = [None] * self.max_buckets
        for i, b in s.get("buckets", {}).items():
            self._buckets[int(i)] = list(b)
