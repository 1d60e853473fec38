"""Goodput model and checkpoint-interval advisor, calibrated from a job's own events.

*Goodput* is the fraction of wall time a job spends on useful training steps: steps that are
never lost. Time is lost to checkpoint stalls (the seconds the training loop is blocked by a
save), and on every failure to detection, restart (or peer healing), checkpoint restore and the
recomputation of the steps since the restore point.

The model (formulas and the public figures it reproduces: ``docs/goodput.md``):

* Failures are a Poisson process per instance with rate ``failure_rate_per_instance_hour``
  (a fraction, ``0.0004`` = 0.04 %); a cluster of ``instances`` fails at ``instances × rate``
  per hour: the cluster MTBF is ``1 / (instances × rate)`` hours.
* Checkpoint tiers (``memory``, ``peer``, ``persistent``, ``s3``) each save every
  ``interval_steps`` steps and block training ``blocked_s`` seconds per save.
* Recovery mode ``"checkpoint-restart"``: the whole job restarts (``detect_s + restart_s``),
  restores the newest surviving checkpoint (``restore_s`` of its tier) and recomputes the steps
  since it (on average half the tier's interval).
* Recovery mode ``"checkpointless"``: surviving data-parallel replicas heal the replacement
  (``detect_s + heal_s``, at most the step in flight is recomputed); when every replica of some
  state is lost (probability ``fallback_probability``, or modeled from ``replicas``) it falls
  back to checkpoint-restart from a tier.

:func:`expected_goodput` is the first-order closed form; :func:`exponential_goodput` the exact
expected value for one tier and checkpoint-restart (Daly 2006); :func:`simulate` a seeded
Monte Carlo simulator of the same model (per-instance failure times, several tiers, peers lost
within the healing window) that checks both. :func:`measure_from_events` measures a job from
its events; :func:`project` and :func:`advise` give the goodput at N instances.

Pure Python + numpy (matplotlib only inside :func:`plot_goodput_vs_interval`); no torch, no
Jupyter.

Sources: J. W. Young, "A first order approximation to the optimum checkpoint interval",
CACM 17(9):530-531, 1974. J. T. Daly, "A higher order estimate of the optimum checkpoint
interval for restart dumps", Future Generation Computer Systems 22(3):303-312, 2006.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from hyperpod_lab.errors import GoodputInputError

SECONDS_PER_HOUR = 3600.0
CHECKPOINT_RESTART = "checkpoint-restart"
CHECKPOINTLESS = "checkpointless"
RECOVERY_MODES = (CHECKPOINT_RESTART, CHECKPOINTLESS)
TIER_ORDER = ("memory", "peer", "persistent", "s3")

# Defaults, each from a public figure (../shared/FACTS.md, cited in docs/goodput.md):
DEFAULT_DETECT_S = 30.0     # s from a failure to its detection (assumed; heartbeats of ~1-30 s)
DEFAULT_RESTART_S = 900.0   # s to restart a whole job: 15 min, the low end of AWS's "15-30 min"
                            # checkpoint-based recovery at 2,304 GPUs (checkpointless announcement)
DEFAULT_HEAL_S = 90.0       # s of peer healing: AWS's checkpointless recovery "under 2 min"
DEFAULT_REPLICAS = 2        # data-parallel replicas holding each rank's state
DEFAULT_GPUS_PER_INSTANCE = 8
DEFAULT_MAX_INTERVAL_S = 86400.0  # longest interval advised (a day): checkpoints also guard
                                  # against what the failure rate does not model (bugs, preemption)

_RATE_UNIT = ("rates are fractions per instance-hour, e.g. 0.0004, or explicit percentages, "
              "e.g. '0.04%'")
LOST_KINDS = ("checkpoint", "detect", "restart", "restore", "heal", "recompute")


# ---- input checking -----------------------------------------------------------------------
def parse_failure_rate(rate: float | int | str, field: str = "failure_rate") -> float:
    """A failure rate as a fraction per instance-hour.

    Args:
        rate: a fraction per instance-hour (``0.0004`` or ``"0.0004"``) or an explicit
            percentage string (``"0.04%"``).
        field: name used in the error message (e.g. the CLI flag).

    Returns:
        The rate, a fraction per instance-hour in [0, 1] (``"0.04%"`` gives ``0.0004``).

    Raises:
        GoodputInputError: not a number, negative, or a bare number above 1 (a percentage
            written without ``%``); the message says which unit is expected.
    """
    if isinstance(rate, bool) or not isinstance(rate, (int, float, str, np.integer, np.floating)):
        raise GoodputInputError(field, f"{rate!r} is not a failure rate; {_RATE_UNIT}")
    percent = isinstance(rate, str) and rate.strip().endswith("%")
    text = rate.strip()[:-1].strip() if percent else rate
    try:
        value = float(text)
    except ValueError:
        raise GoodputInputError(field, f"{rate!r} is not a number; {_RATE_UNIT}") from None
    if not math.isfinite(value):
        raise GoodputInputError(field, f"{rate!r} is not finite; {_RATE_UNIT}")
    if value < 0:
        raise GoodputInputError(field, f"{rate!r} is negative: a failure rate is at least 0; {_RATE_UNIT}")
    if percent:
        if value > 100:
            raise GoodputInputError(field, f"{rate!r} is above 100 %; {_RATE_UNIT}")
        return value / 100.0
    if value > 1:
        raise GoodputInputError(field, f"{rate!r} is above 1; {_RATE_UNIT} (did you mean '{text}%'?)")
    return value


def _instances(n: Any, field: str = "instances") -> int:
    if isinstance(n, bool) or not isinstance(n, (int, float, np.integer, np.floating)) or n != int(n):
        raise GoodputInputError(field, f"{n!r} is not a whole number of instances (nodes), e.g. 512")
    if int(n) < 1:
        raise GoodputInputError(field, f"{n!r}: a cluster has at least 1 instance (node)")
    return int(n)


def _seconds(x: Any, field: str, positive: bool = False, unit: str = "s", what: str = "a finite duration in seconds") -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise GoodputInputError(field, f"{x!r} is not a number; expected {what}")
    x = float(x)
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        need = "more than 0" if positive else "0 or more"
        raise GoodputInputError(field, f"{x!r} {unit}: expected {what}, {need}")
    return x


def _probability(x: Any, field: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(x) <= 1.0:
        raise GoodputInputError(field, f"{x!r}: expected a probability, a fraction in [0, 1] (not a percentage)")
    return float(x)


# ---- failure arithmetic -------------------------------------------------------------------
def cluster_mtbf_hours(instances: int, failure_rate_per_instance_hour: float | str) -> float:
    """Mean time between failures of a whole cluster, hours.

    Args:
        instances: instances (nodes) in the job, at least 1.
        failure_rate_per_instance_hour: fraction per instance-hour, or ``"0.04%"``.

    Returns:
        ``1 / (instances × rate)`` hours (``inf`` for a rate of 0). 512 instances at 0.04 %
        give 4.88 h.
    """
    n = _instances(instances)
    rate = parse_failure_rate(failure_rate_per_instance_hour)
    return math.inf if rate == 0 else 1.0 / (n * rate)


def failure_rate_from_counts(failures: float, instances: int, hours: float) -> float:
    """Failures per instance-hour (a fraction) observed on a cluster.

    Args:
        failures: failures counted (e.g. unexpected interruptions).
        instances: instances (nodes) of the cluster (GPUs / GPUs per instance).
        hours: wall-clock hours of observation.

    Returns:
        ``failures / (instances × hours)``, e.g. OPT-175B's 105 restarts on 124 instances in
        1,440 h give 0.000588 (0.0588 %).
    """
    if isinstance(failures, bool) or not isinstance(failures, (int, float)) or failures < 0:
        raise GoodputInputError("failures", f"{failures!r}: expected a count, 0 or more")
    hours = _seconds(hours, "hours", positive=True, unit="h", what="a finite duration in hours")
    return failures / (_instances(instances) * hours)


def young_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum compute time between checkpoints, seconds.

    ``sqrt(2 × C × MTBF)`` (Young 1974), with ``C`` the seconds a checkpoint blocks training.
    """
    c, m = _seconds(checkpoint_cost_s, "checkpoint_cost_s"), _seconds(mtbf_s, "mtbf_s", positive=True)
    return math.sqrt(2.0 * c * m)


