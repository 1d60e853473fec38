"""Measurement of a job from its events (through the job facts fold, :mod:`hyperpod_lab.fold.facts`),
batch (:func:`measure_from_events`) or folded incrementally (:class:`GoodputMeter`), and
projection of the measured costs to another cluster size."""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import asdict
from typing import Any, Iterable

from hyperpod_lab.errors import GoodputInputError
from hyperpod_lab.events import EventKind
from hyperpod_lab.fold.facts import JobFacts
from hyperpod_lab.goodput.band import BAND_FACTOR, rate_inputs, restart_band
from hyperpod_lab.goodput.closed_form import goodput_breakdown
from hyperpod_lab.goodput.scenario import (
    DEFAULT_DETECT_S,
    DEFAULT_HEAL_S,
    DEFAULT_RESTART_S,
    MODEL_MODES,
    SECONDS_PER_HOUR,
    TIER_ORDER,
    Scenario,
    Tier,
    checked_instances,
    checked_probability,
    cluster_mtbf_hours,
    replicas_for,
    tier_survival,
)

_BREAKS = frozenset(k.value for k in (EventKind.STARTED, EventKind.FAULT_DETECTED, EventKind.RECOVERY_STARTED,
                                      EventKind.RECOVERY_COMPLETED, EventKind.HEALTH_CHECKED,
                                      EventKind.HEALTH_FAILED))
_STEP = EventKind.STEP.value
_SAVED = EventKind.CHECKPOINT_SAVED.value
# the order in which lost time is granted when the estimates overlap (see measure_from_events):
# measured intervals first (the pre-flight health checks, a recovery's restore and restart, the
# checkpoint stalls, a hang's stall as its watchdog measured it), then the bounds (detection: an
# upper bound; recomputation: overlaps the first step after a recovery). Straggling is not in it:
# it is time inside the measured step time, taken from the useful time (see measure_from_events)
_LOST_ORDER = ("health_check", "restore", "restart", "checkpoint", "hang", "detect", "recompute")
#: the parts of ``lost_s`` besides ``other``, in display order
LOST_PARTS = ("health_check", "checkpoint", "hang", "detect", "restart", "restore", "recompute", "straggle")

#: items (step events, breaks, checkpoint stalls) a meter holds before it settles the oldest
DEFAULT_WINDOW = 256
#: newest distinct checkpoint steps a meter keeps per tier (dedup of ranks' reports, interval median)
DEFAULT_TIER_WINDOW = 64
#: most checkpoint tiers a meter keeps (tier names come from events; more are ignored)
MAX_TIERS = 32
STATE_VERSION = 1

# kinds of the step clock's items, in their order at equal times: a break at a step's time
# belongs to the pair that ends there, a stall that starts at a step's time to the pair that
# begins there (as in the batch definition: break in (a, b], stall start in [a, b))
_I_BREAK, _I_STEP, _I_STALL = 0, 1, 2


