"""Measurement of a job from its events (through the job facts fold, :mod:`hyperpod_lab.facts`)
and projection of the measured costs to another cluster size."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import asdict
from typing import Iterable

from hyperpod_lab.errors import GoodputInputError
from hyperpod_lab.events import EventKind
from hyperpod_lab.facts import fold
from hyperpod_lab.goodput.closed_form import goodput_breakdown
from hyperpod_lab.goodput.scenario import (
    DEFAULT_DETECT_S,
    DEFAULT_HEAL_S,
    DEFAULT_REPLICAS,
    DEFAULT_RESTART_S,
    RECOVERY_MODES,
    SECONDS_PER_HOUR,
    TIER_ORDER,
    Scenario,
    Tier,
)


def _job_checkpoints(events) -> dict[tuple[str, int], dict]:
    """One entry per (tier, step): the slowest rank's blocked_s (the loop waits for it)."""
    out: dict[tuple[str, int], dict] = {}
    for e in events:
        if e.kind != EventKind.CHECKPOINT_SAVED.value or not isinstance(e.data.get("step"), int):
            continue
        key = (str(e.data.get("tier")), e.data["step"])
        blocked = float(e.data.get("blocked_s") or 0.0)
        start = e.time - float(e.data.get("total_s") or 0.0)
        cur = out.get(key)
        if cur is None or blocked > cur["blocked_s"]:
            out[key] = {"blocked_s": blocked, "start": start if cur is None else min(start, cur["start"])}
    return out


_BREAKS = frozenset(k.value for k in (EventKind.STARTED, EventKind.FAULT_DETECTED, EventKind.RECOVERY_STARTED,
                                      EventKind.RECOVERY_COMPLETED))
# the order in which lost time is granted when the estimates overlap (see measure_from_events):
# measured intervals first (a recovery's restore and restart, the checkpoint stalls), then the
# bounds (detection: an upper bound; recomputation: overlaps the first step after a recovery)
_LOST_ORDER = ("restore", "restart", "checkpoint", "detect", "recompute")


def _recovery(inc: dict, step_time: float | None) -> dict:
    """One recovered incident of the job facts fold as the goodput measurement sees it."""
    down = float(inc["downtime_s"])
    detect = (max(0.0, inc["detected_at"] - inc["last_step_time"])
              if inc["detected_at"] is not None and inc["last_step_time"] is not None else None)
    restore = min(float(inc["restore_s"]), down)
    reached = (inc["last_step"] + 1) if isinstance(inc["last_step"], int) else 0  # steps done before the fault
    if isinstance(inc.get("resumed_step"), int):
        resume = inc["resumed_step"]  # checkpointless: the step redone first
    elif isinstance(inc["restored_step"], int):
        resume = inc["restored_step"] + 1
    else:
        resume = 0
    redo = max(0, reached - resume)
    return {"time": inc["end_at"], "downtime_s": down, "restored_from": inc["restored_from"],
            "restored_step": inc["restored_step"], "detect_s": detect, "restore_s": restore,
            "restart_s": down - restore, "recomputed_steps": redo,
            "recompute_s": redo * step_time if step_time is not None else None}


