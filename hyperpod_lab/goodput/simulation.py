"""Monte Carlo simulation of a :class:`Scenario`: per-instance failure times, several tiers,
peers lost within the healing window; it checks the closed forms."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from hyperpod_lab.errors import GoodputInputError
from hyperpod_lab.goodput.scenario import CHECKPOINT_RESTART, CHECKPOINTLESS, LOST_KINDS, SECONDS_PER_HOUR, Scenario, as_scenario


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
    sc = as_scenario(scenario, fields)
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