class _StepClock:
    """Running sums of the step time (see :class:`GoodputMeter`): consecutive ``step`` events
    ``a``, ``b`` (by time, writer, seq) with ``b.step > a.step`` and no break in ``(a.t, b.t]``
    add ``max(0, b.t - a.t - stalls starting in [a.t, b.t))`` seconds and ``b.step - a.step``
    steps.

    Items wait in ``items`` (sorted) until more than ``window`` are held; then the oldest is
    settled into the sums: a step closes the open pair (from ``anchor``, the last settled step),
    a break or a stall is charged to it. ``horizon`` is the key of the last settled item; an
    item older than it arrived too late and is left out of the step time (never of the facts or
    the tier counts). ``window=None`` holds everything (the batch function: exact)."""

    def __init__(self, saved: dict | None = None, window: int | None = DEFAULT_WINDOW):
        d = saved or {}
        self.window = window
        self.dt_sum = float(d.get("dt_s", 0.0))     # seconds of the settled pairs
        self.dn_sum = int(d.get("dn", 0))           # steps of the settled pairs
        a = d.get("anchor")
        self.anchor: tuple | None = tuple(a) if a is not None else None   # (t, writer, seq, step)
        h = d.get("horizon")
        self.horizon: tuple | None = tuple(h) if h is not None else None  # key of the last settled item
        self.broken = bool(d.get("broken", False))  # a break settled since the anchor
        self.stall = float(d.get("stall_s", 0.0))   # stalls settled since the anchor (s)
        self.open_keys: dict[tuple, float] = {(k[0], k[1]): float(k[2]) for k in d.get("open_keys", [])}
        self.items: list[tuple] = [tuple(i) for i in d.get("items", [])]
        self._stalls = {(i[2], i[3]): i for i in self.items if i[1] == _I_STALL}

    def to_dict(self) -> dict:
        return {"dt_s": self.dt_sum, "dn": self.dn_sum, "anchor": self.anchor, "horizon": self.horizon,
                "broken": self.broken, "stall_s": self.stall,
                "open_keys": [[k[0], k[1], b] for k, b in self.open_keys.items()],
                "items": [list(i) for i in self.items]}

    def _late(self, item: tuple) -> bool:
        return self.horizon is not None and item[:4] < self.horizon

    def _insert(self, item: tuple) -> None:
        if self._late(item):
            return
        bisect.insort(self.items, item)
        if item[1] == _I_STALL:
            self._stalls[(item[2], item[3])] = item
        while self.window is not None and len(self.items) > self.window:
            old = self.items.pop(0)
            if old[1] == _I_STALL:
                self._stalls.pop((old[2], old[3]), None)
            self._settle(old)

    def add_step(self, t: float, writer: str, seq: int, step: int) -> None:
        self._insert((t, _I_STEP, writer, seq, step))

    def add_break(self, t: float, writer: str, seq: int) -> None:
        self._insert((t, _I_BREAK, writer, seq, None))

    def set_stall(self, tier: str, step: int, start: float, blocked: float) -> None:
        """The checkpoint ``(tier, step)`` blocks ``blocked`` s from ``start`` (its latest aggregate)."""
        key = (tier, step)
        if key in self.open_keys:  # already charged to the open pair: charge the increase
            self.stall += blocked - self.open_keys[key]
            self.open_keys[key] = blocked
            return
        item = (start, _I_STALL, tier, step, blocked)
        old = self._stalls.pop(key, None)
        if old is not None:
            self.items.remove(old)
            if self._late(item):  # moved before the horizon: keep its place, new cost
                item = old[:4] + (blocked,)
        self._insert(item)

    def _settle(self, item: tuple) -> None:
        self.horizon = item[:4]
        kind = item[1]
        if kind == _I_STEP:
            a = self.anchor
            if a is not None:
                dn = item[4] - a[3]
                if dn > 0 and not self.broken:
                    self.dt_sum += max(0.0, item[0] - a[0] - self.stall)
                    self.dn_sum += dn
            self.anchor = (item[0], item[2], item[3], item[4])
            self.broken, self.stall, self.open_keys = False, 0.0, {}
        elif self.anchor is None:
            return  # no step before it: no pair to charge
        elif kind == _I_BREAK:
            self.broken = True
        else:
            self.stall += item[4]
            self.open_keys[(item[2], item[3])] = item[4]
            if self.window is not None and len(self.open_keys) > self.window:
                self.open_keys.pop(next(iter(self.open_keys)))

    def totals(self) -> tuple[float, int]:
        """``(seconds, steps)`` with every held item settled (on a copy: the clock is unchanged)."""
        c = _StepClock.__new__(_StepClock)
        c.window, c.dt_sum, c.dn_sum, c.anchor, c.horizon = None, self.dt_sum, self.dn_sum, self.anchor, self.horizon
        c.broken, c.stall, c.open_keys = self.broken, self.stall, dict(self.open_keys)
        for item in self.items:
            c._settle(item)
        return c.dt_sum, c.dn_sum