def measure_from_events(events: Iterable) -> dict:
    """Measure a job's goodput, step time, checkpoint costs and recoveries from its events.

    Faults, recoveries and downtime come from the job facts fold (:mod:`hyperpod_lab.facts`):
    one recovery per recovered failure incident, however many agents reported it.

    Args:
        events: the job's :class:`hyperpod_lab.events.Event` objects (any order), e.g.
            ``client.event_reader(job_id).poll()``.

    Returns:
        A JSON-serialisable dict (seconds unless named otherwise):

        * ``wall_s``: first ``started`` (else first event) to the last event;
        * ``steps``: useful steps (``finished.steps``, else the highest step + 1);
        * ``step_time_s``: seconds per step between consecutive ``step`` events of one run,
          minus the checkpoint stalls that began between them;
        * ``useful_s`` = steps × step_time_s (at most ``wall_s``); ``goodput`` = useful_s / wall_s;
        * ``tiers``: per tier ``checkpoints``, ``interval_steps`` (median gap), ``blocked_s``
          (mean per checkpoint, the slowest rank's), ``blocked_total_s``, ``restore_s`` (median
          of the incidents restored from it, else null);
        * ``faults``: failure incidents (the fold's); ``recoveries``: per recovered incident
          whose downtime is known: ``downtime_s`` (its first detection to the first completed
          step after the recovery), ``restored_from``, ``restored_step``, ``detect_s`` (last
          ``step`` event to the first detection: an upper bound, steps are reported at most
          once a second), ``restore_s`` (slowest ``checkpoint.restored`` ``seconds`` of the
          incident, at most the downtime), ``restart_s`` (= downtime - restore),
          ``recomputed_steps`` and ``recompute_s`` (from the last ``step`` event before the
          fault: a lower bound, for the same reason). Detection is counted once: in
          ``detect_s``, never in the downtime;
        * ``lost_s`` and ``lost_fraction``: wall time lost to ``checkpoint``, ``detect``,
          ``restart``, ``restore``, ``recompute``, and ``other`` (the rest: first start-up,
          evaluation, rounding). With a step time, ``useful_s + sum(lost_s) == wall_s`` and no
          part is negative: where the per-recovery estimates overlap (a bound taken twice),
          the parts are granted in the order restore, restart, checkpoint, detect, recompute,
          each at most what is left of the wall time. Without one, ``other``, ``useful_s`` and
          ``goodput`` are null and the parts add up to at most ``wall_s``.

    Raises:
        GoodputInputError: no events, or no step events (nothing to measure yet).
    """
    evs = sorted(events, key=lambda e: (e.time, e.writer, e.seq))
    if not evs:
        raise GoodputInputError("events", "no events: the job has not started yet; wait for its first steps")
    steps = [e for e in evs if e.kind == EventKind.STEP.value and isinstance(e.data.get("step"), int)]
    if not steps:
        raise GoodputInputError("events", "no step events yet: nothing to measure; wait for the first steps")
    facts = fold(evs)
    ckpts = _job_checkpoints(evs)
    breaks = sorted(e.time for e in evs if e.kind in _BREAKS)
    # step time: consecutive step events of one run, minus the stalls that began between them
    dt_sum, dstep_sum = 0.0, 0
    for a, b in zip(steps, steps[1:]):
        dn = b.data["step"] - a.data["step"]
        if dn <= 0 or any(a.time < t <= b.time for t in breaks):
            continue
        stall = sum(c["blocked_s"] for c in ckpts.values() if a.time <= c["start"] < b.time)
        dt_sum += max(0.0, b.time - a.time - stall)
        dstep_sum += dn
    step_time = dt_sum / dstep_sum if dstep_sum else None

    t0 = facts.started_time if facts.started_time is not None else facts.first_time
    wall = max(0.0, facts.last_time - t0)
    n_steps = facts.steps
    recoveries = [_recovery(inc, step_time) for inc in facts.incidents
                  if inc["recovered_at"] is not None and inc["end_at"] is not None
                  and isinstance(inc["downtime_s"], (int, float))]

    tiers: dict[str, dict] = {}
    by_tier: dict[str, list] = defaultdict(list)
    for (tier, step), c in ckpts.items():
        by_tier[tier].append((step, c["blocked_s"]))
    for tier, items in sorted(by_tier.items(), key=lambda kv: _tier_rank(kv[0])):
        st = sorted({s for s, _ in items})
        gaps = [b - a for a, b in zip(st, st[1:]) if b > a]
        rs = [r["restore_s"] for r in recoveries if r["restored_from"] == tier]
        tiers[tier] = {"checkpoints": len(items), "interval_steps": statistics.median(gaps) if gaps else None,
                       "blocked_s": sum(b for _, b in items) / len(items),
                       "blocked_total_s": sum(b for _, b in items),
                       "restore_s": statistics.median(rs) if rs else None}

    useful = min(wall, n_steps * step_time) if step_time is not None else None
    estimates = {"checkpoint": sum(t["blocked_total_s"] for t in tiers.values()),
                 "detect": sum(r["detect_s"] or 0.0 for r in recoveries),
                 "restart": sum(r["restart_s"] for r in recoveries),
                 "restore": sum(r["restore_s"] for r in recoveries),
                 "recompute": sum(r["recompute_s"] or 0.0 for r in recoveries)}
    left = wall - (useful or 0.0)
    granted = {}
    for k in _LOST_ORDER:
        granted[k] = min(max(0.0, estimates[k]), left)
        left -= granted[k]
    lost = {k: granted[k] for k in ("checkpoint", "detect", "restart", "restore", "recompute")}
    lost["other"] = left if useful is not None else None
    return {"job_id": evs[0].job_id, "wall_s": wall, "steps": n_steps, "step_time_s": step_time,
            "useful_s": useful, "goodput": (useful / wall if useful is not None and wall > 0 else None),
            "tiers": tiers, "recoveries": recoveries, "faults": facts.faults,
            "lost_s": lost,
            "lost_fraction": {k: (v / wall if v is not None and wall > 0 else None) for k, v in lost.items()}}