def daly_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints, seconds.

    ``sqrt(2CM) × (1 + sqrt(C/2M)/3 + (C/2M)/9) - C`` for ``C < 2M``, else ``M``
    (Daly 2006, eq. 37): the optimum of the exact exponential model (:func:`exponential_goodput`)
    to higher order than Young's; ``C`` checkpoint cost s, ``M`` MTBF s.
    """
    c, m = _seconds(checkpoint_cost_s, "checkpoint_cost_s"), _seconds(mtbf_s, "mtbf_s", positive=True)
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
    tau = _seconds(interval_s, "interval_s", positive=True)
    c, r = _seconds(checkpoint_cost_s, "checkpoint_cost_s"), _seconds(downtime_s, "downtime_s")
    m = _seconds(mtbf_s, "mtbf_s", positive=True) if not math.isinf(mtbf_s) else math.inf
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
    w = _seconds(work_gpu_hours, "work_gpu_hours", positive=True, unit="GPU-h", what="useful GPU-hours")
    g = _instances(gpus, "gpus")
    good = _probability(goodput, "goodput")
    return math.inf if good == 0 else w / (g * good) / 24.0


# ---- the scenario -------------------------------------------------------------------------
@dataclass(frozen=True)
class Tier:
    """One checkpoint tier as the model sees it.

    Attributes:
        name: ``memory``, ``peer``, ``persistent``, ``s3`` (or any label).
        interval_steps: steps between two checkpoints of this tier (at least 1).
        blocked_s: seconds each checkpoint blocks the training loop.
        restore_s: seconds to load this tier's checkpoint after a failure.
        survives_failure: probability that this tier's latest checkpoint is still readable after
            a failure (node-local memory without a peer copy: 0; the last tier: 1).
    """

    name: str
    interval_steps: int
    blocked_s: float
    restore_s: float = 0.0
    survives_failure: float = 1.0

    def __post_init__(self):
        f = f"tiers.{self.name}"
        n = self.interval_steps
        if isinstance(n, bool) or not isinstance(n, (int, float, np.integer, np.floating)) or n != int(n) or n < 1:
            raise GoodputInputError(f + ".interval_steps", f"{n!r}: expected a whole number of steps, at least 1")
        object.__setattr__(self, "interval_steps", int(n))
        object.__setattr__(self, "blocked_s", _seconds(self.blocked_s, f + ".blocked_s"))
        object.__setattr__(self, "restore_s", _seconds(self.restore_s, f + ".restore_s"))
        object.__setattr__(self, "survives_failure", _probability(self.survives_failure, f + ".survives_failure"))


@dataclass(frozen=True)
class Scenario:
    """A job, its cluster, its checkpoint tiers and its recovery mode: the model's whole input.

    Attributes:
        instances: instances (nodes) in the job.
        failure_rate_per_instance_hour: fraction per instance-hour (``"0.04%"`` accepted).
        step_time_s: seconds of one training step without checkpoint stalls.
        tiers: checkpoint tiers, most frequent (fastest to restore) first; the last one must
            survive every failure. ``Tier`` objects or dicts of its fields.
        mode: ``"checkpoint-restart"`` or ``"checkpointless"``.
        detect_s: seconds from a failure to its detection.
        restart_s: seconds to restart the whole job (scheduler, process start, rendezvous,
            data loader), before the restore.
        heal_s: checkpointless: seconds the job stalls while peers heal the replacement.
        replicas: checkpointless: instances holding each piece of state (data-parallel
            replicas); ``instances`` must be a multiple of it.
        heal_window_s: checkpointless: seconds during which losing the other replicas loses
            the state (default ``heal_s``).
        fallback_probability: checkpointless: probability a failure cannot be healed by peers
            and falls back to the tiers; default modeled from ``replicas``:
            ``(1 - exp(-rate × heal_window))^(replicas - 1)``.
    """

    instances: int
    failure_rate_per_instance_hour: float | str
    step_time_s: float
    tiers: Sequence[Tier | dict]
    mode: str = CHECKPOINT_RESTART
    detect_s: float = DEFAULT_DETECT_S
    restart_s: float = DEFAULT_RESTART_S
    heal_s: float = DEFAULT_HEAL_S
    replicas: int = DEFAULT_REPLICAS
    heal_window_s: float | None = None
    fallback_probability: float | None = None

    def __post_init__(self):
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        put("instances", _instances(self.instances))
        put("failure_rate_per_instance_hour", parse_failure_rate(self.failure_rate_per_instance_hour,
                                                                 "failure_rate_per_instance_hour"))
        put("step_time_s", _seconds(self.step_time_s, "step_time_s", positive=True))
        tiers = tuple(t if isinstance(t, Tier) else Tier(**t) for t in (self.tiers or ()))
        if not tiers:
            raise GoodputInputError("tiers", "at least one checkpoint tier is needed, e.g. "
                                    "Tier('persistent', interval_steps=100, blocked_s=20)")
        if tiers[-1].survives_failure != 1.0:
            raise GoodputInputError("tiers", f"the last tier ({tiers[-1].name}) must survive every failure "
                                    "(survives_failure=1.0): add a persistent or s3 tier")
        put("tiers", tiers)
        if self.mode not in RECOVERY_MODES:
            raise GoodputInputError("mode", f"{self.mode!r}: expected one of {', '.join(RECOVERY_MODES)}")
        for k in ("detect_s", "restart_s", "heal_s"):
            put(k, _seconds(getattr(self, k), k))
        if self.heal_window_s is not None:
            put("heal_window_s", _seconds(self.heal_window_s, "heal_window_s"))
        r = self.replicas
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
            raise GoodputInputError("replicas", f"{r!r}: expected a whole number of replicas, at least 1")
        put("replicas", int(r))
        if self.fallback_probability is not None:
            put("fallback_probability", _probability(self.fallback_probability, "fallback_probability"))
        elif self.mode == CHECKPOINTLESS and self.instances % self.replicas:
            raise GoodputInputError("replicas", f"{self.instances} instances do not split into groups of "
                                    f"{self.replicas} replicas; give a divisor of instances or fallback_probability")

    @property
    def mtbf_s(self) -> float:
        """Cluster MTBF, seconds (``inf`` at failure rate 0)."""
        return cluster_mtbf_hours(self.instances, self.failure_rate_per_instance_hour) * SECONDS_PER_HOUR

    @property
    def window_s(self) -> float:
        """Checkpointless: seconds in which losing the other replicas loses the state
        (``heal_window_s``, default ``heal_s``)."""
        return self.heal_s if self.heal_window_s is None else self.heal_window_s

    @property
    def peer_loss_probability(self) -> float:
        """Probability that a failure falls back to the tiers: 1 for checkpoint-restart; for
        checkpointless ``fallback_probability`` or ``(1 - exp(-λ w))^(replicas-1)`` (every other
        replica of the failed instance's state also fails within the healing window ``w`` s;
        ``λ`` the rate per instance-second)."""
        if self.mode == CHECKPOINT_RESTART:
            return 1.0
        if self.fallback_probability is not None:
            return self.fallback_probability
        lam = self.failure_rate_per_instance_hour / SECONDS_PER_HOUR
        return float((-math.expm1(-lam * self.window_s)) ** (self.replicas - 1))

    def with_(self, **changes) -> "Scenario":
        """A copy with some fields changed (validated again)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(changes)
        return Scenario(**d)