class _TierStats:
    """One checkpoint tier: distinct ``(tier, step)`` checkpoints counted, their blocked seconds
    (the slowest rank's each) summed, and the newest ``window`` of them kept ``{step: [blocked_s,
    start]}`` (insertion order) to merge the ranks' reports and for the interval median."""

    def __init__(self, saved: dict | None = None, window: int | None = DEFAULT_TIER_WINDOW):
        d = saved or {}
        self.window = window
        self.count = int(d.get("checkpoints", 0))
        self.blocked_total = float(d.get("blocked_total_s", 0.0))
        self.recent: dict[int, list[float]] = {int(s): [float(b), float(t)] for s, b, t in d.get("recent", [])}

    def to_dict(self) -> dict:
        return {"checkpoints": self.count, "blocked_total_s": self.blocked_total,
                "recent": [[s, b, t] for s, (b, t) in self.recent.items()]}

    def add(self, step: int, blocked: float, start: float) -> list[float] | None:
        """One rank's report; returns the checkpoint's new ``[blocked_s, start]`` when it changed."""
        cur = self.recent.get(step)
        if cur is None:
            self.count += 1
            self.blocked_total += blocked
            cur = self.recent[step] = [blocked, start]
            if self.window is not None and len(self.recent) > self.window:
                self.recent.pop(next(iter(self.recent)))
            return cur
        if blocked > cur[0]:  # the slowest rank's blocked_s (the loop waits for it)
            self.blocked_total += blocked - cur[0]
            cur[0], cur[1] = blocked, min(start, cur[1])
            return cur
        return None

    def interval_steps(self) -> float | None:
        st = sorted(self.recent)
        gaps = [b - a for a, b in zip(st, st[1:]) if b > a]
        return statistics.median(gaps) if gaps else None


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _recovery(inc: dict, step_time: float | None, preflight_runs: list[dict] = ()) -> dict:
    """One recovered incident of the job facts fold as the goodput measurement sees it."""
    down = float(inc["downtime_s"])
    detect = (max(0.0, inc["detected_at"] - inc["last_step_time"])
              if inc["detected_at"] is not None and inc["last_step_time"] is not None else None)
    # a hang: the watchdog's stalled_s is the part of the detection lag the rank spent hung
    hang = float(inc.get("hang_s") or 0.0)
    if detect is not None:
        hang = min(hang, detect)
        detect -= hang
    restore = min(float(inc["restore_s"]), down)
    # the pre-flight health checks run during the downtime (a requeued job checks its nodes again)
    end = float(inc["end_at"])
    health = min(down - restore, sum(_overlap(r["start"], r["end"], end - down, end) for r in preflight_runs))
    reached = (inc["last_step"] + 1) if isinstance(inc["last_step"], int) else 0  # steps done before the fault
    if isinstance(inc.get("resumed_step"), int):
        resume = inc["resumed_step"]  # checkpointless: the step redone first
    elif isinstance(inc["restored_step"], int):
        resume = inc["restored_step"] + 1
    else:
        resume = 0
    redo = max(0, reached - resume)
    return {"time": inc["end_at"], "downtime_s": down, "restored_from": inc["restored_from"],
            "restored_step": inc["restored_step"], "hang_s": hang, "detect_s": detect, "restore_s": restore,
            "health_check_s": health, "restart_s": max(0.0, down - restore - health), "recomputed_steps": redo,
            "recompute_s": redo * step_time if step_time is not None else None}


