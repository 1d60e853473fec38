"""The goodput model's input: units and their checks, failure arithmetic (cluster MTBF from a
per-instance failure rate), checkpoint tiers and the :class:`Scenario`. No torch, no Jupyter."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hyperpod_lab.errors import GoodputInputError
from hyperpod_lab.jobdir import RECOVERY_CHECKPOINTLESS, RECOVERY_MODES, RECOVERY_RESTART, TIER_MEMORY, TIER_REPLICA, TIERS

SECONDS_PER_HOUR = 3600.0
MODEL_MODE = {RECOVERY_RESTART: "checkpoint-restart", RECOVERY_CHECKPOINTLESS: RECOVERY_CHECKPOINTLESS}
"""The model's name of each recovery mode of a spec (:data:`hyperpod_lab.spec.RECOVERY_MODES`): a
restart is modelled as ``checkpoint-restart`` (the whole job restarts and restores a checkpoint)."""
CHECKPOINT_RESTART = MODEL_MODE[RECOVERY_RESTART]
CHECKPOINTLESS = MODEL_MODE[RECOVERY_CHECKPOINTLESS]
MODEL_MODES = tuple(MODEL_MODE[m] for m in RECOVERY_MODES)
"""Every mode the model evaluates, in :data:`hyperpod_lab.spec.RECOVERY_MODES`'s order."""
TIER_ORDER = tuple(t for t in TIERS if t != TIER_REPLICA)
"""The checkpoint tiers the model knows, fastest first: :data:`hyperpod_lab.jobdir.TIERS` but the
checkpointless ``replica`` (healing is the ``checkpointless`` mode's ``heal_s``, not a tier)."""

# Defaults, each from a public figure (../shared/FACTS.md, cited in docs/goodput.md):
DEFAULT_DETECT_S = 30.0     # s from a failure to its detection (assumed; heartbeats of ~1-30 s)
DEFAULT_RESTART_S = 900.0   # s to restart a whole job: 15 min, the low end of AWS's "15-30 min"
                            # checkpoint-based recovery at 2,304 GPUs (checkpointless announcement)
DEFAULT_HEAL_S = 90.0       # s of peer healing: AWS's checkpointless recovery "under 2 min"
DEFAULT_REPLICAS = 2        # data-parallel replicas holding each rank's state
DEFAULT_GPUS_PER_INSTANCE = 8
DEFAULT_MAX_INTERVAL_S = 86400.0  # longest interval advised (a day): checkpoints also guard
                                  # against what the failure rate does not model (bugs, preemption)

def replicas_for(instances: int, replicas: int | None = None) -> tuple[int, str | None]:
    """The replicas of each rank's state to project checkpointless recovery with, and a warning
    when the default was changed.

    Given ``replicas`` are used as they are (:class:`Scenario` then refuses a count that does not
    split ``instances``). Without them: :data:`DEFAULT_REPLICAS` when it splits ``instances``,
    else the fewest replicas above it that do (3 instances -> 3, one replica group per node as
    ``--recovery checkpointless`` runs them), and 1 for a single instance (nothing to heal from:
    every failure falls back to the checkpoint).
    """
    if replicas is not None:
        return replicas, None
    n = int(instances)
    if n >= 1 and n % DEFAULT_REPLICAS == 0:
        return DEFAULT_REPLICAS, None
    chosen = 1 if n <= 1 else next(r for r in range(DEFAULT_REPLICAS, n + 1) if n % r == 0)
    why = ("1 instance: no peer holds a copy of its state, so checkpointless recovery always falls back to "
           "the checkpoint" if chosen == 1 else
           f"{n} instances do not split into groups of {DEFAULT_REPLICAS} replicas: projected with {chosen} "
           f"(give replicas to choose)")
    return chosen, why


RATE_UNIT = ("rates are fractions per instance-hour, e.g. 0.0004, or explicit percentages, "
              "e.g. '0.04%'")
LOST_KINDS = ("checkpoint", "detect", "restart", "restore", "heal", "recompute")
NODE_LOCAL_TIERS = (TIER_MEMORY,)
"""Tiers kept on the node itself (its /dev/shm): lost with the node. ``peer`` is another node's
memory, ``persistent`` and ``s3`` are off the node."""