def _tier_rank(name: str) -> tuple[int, str]:
    return (TIER_ORDER.index(name) if name in TIER_ORDER else len(TIER_ORDER), name)


def project(measured: dict, instances: int, failure_rate: float | str, *, heal_s: float = DEFAULT_HEAL_S,
            replicas: int = DEFAULT_REPLICAS, fallback_probability: float | None = None,
            detect_s: float | None = None, restart_s: float | None = None) -> dict:
    """Projected goodput at ``instances`` and ``failure_rate`` from a job's measurements.

    The measured step time, tiers (interval, blocked and restore seconds) and the median measured
    detection and restart seconds (the defaults where the job had no recovery) form a
    :class:`Scenario`, evaluated for both recovery modes with :func:`goodput_breakdown`.

    Args:
        measured: a :func:`measure_from_events` result.
        instances: instances (nodes) to project to.
        failure_rate: fraction per instance-hour or ``"0.04%"``.
        heal_s, replicas, fallback_probability: checkpointless parameters (see :class:`Scenario`).
        detect_s, restart_s: override the measured (or default) seconds.

    Returns:
        JSON-serialisable ``{"instances", "failure_rate_per_instance_hour", "mtbf_hours",
        "step_time_s", "tiers": [...], "detect_s", "restart_s", "modes": {mode: {"goodput",
        "lost", "fallback_probability"}}}``.

    Raises:
        GoodputInputError: the measurement has no step time or no checkpoint yet.
    """
    if not measured.get("step_time_s"):
        raise GoodputInputError("measured", "no step time measured yet (needs two step events of one run)")
    tiers = []
    for name, t in sorted(measured.get("tiers", {}).items(),
                          key=lambda kv: (kv[1]["interval_steps"] or math.inf, _tier_rank(kv[0]))):
        n = t["interval_steps"] or max(1, int(measured.get("steps") or 1))
        restore = t["restore_s"]
        if restore is None:
            restore = max((r["restore_s"] for r in measured.get("recoveries", [])), default=0.0)
        tiers.append(Tier(name, max(1, int(round(n))), t["blocked_s"], restore))
    if not tiers:
        raise GoodputInputError("measured", "no checkpoint.saved events yet: nothing to project from")
    recs = measured.get("recoveries", [])
    det = [r["detect_s"] for r in recs if r["detect_s"] is not None]
    rst = [r["restart_s"] for r in recs]
    detect = detect_s if detect_s is not None else (statistics.median(det) if det else DEFAULT_DETECT_S)
    restart = restart_s if restart_s is not None else (statistics.median(rst) if rst else DEFAULT_RESTART_S)
    base = Scenario(instances=instances, failure_rate_per_instance_hour=failure_rate,
                    step_time_s=measured["step_time_s"], tiers=tiers, detect_s=detect, restart_s=restart,
                    heal_s=heal_s, replicas=replicas, fallback_probability=fallback_probability)
    modes = {}
    for mode in RECOVERY_MODES:
        b = goodput_breakdown(base.with_(mode=mode))
        modes[mode] = {"goodput": b["goodput"], "lost": b["lost"], "fallback_probability": b["fallback_probability"]}
    return {"instances": base.instances, "failure_rate_per_instance_hour": base.failure_rate_per_instance_hour,
            "mtbf_hours": base.mtbf_s / SECONDS_PER_HOUR, "step_time_s": base.step_time_s,
            "tiers": [asdict(t) for t in base.tiers], "detect_s": detect, "restart_s": restart, "modes": modes}