class GoodputMeter:
    """A job's goodput measurement folded incrementally, one event at a time: what
    :func:`measure_from_events` returns (its :meth:`result`), in memory that does not grow with
    the number of steps or events.

    Faults, recoveries, downtime, steps and wall time come from the job facts fold
    (:class:`hyperpod_lab.fold.facts.JobFacts`, its ``facts``), which the meter feeds; the meter adds
    what the facts do not keep:

    * **step time**: running sums of seconds and steps over consecutive ``step`` events (see
      :func:`measure_from_events`). Pairs are settled ``window`` items (step events, breaks,
      checkpoint stalls) behind the newest, so events that arrive out of time order (another
      writer's file read in a later poll, a checkpoint whose stall began before the step event
      after it) are placed exactly as long as they are less than ``window`` items late; an item
      later than that is left out of the step time only.
    * **tiers**: per tier the number of distinct ``(tier, step)`` checkpoints and the sum of
      their blocked seconds (the slowest rank's each), exact; the newest ``tier_window`` distinct
      checkpoint steps, to merge the ranks' reports of one checkpoint and for ``interval_steps``:
      the median gap between consecutive checkpoint steps **among the newest** ``tier_window``
      (exact while a tier has at most that many; the batch function takes all). A report of a
      checkpoint older than that counts as a new one. At most :data:`MAX_TIERS` tiers.
    * ``restore_s`` per tier: the median over the recovered incidents (exact; the facts keep one
      small dict per incident, a count of faults, not of steps).

    State: ``O(window + tiers × tier_window + incidents)``, JSON in :meth:`to_dict`; with the
    defaults (256, 64) a few tens of KiB however long the job runs.

    Args:
        saved: a :meth:`to_dict` result to continue from (e.g. kept in the server's store).
        facts: the job facts fold to feed and read (e.g. the server's per-job
            :class:`~hyperpod_lab.fold.progress.Progress`); the meter folds every event into it, so
            its owner must not fold them again. Default: ``JobFacts(saved["facts"])``.
        window: items held before the oldest is settled; None: all (exact, batch).
        tier_window: distinct checkpoint steps kept per tier; None: all (exact, batch).

    Events must be given as a reader delivers them: in time order within a poll, each file's
    events in order (``EventReader.poll``).
    """

    def __init__(self, saved: dict | None = None, facts: JobFacts | None = None, *,
                 window: int | None = DEFAULT_WINDOW, tier_window: int | None = DEFAULT_TIER_WINDOW):
        d = dict(saved or {})
        self.facts = facts if facts is not None else JobFacts(d.get("facts"))
        self.job_id: str | None = d.get("job_id")
        self.events = int(d.get("events", 0))            # events folded
        self.step_events = int(d.get("step_events", 0))  # step events with an integer step
        self.window, self.tier_window = window, tier_window
        self._clock = _StepClock(d.get("clock"), window)
        self._tiers = {str(k): _TierStats(v, tier_window) for k, v in (d.get("tiers") or {}).items()}

    def update(self, ev) -> None:
        """Fold one :class:`~hyperpod_lab.events.Event` in (into the facts too)."""
        self.facts.update(ev)
        self.events += 1
        if self.job_id is None:
            self.job_id = ev.job_id
        kind, data = ev.kind, ev.data
        if kind == _STEP:
            if isinstance(data.get("step"), int):
                self.step_events += 1
                self._clock.add_step(ev.time, ev.writer, ev.seq, data["step"])
        elif kind in _BREAKS:
            self._clock.add_break(ev.time, ev.writer, ev.seq)
        elif kind == _SAVED and isinstance(data.get("step"), int):
            tier, step = str(data.get("tier")), data["step"]
            ts = self._tiers.get(tier)
            if ts is None:
                if len(self._tiers) >= MAX_TIERS:
                    return
                ts = self._tiers[tier] = _TierStats(None, self.tier_window)
            changed = ts.add(step, float(data.get("blocked_s") or 0.0), ev.time - float(data.get("total_s") or 0.0))
            if changed is not None:
                self._clock.set_stall(tier, step, changed[1], changed[0])

    def update_all(self, events: Iterable) -> "GoodputMeter":
        """:meth:`update` with each of ``events`` in the order given; returns the meter."""
        for ev in events:
            self.update(ev)
        return self

    def to_dict(self, facts: bool = True) -> dict:
        """The meter's state, JSON-serialisable; ``GoodputMeter(saved=d)`` continues from it.

        Args:
            facts: include the facts fold's ``to_dict()`` (under ``"facts"``); leave it out where
                the facts are saved anyway (the server saves them as the job's progress) and pass
                them back as ``facts=`` when restoring.
        """
        d = {"version": STATE_VERSION, "job_id": self.job_id, "events": self.events,
             "step_events": self.step_events, "clock": self._clock.to_dict(),
             "tiers": {k: v.to_dict() for k, v in self._tiers.items()}}
        if facts:
            d["facts"] = self.facts.to_dict()
        return d

    def result(self) -> dict:
        """The measurement so far: the dict :func:`measure_from_events` returns (keys and
        meanings there). Costs ``O(window + tiers × tier_window + incidents)``.

        Raises:
            GoodputInputError: no events, or no step events (nothing to measure yet).
        """
        if not self.events:
            raise GoodputInputError("events", "no events: the job has not started yet; wait for its first steps")
        if not self.step_events:
            raise GoodputInputError("events", "no step events yet: nothing to measure; wait for the first steps")
        facts = self.facts
        dt_sum, dstep_sum = self._clock.totals()
        step_time = dt_sum / dstep_sum if dstep_sum else None

        t0 = facts.started_time if facts.started_time is not None else facts.first_time
        runs = facts.preflight_runs
        if runs:  # the pre-flight health checks before the first start are the job's time too
            t0 = min(t0, max(facts.first_time, min(r["start"] for r in runs)))
        wall = max(0.0, facts.last_time - t0)
        n_steps = facts.steps
        recoveries = [_recovery(inc, step_time, runs) for inc in facts.incidents
                      if inc["recovered_at"] is not None and inc["end_at"] is not None
                      and isinstance(inc["downtime_s"], (int, float))]

        tiers: dict[str, dict] = {}
        for tier, ts in sorted(self._tiers.items(), key=lambda kv: _tier_rank(kv[0])):
            rs = [r["restore_s"] for r in recoveries if r["restored_from"] == tier]
            tiers[tier] = {"checkpoints": ts.count, "interval_steps": ts.interval_steps(),
                           "blocked_s": ts.blocked_total / ts.count,
                           "blocked_total_s": ts.blocked_total,
                           "restore_s": statistics.median(rs) if rs else None}

        # steps x the measured step time: the steps' wall time, stragglers' slow steps included
        in_steps = min(wall, n_steps * step_time) if step_time is not None else None
        recovered = {id(inc) for inc in facts.incidents if inc["recovered_at"] is not None
                     and inc["end_at"] is not None and isinstance(inc["downtime_s"], (int, float))}
        estimates = {"health_check": sum(_overlap(r["start"], r["end"], t0, facts.last_time) for r in runs),
                     "checkpoint": sum(t["blocked_total_s"] for t in tiers.values()),
                     # recovered incidents' hang time within their detection lag; the others' as written
                     "hang": sum(r["hang_s"] for r in recoveries)
                     + sum(float(i.get("hang_s") or 0.0) for i in facts.incidents if id(i) not in recovered),
                     "detect": sum(r["detect_s"] or 0.0 for r in recoveries),
                     "restart": sum(r["restart_s"] for r in recoveries),
                     "restore": sum(r["restore_s"] for r in recoveries),
                     "recompute": sum(r["recompute_s"] or 0.0 for r in recoveries)}
        straggle_est = max(0.0, float(facts.straggle_s))
        if in_steps is not None:
            straggle = min(straggle_est, in_steps)  # the part of the steps' time spent waiting for stragglers
            useful = in_steps - straggle
            left = wall - in_steps
        else:
            straggle = min(straggle_est, wall)
            useful = None
            left = wall - straggle
        granted = {"straggle": straggle}
        for k in _LOST_ORDER:
            granted[k] = min(max(0.0, estimates[k]), left)
            left -= granted[k]
        lost = {k: granted[k] for k in LOST_PARTS}
        lost["other"] = left if useful is not None else None
        return {"job_id": self.job_id, "wall_s": wall, "steps": n_steps, "step_time_s": step_time,
                "useful_s": useful, "goodput": (useful / wall if useful is not None and wall > 0 else None),
                "tiers": tiers, "recoveries": recoveries, "faults": facts.faults,
                "lost_s": lost,
                "lost_fraction": {k: (v / wall if v is not None and wall > 0 else None) for k, v in lost.items()}}


