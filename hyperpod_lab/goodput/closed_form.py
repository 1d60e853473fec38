"""Closed forms: Young 1974 and Daly 2006 checkpoint intervals, the exact exponential goodput of
one tier (Daly 2006), and the first-order multi-tier breakdown of a :class:`Scenario`."""

from __future__ import annotations

import math

from hyperpod_lab.errors import GoodputInputError
from hyperpod_lab.goodput.scenario import (
    LOST_KINDS,
    Scenario,
    as_scenario,
    checked_instances,
    checked_probability,
    checked_seconds,
)


def young_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum compute time between checkpoints, seconds.

    ``sqrt(2 × C × MTBF)`` (Young 1974), with ``C`` the seconds a checkpoint blocks training.
    """
    c, m = checked_seconds(checkpoint_cost_s, "checkpoint_cost_s"), checked_seconds(mtbf_s, "mtbf_s", positive=True)
    return math.sqrt(2.0 * c * m)


def daly_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints, seconds.

    ``sqrt(2CM) × (1 + sqrt(C/2M)/3 + (C/2M)/9) - C`` for ``C < 2M``, else ``M``
    (Daly 2006, eq. 37): the optimum of the exact exponential model (:func:`exponential_goodput`)
    to higher order than Young's; ``C`` checkpoint cost s, ``M`` MTBF s.
    """
    c, m = checked_seconds(checkpoint_cost_s, "checkpoint_cost_s"), checked_seconds(mtbf_s, "mtbf_s", positive=True)
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def young_daly_interval(checkpoint_cost_s: float, mtbf_s: float, order: int = 1) -> float:
    """Optimum compute time between checkpoints, seconds: ``order=1`` (default) Young 1974's
    first-order ``sqrt(2·C·MTBF)``; ``order=2`` Daly 2006's higher-order form (what
    :func:`advise` recommends).

    Args:
        checkpoint_cost_s: seconds one checkpoint blocks training (``C``).
        mtbf_s: mean time between failures that need this checkpoint, seconds.
        order: 1 (Young) or 2 (Daly).
    """
    if order == 1:
        return young_interval_s(checkpoint_cost_s, mtbf_s)
    if order == 2:
        return daly_interval_s(checkpoint_cost_s, mtbf_s)
    raise GoodputInputError("order", f"{order!r}: expected 1 (Young 1974) or 2 (Daly 2006)")


def exponential_goodput(interval_s: float, checkpoint_cost_s: float, downtime_s: float, mtbf_s: float) -> float:
    """Exact expected goodput of checkpoint-restart with one tier and exponential failures.

    Each segment of ``τ`` s compute plus ``C`` s checkpoint takes ``M e^{R/M} (e^{(τ+C)/M} - 1)``
    s of wall time on average when failures (also during the ``R`` s of downtime) arrive with
    mean interval ``M`` (Daly 2006, eq. 13); goodput is ``τ`` over that.

    Args:
        interval_s: compute seconds between checkpoints (``τ``).
        checkpoint_cost_s: seconds each checkpoint blocks training (``C``).
        downtime_s: seconds per failure before training resumes: detection + restart + restore (``R``).
        mtbf_s: cluster MTBF, seconds (``M``).

    Returns:
        Goodput, a fraction in [0, 1].
    """
    tau = checked_seconds(interval_s, "interval_s", positive=True)
    c, r = checked_seconds(checkpoint_cost_s, "checkpoint_cost_s"), checked_seconds(downtime_s, "downtime_s")
    m = checked_seconds(mtbf_s, "mtbf_s", positive=True) if not math.isinf(mtbf_s) else math.inf
    if math.isinf(m):
        return tau / (tau + c)
    if (tau + c) / m + r / m > 700:
        return 0.0
    return tau / (m * math.exp(r / m) * math.expm1((tau + c) / m))


def training_days(work_gpu_hours: float, gpus: int, goodput: float) -> float:
    """Wall-clock days to do ``work_gpu_hours`` of useful GPU-hours on ``gpus`` GPUs at ``goodput``.

    ``work_gpu_hours / (gpus × goodput) / 24``; Llama 3's 6.5 M H100-hours on 2,048 GPUs at
    goodput 1 take 132.2 days. Returns ``inf`` at goodput 0.
    """
    w = checked_seconds(work_gpu_hours, "work_gpu_hours", positive=True, unit="GPU-h", what="useful GPU-hours")
    g = checked_instances(gpus, "gpus")
    good = checked_probability(goodput, "goodput")
    return math.inf if good == 0 else w / (g * good) / 24.0