def tier_survival(name: str, node_loss_fraction: float = 1.0) -> float:
    """Probability that tier ``name``'s newest checkpoint is readable after a failure when a
    fraction ``node_loss_fraction`` of the failures take their node: ``1 - node_loss_fraction``
    for a node-local tier (:data:`NODE_LOCAL_TIERS`), else 1."""
    return 1.0 - float(node_loss_fraction) if name in NODE_LOCAL_TIERS else 1.0


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
        raise GoodputInputError(field, f"{rate!r} is not a failure rate; {RATE_UNIT}")
    percent = isinstance(rate, str) and rate.strip().endswith("%")
    text = rate.strip()[:-1].strip() if percent else rate
    try:
        value = float(text)
    except ValueError:
        raise GoodputInputError(field, f"{rate!r} is not a number; {RATE_UNIT}") from None
    if not math.isfinite(value):
        raise GoodputInputError(field, f"{rate!r} is not finite; {RATE_UNIT}")
    if value < 0:
        raise GoodputInputError(field, f"{rate!r} is negative: a failure rate is at least 0; {RATE_UNIT}")
    if percent:
        if value > 100:
            raise GoodputInputError(field, f"{rate!r} is above 100 %; {RATE_UNIT}")
        return value / 100.0
    if value > 1:
        raise GoodputInputError(field, f"{rate!r} is above 1; {RATE_UNIT} (did you mean '{text}%'?)")
    return value


def checked_instances(n: Any, field: str = "instances") -> int:
    if isinstance(n, bool) or not isinstance(n, (int, float, np.integer, np.floating)) or n != int(n):
        raise GoodputInputError(field, f"{n!r} is not a whole number of instances (nodes), e.g. 512")
    if int(n) < 1:
        raise GoodputInputError(field, f"{n!r}: a cluster has at least 1 instance (node)")
    return int(n)


def checked_seconds(x: Any, field: str, positive: bool = False, unit: str = "s", what: str = "a finite duration in seconds") -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise GoodputInputError(field, f"{x!r} is not a number; expected {what}")
    x = float(x)
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        need = "more than 0" if positive else "0 or more"
        raise GoodputInputError(field, f"{x!r} {unit}: expected {what}, {need}")
    return x


def checked_probability(x: Any, field: str) -> float:
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
    n = checked_instances(instances)
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
    hours = checked_seconds(hours, "hours", positive=True, unit="h", what="a finite duration in hours")
    return failures / (checked_instances(instances) * hours)


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
        object.__setattr__(self, "blocked_s", checked_seconds(self.blocked_s, f + ".blocked_s"))
        object.__setattr__(self, "restore_s", checked_seconds(self.restore_s, f + ".restore_s"))
        object.__setattr__(self, "survives_failure", checked_probability(self.survives_failure, f + ".survives_failure"))


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
        put("instances", checked_instances(self.instances))
        put("failure_rate_per_instance_hour", parse_failure_rate(self.failure_rate_per_instance_hour,
                                                                 "failure_rate_per_instance_hour"))
        put("step_time_s", checked_seconds(self.step_time_s, "step_time_s", positive=True))
        tiers = tuple(t if isinstance(t, Tier) else Tier(**t) for t in (self.tiers or ()))
        if not tiers:
            raise GoodputInputError("tiers", "at least one checkpoint tier is needed, e.g. "
                                    "Tier('persistent', interval_steps=100, blocked_s=20)")
        if tiers[-1].survives_failure != 1.0:
            raise GoodputInputError("tiers", f"the last tier ({tiers[-1].name}) must survive every failure "
                                    "(survives_failure=1.0): add a persistent or s3 tier")
        put("tiers", tiers)
        if self.mode not in MODEL_MODES:
            raise GoodputInputError("mode", f"{self.mode!r}: expected one of {', '.join(MODEL_MODES)}")
        for k in ("detect_s", "restart_s", "heal_s"):
            put(k, checked_seconds(getattr(self, k), k))
        if self.heal_window_s is not None:
            put("heal_window_s", checked_seconds(self.heal_window_s, "heal_window_s"))
        r = self.replicas
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
            raise GoodputInputError("replicas", f"{r!r}: expected a whole number of replicas, at least 1")
        put("replicas", int(r))
        if self.fallback_probability is not None:
            put("fallback_probability", checked_probability(self.fallback_probability, "fallback_probability"))
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


def as_scenario(scenario: Scenario | None, fields: dict) -> Scenario:
    if scenario is None:
        return Scenario(**fields)
    return scenario.with_(**fields) if fields else scenario