def measure_from_events(events: Iterable) -> dict:
    """Measure a job's goodput, step time, checkpoint costs and recoveries from its events.

    Faults, recoveries and downtime come from the job facts fold (:mod:`hyperpod_lab.fold.facts`):
    one recovery per recovered failure incident, however many agents reported it. This is the
    batch form of :class:`GoodputMeter`: the events sorted, fed to a fresh meter that holds
    them all (``window=None, tier_window=None``), its :meth:`~GoodputMeter.result`. A server
    or a watch loop keeps a meter instead and feeds it the new events.

    Args:
        events: the job's :class:`hyperpod_lab.events.Event` objects (any order), e.g.
            ``client.event_reader(job_id).poll()``.

    Returns:
        A JSON-serialisable dict (seconds unless named otherwise):

        * ``wall_s``: first ``started`` (else first event) to the last event; the first
          pre-flight run's start when it comes earlier (its health checks run on the job's
          nodes before training starts);
        * ``steps``: useful steps (``finished.steps``, else the highest step + 1);
        * ``step_time_s``: seconds per step between consecutive ``step`` events of one run,
          minus the checkpoint stalls that began between them;
        * ``useful_s`` = steps × step_time_s (at most ``wall_s``) minus the straggling time;
          ``goodput`` = useful_s / wall_s;
        * ``tiers``: per tier ``checkpoints``, ``interval_steps`` (median gap), ``blocked_s``
          (mean per checkpoint, the slowest rank's), ``blocked_total_s``, ``restore_s`` (median
          of the incidents restored from it, else null);
        * ``faults``: failure incidents (the fold's); ``recoveries``: per recovered incident
          whose downtime is known: ``downtime_s`` (its first detection to the first completed
          step after the recovery), ``restored_from``, ``restored_step``, ``hang_s`` (of a hang, ``fault.detected``
          {reason: "hang"}: its ``stalled_s``, the seconds the rank was stuck before the watchdog
          declared it, at most the detection lag), ``detect_s`` (last ``step`` event to the first
          detection, less ``hang_s``: an upper bound, steps are reported at most once a second), ``restore_s`` (slowest ``checkpoint.restored`` ``seconds`` of the
          incident, at most the downtime), ``health_check_s`` (seconds of pre-flight runs
          within the downtime, at most downtime - restore), ``restart_s`` (= downtime -
          restore - health_check),
          ``recomputed_steps`` and ``recompute_s`` (from the last ``step`` event before the
          fault: a lower bound, for the same reason). Detection is counted once: in
          ``detect_s``, never in the downtime;
        * ``lost_s`` and ``lost_fraction``: wall time lost to ``health_check`` (the pre-flight
          runs of the nodes' health checks, ``health.checked``/``health.failed``, within the
          wall time: never a fault), ``checkpoint``, ``hang`` (hung ranks before their
          detection: the incidents' ``hang_s``), ``detect``, ``restart``, ``restore``,
          ``recompute``, ``straggle`` (steps slowed by a straggler: the flagged rank's
          ``compute_s - median_compute_s`` per step while it is flagged, see
          :mod:`hyperpod_lab.fold.facts`), and ``other`` (the rest: first start-up, evaluation,
          rounding). With a step time, ``useful_s + sum(lost_s) == wall_s`` and no part is
          negative: straggling is time inside the steps, so it is taken from ``steps ×
          step_time_s`` (at most all of it); the other parts share what is left of the wall
          time, granted in the order health_check, restore, restart, checkpoint, hang, detect,
          recompute, each at most what is left (where the estimates overlap, a bound taken
          twice). Without one, ``other``, ``useful_s`` and ``goodput`` are null and the parts
          add up to at most ``wall_s``.

    Raises:
        GoodputInputError: no events, or no step events (nothing to measure yet).
    """
    meter = GoodputMeter(window=None, tier_window=None)
    for ev in sorted(events, key=lambda e: (e.time, e.writer, e.seq)):
        meter.update(ev)
    return meter.result()