# ---- closed form --------------------------------------------------------------------------
def goodput_breakdown(scenario: Scenario | None = None, **fields) -> dict:
    """First-order closed form: goodput and where the rest of the wall time goes.

    Per useful second the tiers stall ``k = Σ C_i / τ_i`` s (``τ_i = interval_steps × step_time_s``).
    Failures arrive every ``M`` s of wall time and each costs ``F`` s on average:

    * falling back to the tiers (always for checkpoint-restart; with probability ``q`` for
      checkpointless): ``detect_s + restart_s + restore_s(i) + τ_i (1 + k) / 2`` with tier ``i``
      the first (fastest) whose checkpoint survived;
    * healed by peers (checkpointless, probability ``1 - q``): ``detect_s + heal_s`` plus the
      time since the last completed step, ``(s²/2 + Σ (s C_i + C_i²/2)/n_i) / (s + Σ C_i/n_i)``.

    Then ``goodput = (1 - F/M) / (1 + k)`` (0 when ``F ≥ M``): the waste ``C/τ + (τ/2 + R)/M``
    whose minimum is Young's interval. First order in ``F/M``: the error grows like
    ``(F/M)²`` (about 1 % at F/M = 0.1); :func:`simulate` gives the exact value.

    Args:
        scenario: a :class:`Scenario`; or its fields as keyword arguments (which also override
            a given scenario's).

    Returns:
        ``{"goodput", "mtbf_s", "failures_per_day", "fallback_probability", "cost_per_failure_s",
        "lost": {kind: fraction of wall time}}`` with kinds checkpoint, detect, restart,
        restore, heal, recompute; goodput plus the lost fractions is 1.
    """
    sc = as_scenario(scenario, fields)
    s = sc.step_time_s
    stall = sum(t.blocked_s / (t.interval_steps * s) for t in sc.tiers)  # s stalled per useful s
    p_use, remaining = [], 1.0
    for i, t in enumerate(sc.tiers):
        p = 1.0 if i == len(sc.tiers) - 1 else t.survives_failure
        p_use.append(remaining * p)
        remaining *= 1.0 - p
    fall = {"detect": sc.detect_s, "restart": sc.restart_s, "heal": 0.0,
            "restore": sum(p * t.restore_s for p, t in zip(p_use, sc.tiers)),
            "recompute": sum(p * t.interval_steps * s * (1.0 + stall) / 2.0 for p, t in zip(p_use, sc.tiers))}
    since_step = ((s * s / 2.0 + sum((s * t.blocked_s + t.blocked_s ** 2 / 2.0) / t.interval_steps for t in sc.tiers))
                  / (s + sum(t.blocked_s / t.interval_steps for t in sc.tiers)))
    heal = {"detect": sc.detect_s, "restart": 0.0, "heal": sc.heal_s, "restore": 0.0, "recompute": since_step}
    q = sc.peer_loss_probability
    per_failure = {k: q * fall[k] + (1.0 - q) * heal[k] for k in fall}
    cost = sum(per_failure.values())
    m = sc.mtbf_s
    waste = 0.0 if math.isinf(m) else cost / m
    if waste >= 1.0:
        good = 0.0
        lost = {"checkpoint": 0.0, **{k: v / cost for k, v in per_failure.items()}}
    else:
        good = (1.0 - waste) / (1.0 + stall)
        lost = {"checkpoint": good * stall, **{k: (0.0 if math.isinf(m) else v / m) for k, v in per_failure.items()}}
    return {"goodput": min(1.0, max(0.0, good)), "mtbf_s": m,
            "failures_per_day": 0.0 if math.isinf(m) else 86400.0 / m,
            "fallback_probability": q, "cost_per_failure_s": cost,
            "lost": {k: lost[k] for k in LOST_KINDS}}


def expected_goodput(scenario: Scenario | None = None, **fields) -> float:
    """Expected goodput (fraction of wall time on useful steps, in [0, 1]), first-order closed
    form; see :func:`goodput_breakdown` for the formula.

    Example:
        >>> from hyperpod_lab.goodput import Tier
        >>> round(expected_goodput(instances=512, failure_rate_per_instance_hour="0.04%", step_time_s=2.0,
        ...       tiers=[Tier("persistent", interval_steps=600, blocked_s=30, restore_s=60)]), 3)
        0.887
    """
    return goodput_breakdown(scenario, **fields)["goodput"]