def _as_scenario(scenario: Scenario | None, fields: dict) -> Scenario:
    if scenario is None:
        return Scenario(**fields)
    return scenario.with_(**fields) if fields else scenario


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
    sc = _as_scenario(scenario, fields)
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
        >>> round(expected_goodput(instances=512, failure_rate_per_instance_hour="0.04%", step_time_s=2.0,
        ...       tiers=[Tier("persistent", interval_steps=600, blocked_s=30, restore_s=60)]), 3)
        0.887
    """
    return goodput_breakdown(scenario, **fields)["goodput"]


# ---- Monte Carlo --------------------------------------------------------------------------
def _advance(p: int, budget_s: float, s: float, ns: list[int], cs: list[float], last: list[int]) -> int:
    """Train from step ``p`` (no stall pending) for ``budget_s`` s; update ``last`` (the step of
    each tier's newest committed checkpoint) and return the steps completed."""
    def wall(b: int) -> float:  # s until step b is computed and its checkpoints committed
        return (b - p) * s + sum(c * (b // n - p // n) for n, c in zip(ns, cs))

    lo, hi = p, p + int(budget_s // s)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if wall(mid) <= budget_s:
            lo = mid
        else:
            hi = mid - 1
    b = lo
    for k, n in enumerate(ns):
        if b // n > p // n:
            last[k] = (b // n) * n
    t = wall(b) + s
    if t > budget_s:
        return b
    for k, (n, c) in enumerate(zip(ns, cs)):  # step b+1 computed; its saves commit in tier order
        if (b + 1) % n == 0:
            t += c
            if t > budget_s:
                break
            last[k] = b + 1
    return b + 1


def _spend(acc: dict, parts: list[tuple[str, float]], spent_s: float) -> None:
    for kind, d in parts:
        used = min(d, max(0.0, spent_s))
        acc[kind] += used
        spent_s -= used


def simulate(scenario: Scenario | None = None, *, failures: int = 2000, seed: int = 0,
             wall_s: float | None = None, **fields) -> dict:
    """Monte Carlo goodput of a scenario, with failures drawn per instance.

    Each instance fails as a Poisson process (``np.random.default_rng(seed)``); a failure during
    a recovery restarts the recovery. Training advances step by step with each tier's
    checkpoint stalls; a checkpoint counts once its ``blocked_s`` has passed. On a failure that
    falls back to the tiers, each tier but the last survives with ``survives_failure`` and the
    job resumes from the newest surviving checkpoint. Checkpointless: the failed instance's
    state is lost when every other instance of its replica group (``replicas`` consecutive
    instances) also fails within ``heal_window_s`` (or with ``fallback_probability``); else
    peers heal it and only the step in flight is recomputed. The same seed gives the same
    failure times for any checkpoint interval (common random numbers).

    Args:
        scenario: a :class:`Scenario` (or its fields as keyword arguments).
        failures: simulate ``failures × MTBF`` s of wall time (about that many failures).
        seed: random seed.
        wall_s: wall-clock seconds to simulate instead.

    Returns:
        ``{"goodput", "wall_s", "useful_s", "failures", "fallbacks", "restored_from": {tier: n},
        "lost": {kind: fraction of wall time}}`` (kinds as :func:`goodput_breakdown`).
    """
    sc = _as_scenario(scenario, fields)
    if math.isinf(sc.mtbf_s) and wall_s is None:
        raise GoodputInputError("wall_s", "at failure rate 0 give wall_s (seconds to simulate)")
    horizon = float(wall_s) if wall_s is not None else failures * sc.mtbf_s
    rng = np.random.default_rng(seed)
    lam = sc.failure_rate_per_instance_hour / SECONDS_PER_HOUR
    window = sc.window_s
    span = horizon + window
    counts = rng.poisson(lam * span, size=sc.instances)
    inst = np.repeat(np.arange(sc.instances), counts)
    times = rng.uniform(0.0, span, size=int(counts.sum()))
    order = np.lexsort((times, inst))
    inst, times = inst[order], times[order]  # grouped by instance, each instance's times sorted
    starts = np.concatenate([[0], np.cumsum(counts)])
    chrono = np.argsort(times, kind="stable")
    chrono = chrono[times[chrono] < horizon]

    s = sc.step_time_s
    ns = [t.interval_steps for t in sc.tiers]
    cs = [t.blocked_s for t in sc.tiers]
    n_tiers = len(sc.tiers)
    last = [0] * n_tiers  # the initial state counts as a checkpoint of every tier
    p, run_from, down_at, parts = 0, 0.0, 0.0, []
    acc = {k: 0.0 for k in ("detect", "restart", "restore", "heal")}
    fallbacks, restored = 0, Counter()
    fixed_q = sc.fallback_probability
    r = sc.replicas

    def peers_lost(i: int, t: float) -> bool:
        g0 = (i // r) * r
        for j in range(g0, g0 + r):
            if j == i:
                continue
            tj = times[starts[j]:starts[j + 1]]
            k = int(np.searchsorted(tj, t, side="right"))
            if k >= len(tj) or tj[k] > t + window:
                return False
        return True

    for idx in chrono:
        f, i = float(times[idx]), int(inst[idx])
        if f < run_from:  # during a recovery: it starts over
            _spend(acc, parts, f - down_at)
        else:
            _spend(acc, parts, run_from - down_at)
            p = _advance(p, f - run_from, s, ns, cs, last)
        if sc.mode == CHECKPOINT_RESTART:
            fall = True
        elif fixed_q is not None:
            fall = bool(rng.random() < fixed_q)
        else:
            fall = r == 1 or peers_lost(i, f)
        if fall:
            fallbacks += sc.mode == CHECKPOINTLESS
            usable = [k for k in range(n_tiers) if last[k] >= 0
                      and (k == n_tiers - 1 or rng.random() < sc.tiers[k].survives_failure)]
            best = max(usable, key=lambda k: (last[k], -k))
            for k in range(n_tiers):
                if k not in usable:
                    last[k] = -1  # that tier's copy died with the instance
            p = last[best]
            restored[sc.tiers[best].name] += 1
            parts = [("detect", sc.detect_s), ("restart", sc.restart_s), ("restore", sc.tiers[best].restore_s)]
        else:
            parts = [("detect", sc.detect_s), ("heal", sc.heal_s)]
        down_at = f
        run_from = f + sum(d for _, d in parts)
    if run_from < horizon:
        _spend(acc, parts, run_from - down_at)
        p = _advance(p, horizon - run_from, s, ns, cs, last)
    else:
        _spend(acc, parts, horizon - down_at)
    useful = p * s
    stalls = sum(c * (p // n) for n, c in zip(ns, cs))
    recompute = max(0.0, horizon - useful - stalls - sum(acc.values()))
    lost = {"checkpoint": stalls, **acc, "recompute": recompute}
    return {"goodput": useful / horizon, "wall_s": horizon, "useful_s": useful, "failures": int(len(chrono)),
            "fallbacks": int(fallbacks), "restored_from": dict(restored),
            "lost": {k: lost[k] / horizon for k in LOST_KINDS}}


# ---- advisor ------------------------------------------------------------------------------
def _recommended_interval_s(cost_s: float, mtbf_s: float, max_interval_s: float) -> float:
    if math.isinf(mtbf_s):
        return max_interval_s
    if cost_s == 0:
        return 0.0
    return min(daly_interval_s(cost_s, mtbf_s), max_interval_s)


def _steps(interval_s: float, step_time_s: float) -> int:
    return max(1, int(round(interval_s / step_time_s)))


def advise(instances: int, failure_rate: float | str, checkpoint_cost_s: float, step_time_s: float, *,
           restart_s: float = DEFAULT_RESTART_S, detect_s: float = DEFAULT_DETECT_S,
           heal_s: float = DEFAULT_HEAL_S, restore_s: float | None = None, replicas: int = DEFAULT_REPLICAS,
           fallback_probability: float | None = None, work_gpu_hours: float | None = None,
           gpus_per_instance: int = DEFAULT_GPUS_PER_INSTANCE,
           max_interval_s: float = DEFAULT_MAX_INTERVAL_S) -> dict:
    """Recommended checkpoint interval and projected goodput for each recovery mode.

    One persistent tier; the interval is Daly's (:func:`daly_interval_s`) for the MTBF of the
    failures that need the checkpoint: every failure for checkpoint-restart, only those peers
    cannot heal for checkpointless (MTBF / fallback probability), at most ``max_interval_s``.

    Args:
        instances: instances (nodes), at least 1.
        failure_rate: fraction per instance-hour (``0.0004``) or ``"0.04%"``; more than 0.
        checkpoint_cost_s: seconds one checkpoint blocks training.
        step_time_s: seconds per training step.
        restart_s, detect_s, heal_s: seconds of a job restart, of failure detection, of peer
            healing (defaults from public figures, see docs/goodput.md).
        restore_s: seconds to load the checkpoint (default ``checkpoint_cost_s``).
        replicas, fallback_probability: checkpointless fallback (see :class:`Scenario`).
        work_gpu_hours: useful GPU-hours of the training run, to project training days.
        gpus_per_instance: GPUs per instance (8 for p5 / p4d).
        max_interval_s: longest interval to recommend, seconds.

    Returns:
        A JSON-serialisable dict: ``instances``, ``failure_rate_per_instance_hour``,
        ``mtbf_hours``, ``mtbf_s``, ``failures_per_day``, ``checkpoint_cost_s``,
        ``step_time_s`` and ``modes``: for each recovery mode ``interval_s``, ``interval_steps``,
        ``young_interval_s``, ``goodput``, ``lost`` (fractions of wall time),
        ``fallback_probability``, and ``training_days`` when ``work_gpu_hours`` is given.

    Raises:
        GoodputInputError: an input out of range or in the wrong unit.
    """
    rate = parse_failure_rate(failure_rate)
    if rate == 0:
        raise GoodputInputError("failure_rate", f"0 gives no finite MTBF to plan for; {_RATE_UNIT}")
    cost = _seconds(checkpoint_cost_s, "checkpoint_cost_s")
    base = Scenario(instances=instances, failure_rate_per_instance_hour=rate, step_time_s=step_time_s,
                    tiers=[Tier("persistent", 1, cost, cost if restore_s is None else restore_s)],
                    detect_s=detect_s, restart_s=restart_s, heal_s=heal_s, replicas=replicas,
                    fallback_probability=fallback_probability)
    max_interval_s = _seconds(max_interval_s, "max_interval_s", positive=True)
    if work_gpu_hours is not None:
        _seconds(work_gpu_hours, "work_gpu_hours", positive=True, unit="GPU-h", what="useful GPU-hours")
    gpus = base.instances * _instances(gpus_per_instance, "gpus_per_instance")
    m = base.mtbf_s
    modes = {}
    for mode in RECOVERY_MODES:
        sc = base.with_(mode=mode)
        q = sc.peer_loss_probability
        m_need = m / q if q > 0 else math.inf
        interval = _recommended_interval_s(cost, m_need, max_interval_s)
        steps = _steps(interval, sc.step_time_s)
        sc = sc.with_(tiers=[Tier("persistent", steps, cost, sc.tiers[0].restore_s)])
        b = goodput_breakdown(sc)
        entry = {"interval_s": steps * sc.step_time_s, "interval_steps": steps,
                 "young_interval_s": min(young_interval_s(cost, m_need), max_interval_s)
                 if not math.isinf(m_need) else max_interval_s,
                 "goodput": b["goodput"], "lost": b["lost"], "fallback_probability": q,
                 "cost_per_failure_s": b["cost_per_failure_s"]}
        if work_gpu_hours is not None:
            days = training_days(work_gpu_hours, gpus, b["goodput"])
            entry["training_days"] = None if math.isinf(days) else days
        modes[mode] = entry
    return {"instances": base.instances, "gpus": gpus, "failure_rate_per_instance_hour": rate,
            "mtbf_hours": m / SECONDS_PER_HOUR, "mtbf_s": m, "failures_per_day": 86400.0 / m,
            "checkpoint_cost_s": cost, "step_time_s": base.step_time_s, "detect_s": base.detect_s,
            "restart_s": base.restart_s, "heal_s": base.heal_s, "restore_s": base.tiers[0].restore_s,
            "work_gpu_hours": work_gpu_hours, "modes": modes}


def goodput_curve(advice: dict, intervals_s: Iterable[float]) -> dict:
    """Goodput against the checkpoint interval for each recovery mode of an :func:`advise` result.

    Returns:
        ``{"interval_s": [...], mode: [goodput, ...] for each mode}``.
    """
    xs = [float(x) for x in intervals_s]
    out: dict[str, list] = {"interval_s": xs}
    for mode in RECOVERY_MODES:
        fp = advice["modes"][mode]["fallback_probability"]
        sc = Scenario(instances=advice["instances"], failure_rate_per_instance_hour=advice["failure_rate_per_instance_hour"],
                      step_time_s=advice["step_time_s"], tiers=[Tier("persistent", 1, advice["checkpoint_cost_s"],
                                                                     advice["restore_s"])],
                      mode=mode, detect_s=advice["detect_s"], restart_s=advice["restart_s"],
                      heal_s=advice["heal_s"], fallback_probability=fp)
        out[mode] = [expected_goodput(sc.with_(tiers=[Tier("persistent", _steps(x, sc.step_time_s),
                                                           advice["checkpoint_cost_s"], advice["restore_s"])]))
                     for x in xs]
    return out


def plot_goodput_vs_interval(advice: dict):
    """A matplotlib Figure: goodput against checkpoint interval (log scale) for each recovery
    mode of an :func:`advise` result, with the recommended intervals marked."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    rec = advice["modes"][CHECKPOINT_RESTART]["interval_s"]
    lo = max(advice["step_time_s"], rec / 30.0)
    hi = max(lo * 10, rec * 30.0, advice["modes"][CHECKPOINTLESS]["interval_s"] * 1.5)
    xs = np.geomspace(lo, hi, 80)
    curve = goodput_curve(advice, xs)
    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.add_subplot()
    for mode, color in zip(RECOVERY_MODES, ("tab:red", "tab:blue")):
        ax.plot(xs / 60.0, np.asarray(curve[mode]) * 100.0, color=color, label=mode)
        m = advice["modes"][mode]
        if lo <= m["interval_s"] <= xs[-1]:
            ax.plot([m["interval_s"] / 60.0], [m["goodput"] * 100.0], "o", color=color)
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (min of training)")
    ax.set_ylabel("goodput (%)")
    ax.set_title(f"{advice['instances']} instances, {advice['failure_rate_per_instance_hour'] * 100:.4g} %/instance-h, "
                 f"MTBF {advice['mtbf_hours']:.3g} h, checkpoint {advice['checkpoint_cost_s']:.3g} s", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def figure_png(fig) -> bytes:
    """PNG bytes of a matplotlib Figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f} %"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def report_text(advice: dict, measured: dict | None = None, projection: dict | None = None) -> str:
    """Human-readable report of an :func:`advise` result (and optionally a job's
    :func:`measure_from_events` and :func:`project` results), as ``hyperpod-lab goodput`` prints it."""
    a = advice
    lines = [f"cluster: {a['instances']} instances ({a['gpus']} GPUs) at {a['failure_rate_per_instance_hour'] * 100:.4g} % "
             f"per instance-hour: MTBF {a['mtbf_hours']:.3g} h ({a['failures_per_day']:.3g} failures a day); "
             f"checkpoint {a['checkpoint_cost_s']:.3g} s, step {a['step_time_s']:.3g} s, restart {a['restart_s']:.3g} s, "
             f"detect {a['detect_s']:.3g} s, heal {a['heal_s']:.3g} s"]
    head = ["RECOVERY MODE", "CHECKPOINT EVERY", "GOODPUT"] + (["TRAINING DAYS"] if a.get("work_gpu_hours") else []) \
        + ["LOST TO (% OF WALL TIME)"]
    rows = []
    for mode, m in a["modes"].items():
        lost = ", ".join(f"{k} {v * 100:.2g}" for k, v in m["lost"].items() if v >= 5e-5)
        row = [mode, f"{_duration(m['interval_s'])} ({m['interval_steps']} steps)", _pct(m["goodput"])]
        if a.get("work_gpu_hours"):
            row.append("-" if m.get("training_days") is None else f"{m['training_days']:.1f}")
        rows.append(row + [lost])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    for r in [head] + rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if measured is not None:
        mm = measured
        st = "-" if mm["step_time_s"] is None else f"{mm['step_time_s']:.3g} s"
        lines.append(f"measured ({mm['job_id']}): {mm['steps']} steps in {mm['wall_s']:.4g} s, step {st}, "
                     f"goodput {_pct(mm['goodput'])}, {mm['faults']} recoveries")
        lines.append("  lost: " + ", ".join(f"{k} {_pct(v)}" for k, v in mm["lost_fraction"].items()))
        for name, t in mm["tiers"].items():
            every = "-" if t["interval_steps"] is None else f"{t['interval_steps']:g}"
            rs = "" if t["restore_s"] is None else f", restore {t['restore_s']:.3g} s"
            lines.append(f"  tier {name}: {t['checkpoints']} checkpoints, every {every} steps, "
                         f"blocked {t['blocked_s']:.3g} s each{rs}")
        for r in mm["recoveries"]:
            lines.append(f"  recovery from {r['restored_from']}: downtime {r['downtime_s']:.3g} s (restore "
                         f"{r['restore_s']:.3g} s), {r['recomputed_steps']} steps recomputed")
    if projection is not None:
        p = projection
        lines.append(f"projected with the job's measured costs at {p['instances']} instances: "
                     + ", ".join(f"{mode} {_pct(m['goodput'])}" for mode, m in p["modes"].items()))
    return "\n".join(lines)


# ---- calibration from a job's events ------------------------------------------------------
def _job_checkpoints(events) -> dict[tuple[str, int], dict]:
    """One entry per (tier, step): the slowest rank's blocked_s (the loop waits for it)."""
    out: dict[tuple[str, int], dict] = {}
    for e in events:
        if e.kind != "checkpoint.saved" or not isinstance(e.data.get("step"), int):
            continue
        key = (str(e.data.get("tier")), e.data["step"])
        blocked = float(e.data.get("blocked_s") or 0.0)
        start = e.time - float(e.data.get("total_s") or 0.0)
        cur = out.get(key)
        if cur is None or blocked > cur["blocked_s"]:
            out[key] = {"blocked_s": blocked, "start": start if cur is None else min(start, cur["start"])}
    return out


def measure_from_events(events: Iterable) -> dict:
    """Measure a job's goodput, step time, checkpoint costs and recoveries from its events.

    Args:
        events: the job's :class:`hyperpod_lab.events.Event` objects (any order), e.g.
            ``client.event_reader(job_id).poll()``.

    Returns:
        A JSON-serialisable dict (seconds unless named otherwise):

        * ``wall_s``: first ``started`` (else first event) to the last event;
        * ``steps``: useful steps (``finished.steps``, else the highest step + 1);
        * ``step_time_s``: seconds per step between consecutive ``step`` events of one run,
          minus the checkpoint stalls that began between them;
        * ``useful_s`` = steps × step_time_s; ``goodput`` = useful_s / wall_s;
        * ``tiers``: per tier ``checkpoints``, ``interval_steps`` (median gap), ``blocked_s``
          (mean per checkpoint, the slowest rank's), ``blocked_total_s``, ``restore_s`` (median
          of the incidents restored from it, else null);
        * ``recoveries``: per ``recovery.completed``: ``downtime_s``, ``restored_from``,
          ``restored_step``, ``detect_s`` (last ``step`` event to the first ``fault.detected``:
          an upper bound, steps are reported at most once a second), ``restore_s`` (slowest
          ``checkpoint.restored`` ``seconds``), ``restart_s`` (= downtime - restore),
          ``recomputed_steps`` and ``recompute_s`` (from the last ``step`` event before the
          fault: a lower bound, for the same reason);
        * ``lost_s`` and ``lost_fraction``: wall time lost to checkpoint, detect, restart,
          restore, recompute, and ``other`` (the rest: first start-up, evaluation, rounding).

    Raises:
        GoodputInputError: no events, or no step events (nothing to measure yet).
    """
    evs = sorted(events, key=lambda e: (e.time, e.writer, e.seq))
    if not evs:
        raise GoodputInputError("events", "no events: the job has not started yet; wait for its first steps")
    steps = [e for e in evs if e.kind == "step" and isinstance(e.data.get("step"), int)]
    if not steps:
        raise GoodputInputError("events", "no step events yet: nothing to measure; wait for the first steps")
    ckpts = _job_checkpoints(evs)
    breaks = sorted(e.time for e in evs if e.kind in ("started", "fault.detected", "recovery.started",
                                                      "recovery.completed"))
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

    started = [e.time for e in evs if e.kind == "started"]
    t0 = started[0] if started else evs[0].time
    wall = max(0.0, evs[-1].time - t0)
    fin = [e for e in evs if e.kind == "finished" and isinstance(e.data.get("steps"), int)]
    n_steps = fin[-1].data["steps"] if fin else max(e.data["step"] for e in steps) + 1

    faults = [e for e in evs if e.kind == "fault.detected"]
    restores = [e for e in evs if e.kind == "checkpoint.restored"]
    recoveries = []
    for rc in (e for e in evs if e.kind == "recovery.completed"):
        down = rc.data.get("downtime_s")
        if not isinstance(down, (int, float)):
            continue
        t_fault = rc.time - float(down)
        before = [e for e in steps if e.time <= t_fault + 1e-9]
        inc_faults = [e.time for e in faults if t_fault - 1e-6 <= e.time <= rc.time]
        if inc_faults and before:
            detect = max(0.0, min(inc_faults) - before[-1].time)
        else:
            detect = None
        restore = max((float(e.data.get("seconds") or 0.0) for e in restores if t_fault <= e.time <= rc.time),
                      default=0.0)
        reached = max((e.data["step"] for e in before), default=-1) + 1  # steps done before the fault
        rstep = rc.data.get("restored_step")
        resume = (rstep + 1) if isinstance(rstep, int) else 0
        redo = max(0, reached - resume)
        recoveries.append({"time": rc.time, "downtime_s": float(down), "restored_from": rc.data.get("restored_from"),
                           "restored_step": rstep, "detect_s": detect, "restore_s": restore,
                           "restart_s": max(0.0, float(down) - restore), "recomputed_steps": redo,
                           "recompute_s": redo * step_time if step_time is not None else None})

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

    useful = n_steps * step_time if step_time is not None else None
    lost = {"checkpoint": sum(t["blocked_total_s"] for t in tiers.values()),
            "detect": sum(r["detect_s"] or 0.0 for r in recoveries),
            "restart": sum(r["restart_s"] for r in recoveries),
            "restore": sum(r["restore_s"] for r in recoveries),
            "recompute": sum(r["recompute_s"] or 0.0 for r in recoveries)}
    lost["other"] = (wall - useful - sum(lost.values())) if useful is not None else None
    return {"job_id": evs[0].job_id, "wall_s": wall, "steps": n_steps, "step_time_s": step_time,
            "useful_s": useful, "goodput": (useful / wall if useful is not None and wall > 0 else None),
            "tiers": tiers, "recoveries": recoveries, "faults": len(recoveries),
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


# ---- public figures -----------------------------------------------------------------------
LLAMA3_ASSUMPTIONS = {"checkpoint_cost_s": 60.0, "step_time_s": 10.0, "restart_s": DEFAULT_RESTART_S,
                      "detect_s": DEFAULT_DETECT_S, "heal_s": DEFAULT_HEAL_S}


def public_figures() -> list[dict]:
    """The public figures of ``docs/goodput.md`` and this model's output for each.

    Returns:
        Rows ``{"key", "figure", "source", "published", "ours", "value"}``; ``value`` holds the
        numbers the tests check against the published figure.
    """
    rows = []
    m512 = cluster_mtbf_hours(512, "0.04%")
    rows.append({"key": "cluster_mtbf_512", "figure": "512 instances at 0.04 % per instance-hour: cluster MTBF",
                 "source": "AWS HyperPod cost blog", "published": "about every 5 h (4.9 h)",
                 "ours": f"`cluster_mtbf_hours(512, '0.04%')` = {m512:.2f} h",
                 "value": {"mtbf_hours": m512}})
    l3_hours = 54 * 24.0
    l3_rate = failure_rate_from_counts(419, 16384 // 8, l3_hours)
    l3_mtbf = cluster_mtbf_hours(16384 // 8, l3_rate)
    rows.append({"key": "llama3_interruptions", "figure": "Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 H100",
                 "source": "Llama 3 paper, sec. 3.3.4, Table 5",
                 "published": "about one every 3 h; 7.76 per 24 h",
                 "ours": f"one every {l3_mtbf:.2f} h; {24.0 / l3_mtbf:.2f} per day",
                 "value": {"mtbf_hours": l3_mtbf, "per_day": 24.0 / l3_mtbf}})
    aws_rate = failure_rate_from_counts(417, 16000 // 8, l3_hours)
    rows.append({"key": "llama3_rate", "figure": "Llama 3: failure rate per instance-hour (8 GPUs an instance)",
                 "source": "AWS HyperPod cost blog (417 failures, 16,000 H100, 54 days)",
                 "published": "0.0161 %",
                 "ours": f"{aws_rate * 100:.4f} % from the blog's counts; {l3_rate * 100:.4f} % from the "
                         f"paper's 419 on 2,048 instances",
                 "value": {"rate_blog": aws_rate, "rate_paper": l3_rate}})
    opt_rate = failure_rate_from_counts(35 + 70, 992 // 8, 60 * 24.0)
    rows.append({"key": "opt175b_rate", "figure": "OPT-175B: 992 A100 (124 instances), 2 months (60 days), 35 manual + 70 automatic restarts",
                 "source": "OPT paper / AWS blog", "published": "0.0588 % per instance-hour",
                 "ours": f"{opt_rate * 100:.4f} % (a lower bound: \"70+\" automatic restarts)",
                 "value": {"rate": opt_rate}})
    ideal = training_days(6.5e6, 2048, 1.0)
    a = advise(256, l3_rate, LLAMA3_ASSUMPTIONS["checkpoint_cost_s"], LLAMA3_ASSUMPTIONS["step_time_s"],
               restart_s=LLAMA3_ASSUMPTIONS["restart_s"], detect_s=LLAMA3_ASSUMPTIONS["detect_s"],
               heal_s=LLAMA3_ASSUMPTIONS["heal_s"], work_gpu_hours=6.5e6)
    cr, cl = a["modes"][CHECKPOINT_RESTART], a["modes"][CHECKPOINTLESS]
    rows.append({"key": "llama3_days", "figure": "Llama 3: 6.5 M H100-hours on 256 p5 instances (2,048 GPUs)",
                 "source": "AWS HyperPod cost blog", "published": "about 132 days",
                 "ours": f"{ideal:.1f} days at goodput 1 (132 days implies goodput {min(1.0, ideal / 132):.2f}: "
                         f"no time lost); at Llama 3's {l3_rate * 100:.4f} % (MTBF {a['mtbf_hours']:.1f} h): "
                         f"checkpoint-restart {cr['training_days']:.1f} days (goodput {cr['goodput'] * 100:.1f} %), "
                         f"checkpointless {cl['training_days']:.1f} days (goodput {cl['goodput'] * 100:.1f} %)*",
                 "value": {"days_ideal": ideal, "implied_goodput": ideal / 132.0,
                           "days_cr": cr["training_days"], "days_cl": cl["training_days"],
                           "goodput_cr": cr["goodput"], "goodput_cl": cl["goodput"]}})
    return rows


def figures_table_markdown() -> str:
    """The public-figures table of ``docs/goodput.md`` (generated; a test keeps them equal)."""
    lines = ["| figure | source | published | our model's output |", "|---|---|---|---|"]
    for r in public_figures():
        lines.append(f"| {r['figure']} | {r['source']} | {r['published']} | {r['ours']} |")
    a = LLAMA3_ASSUMPTIONS
    lines += ["", f"\\* `advise(256, rate, checkpoint_cost_s={a['checkpoint_cost_s']:g}, step_time_s={a['step_time_s']:g}, "
              f"restart_s={a['restart_s']:g}, detect_s={a['detect_s']:g}, heal_s={a['heal_s']:g}, "
              f"work_gpu_hours=6.5e6)`: assumed costs (restore = checkpoint cost, 2 replicas), not Meta's."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m hyperpod_lab.goodput --table``: print the public-figures table (markdown)."""
    p = argparse.ArgumentParser(prog="python -m hyperpod_lab.goodput")
    p.add_argument("--table", action="store_true", help="print the public-figures table of docs/goodput.md")
    a = p.parse_args(argv)
    if not a.table:
        p.print_help()
        return 2
    sys.stdout.write(figures_table_markdown() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