def _tier_rank(name: str) -> tuple[int, str]:
    return (TIER_ORDER.index(name) if name in TIER_ORDER else len(TIER_ORDER), name)


def project(measured: dict, instances: int, failure_rate: Any = None, *, heal_s: float = DEFAULT_HEAL_S,
            replicas: int | None = None, fallback_probability: float | None = None,
            detect_s: float | None = None, restart_s: Any = None, failure_rate_per_day: Any = None,
            node_loss_fraction: float = 1.0, band_factor: float = BAND_FACTOR) -> dict:
    """Projected goodput at ``instances`` from a job's measurements, as a band (low, mid, high)
    over the failure rate and the restart time.

    The measured step time, tiers (interval, blocked and restore seconds) and the median measured
    detection seconds form a :class:`Scenario`, evaluated for both recovery modes with
    :func:`goodput_breakdown` at three points (:mod:`hyperpod_lab.goodput.band`): ``low`` at the
    highest failure rate and the longest restart, ``mid`` at the middles, ``high`` at the lowest
    rate and the shortest restart.

    Tiers and node loss: the model's failures are instance failures, and a node-local tier
    (``memory``: the node's own /dev/shm) is lost with its node; only a fraction ``1 -
    node_loss_fraction`` of the failures (a process crash that leaves the node up) finds it.
    After a node loss the restore comes from the next tier that survives: ``peer`` (a copy in
    another node's memory), ``persistent`` or ``s3``.

    Args:
        measured: a :func:`measure_from_events` result.
        instances: instances (nodes) to project to.
        failure_rate: per instance-hour: a fraction (``0.0004``), a percentage (``"0.04%"``) or
            a range (``"0.01%:0.06%"``, ``(lo, hi)``); one value spans half to twice it.
        failure_rate_per_day: instead of ``failure_rate``: the job's failures a day (all its
            ``instances``), a number or a range.
        heal_s, replicas, fallback_probability: checkpointless parameters (see :class:`Scenario`).
        detect_s: override the measured (or default) detection seconds.
        restart_s: a value or range of restart seconds; default: the measured restarts (two or
            more: fewest to most), else one measured or the default value, half to twice it.
        node_loss_fraction: fraction of the failures that take their node (and its memory tier)
            with them, 0 to 1 (default 1: every failure is an instance failure).
        band_factor: how far a single value spans either way (default 2).

    Returns:
        JSON-serialisable ``{"instances", "failure_rate_per_instance_hour" (mid), "mtbf_hours"
        (mid), "step_time_s", "tiers": [...] (with ``survives_failure``), "detect_s",
        "restart_s" (mid), "node_loss_fraction", "band": {"low"|"mid"|"high":
        {"failure_rate_per_instance_hour", "mtbf_hours", "restart_s"}, "failure_rate_from",
        "restart_from"}, "modes": {mode: {"goodput": mid, "goodput_band": {"low", "mid",
        "high"}, "lost" (mid), "fallback_probability" (mid)}}, "warnings": [...]}``.

    Raises:
        GoodputInputError: no step time or no checkpoint measured yet; no tier survives a node
            loss; no rate, or both kinds; a rate or range out of its unit.
    """
    if not measured.get("step_time_s"):
        raise GoodputInputError("measured", "no step time measured yet (needs two step events of one run)")
    loss = checked_probability(node_loss_fraction, "node_loss_fraction")
    tiers = []
    for name, t in sorted(measured.get("tiers", {}).items(),
                          key=lambda kv: (kv[1]["interval_steps"] or math.inf, _tier_rank(kv[0]))):
        n = t["interval_steps"] or max(1, int(measured.get("steps") or 1))
        restore = t["restore_s"]
        if restore is None:
            restore = max((r["restore_s"] for r in measured.get("recoveries", [])), default=0.0)
        tiers.append(Tier(name, max(1, int(round(n))), t["blocked_s"], restore, tier_survival(name, loss)))
    if not tiers:
        raise GoodputInputError("measured", "no checkpoint.saved events yet: nothing to project from")
    if tiers[-1].survives_failure < 1.0:
        raise GoodputInputError("tiers", f"no checkpoint tier of this job survives the loss of a node "
                                f"({', '.join(t.name for t in tiers)}: node-local memory is lost with its node); "
                                "save a peer, persistent or s3 tier too (or give node_loss_fraction < 1)")
    rates, rate_from, warnings = rate_inputs(instances, failure_rate, failure_rate_per_day, band_factor)
    replicas, why = replicas_for(checked_instances(instances), replicas)
    warnings = warnings + ([why] if why else [])
    recs = measured.get("recoveries", [])
    det = [r["detect_s"] for r in recs if r["detect_s"] is not None]
    rst = [r["restart_s"] + (r.get("health_check_s") or 0.0) for r in recs]  # a restart checks its nodes again
    detect = detect_s if detect_s is not None else (statistics.median(det) if det else DEFAULT_DETECT_S)
    restarts, restart_from = restart_band(restart_s, rst, DEFAULT_RESTART_S, band_factor)
    base = Scenario(instances=instances, failure_rate_per_instance_hour=rates[1],
                    step_time_s=measured["step_time_s"], tiers=tiers, detect_s=detect, restart_s=restarts[1],
                    heal_s=heal_s, replicas=replicas, fallback_probability=fallback_probability)
    points = {"low": (rates[2], restarts[2]), "mid": (rates[1], restarts[1]), "high": (rates[0], restarts[0])}
    modes = {}
    for mode in MODEL_MODES:
        at = {k: goodput_breakdown(base.with_(mode=mode, failure_rate_per_instance_hour=r, restart_s=x))
              for k, (r, x) in points.items()}
        b = at["mid"]
        modes[mode] = {"goodput": b["goodput"], "goodput_band": {k: at[k]["goodput"] for k in points},
                       "lost": b["lost"], "fallback_probability": b["fallback_probability"]}
    band = {k: {"failure_rate_per_instance_hour": r, "restart_s": x,
                "mtbf_hours": cluster_mtbf_hours(base.instances, r) if r > 0 else None}
            for k, (r, x) in points.items()}
    band.update(failure_rate_from=rate_from, restart_from=restart_from)
    return {"instances": base.instances, "failure_rate_per_instance_hour": base.failure_rate_per_instance_hour,
            "mtbf_hours": base.mtbf_s / SECONDS_PER_HOUR if rates[1] > 0 else None, "step_time_s": base.step_time_s,
            "tiers": [asdict(t) for t in base.tiers], "detect_s": detect, "restart_s": restarts[1],
            "node_loss_fraction": loss, "band": band, "modes": modes, "warnings": warnings}

