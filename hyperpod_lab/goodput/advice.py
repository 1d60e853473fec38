"""Advice: the recommended checkpoint interval and projected goodput per recovery mode, the
goodput-against-interval curve and plot (matplotlib, imported only there), the text report."""

from __future__ import annotations

import io
import math
from typing import Any, Iterable

import numpy as np

from hyperpod_lab.errors import GoodputInputError
from hyperpod_lab.goodput.band import BAND_FACTOR, rate_inputs, restart_band
from hyperpod_lab.goodput.closed_form import daly_interval_s, expected_goodput, goodput_breakdown, training_days, young_interval_s
from hyperpod_lab.goodput.scenario import (
    CHECKPOINT_RESTART,
    CHECKPOINTLESS,
    DEFAULT_DETECT_S,
    DEFAULT_GPUS_PER_INSTANCE,
    DEFAULT_HEAL_S,
    DEFAULT_MAX_INTERVAL_S,
    DEFAULT_RESTART_S,
    MODEL_MODES,
    RATE_UNIT,
    SECONDS_PER_HOUR,
    Scenario,
    Tier,
    checked_instances,
    checked_seconds,
    replicas_for,
)


def _recommended_interval_s(cost_s: float, mtbf_s: float, max_interval_s: float) -> float:
    if math.isinf(mtbf_s):
        return max_interval_s
    if cost_s == 0:
        return 0.0
    return min(daly_interval_s(cost_s, mtbf_s), max_interval_s)


def _steps(interval_s: float, step_time_s: float) -> int:
    return max(1, int(round(interval_s / step_time_s)))


def advise(instances: int, failure_rate: Any, checkpoint_cost_s: float, step_time_s: float, *,
           restart_s: Any = DEFAULT_RESTART_S, detect_s: float = DEFAULT_DETECT_S,
           heal_s: float = DEFAULT_HEAL_S, restore_s: float | None = None, replicas: int | None = None,
           fallback_probability: float | None = None, work_gpu_hours: float | None = None,
           gpus_per_instance: int = DEFAULT_GPUS_PER_INSTANCE,
           max_interval_s: float = DEFAULT_MAX_INTERVAL_S, failure_rate_per_day: Any = None,
           band_factor: float = BAND_FACTOR) -> dict:
    """Recommended checkpoint interval and projected goodput for each recovery mode.

    One persistent tier; the interval is Daly's (:func:`daly_interval_s`) for the MTBF of the
    failures that need the checkpoint: every failure for checkpoint-restart, only those peers
    cannot heal for checkpointless (MTBF / fallback probability), at most ``max_interval_s``.
    The interval is chosen at the middle failure rate and restart time; the projected goodput at
    that interval is also given as a band (``goodput_band``: low, mid, high) over the failure
    rate and the restart time (:mod:`hyperpod_lab.goodput.band`).

    Args:
        instances: instances (nodes), at least 1.
        failure_rate: per instance-hour: a fraction (``0.0004``), ``"0.04%"`` or a range
            (``"0.01%:0.06%"``); more than 0. None when ``failure_rate_per_day`` is given.
        checkpoint_cost_s: seconds one checkpoint blocks training.
        step_time_s: seconds per training step.
        restart_s, detect_s, heal_s: seconds of a job restart (a value, spanning half to twice it
            in the band, or a range ``"60:900"``), of failure detection, of peer healing
            (defaults from public figures, see docs/goodput.md).
        restore_s: seconds to load the checkpoint (default ``checkpoint_cost_s``).
        replicas, fallback_probability: checkpointless fallback (see :class:`Scenario`); replicas
            default to :func:`~hyperpod_lab.goodput.scenario.replicas_for` ``(instances)``.
        work_gpu_hours: useful GPU-hours of the training run, to project training days.
        gpus_per_instance: GPUs per instance (8 for p5 / p4d).
        max_interval_s: longest interval to recommend, seconds.
        failure_rate_per_day: instead of ``failure_rate``: the job's failures a day (all its
            ``instances``), a number or a range.
        band_factor: how far a single value spans either way in the band (default 2).

    Returns:
        A JSON-serialisable dict: ``instances``, ``failure_rate_per_instance_hour``,
        ``mtbf_hours``, ``mtbf_s``, ``failures_per_day``, ``checkpoint_cost_s``,
        ``step_time_s`` and ``modes``: for each recovery mode ``interval_s``, ``interval_steps``,
        ``young_interval_s``, ``goodput``, ``lost`` (fractions of wall time),
        ``fallback_probability``, ``goodput_band`` (``{"low", "mid", "high"}``), and
        ``training_days`` when ``work_gpu_hours`` is given; ``band`` (the failure rate, MTBF and
        restart seconds of each point and where they came from) and ``warnings`` (an implausible
        bare rate: :func:`~hyperpod_lab.goodput.band.rate_warning`). The top-level rate, MTBF
        and restart seconds are the middle ones.

    Raises:
        GoodputInputError: an input out of range or in the wrong unit.
    """
    rates, rate_from, warnings = rate_inputs(instances, failure_rate, failure_rate_per_day, band_factor)
    replicas, why = replicas_for(checked_instances(instances, "instances"), replicas)
    warnings = warnings + ([why] if why else [])
    rate = rates[1]
    if rate == 0 or rates[0] == 0:
        raise GoodputInputError("failure_rate", f"0 gives no finite MTBF to plan for; {RATE_UNIT}")
    restarts, restart_from = restart_band(restart_s, (), DEFAULT_RESTART_S, band_factor)
    cost = checked_seconds(checkpoint_cost_s, "checkpoint_cost_s")
    base = Scenario(instances=instances, failure_rate_per_instance_hour=rate, step_time_s=step_time_s,
                    tiers=[Tier("persistent", 1, cost, cost if restore_s is None else restore_s)],
                    detect_s=detect_s, restart_s=restarts[1], heal_s=heal_s, replicas=replicas,
                    fallback_probability=fallback_probability)
    points = {"low": (rates[2], restarts[2]), "mid": (rates[1], restarts[1]), "high": (rates[0], restarts[0])}
    max_interval_s = checked_seconds(max_interval_s, "max_interval_s", positive=True)
    if work_gpu_hours is not None:
        checked_seconds(work_gpu_hours, "work_gpu_hours", positive=True, unit="GPU-h", what="useful GPU-hours")
    gpus = base.instances * checked_instances(gpus_per_instance, "gpus_per_instance")
    m = base.mtbf_s
    modes = {}
    for mode in MODEL_MODES:
        sc = base.with_(mode=mode)
        q = sc.peer_loss_probability
        m_need = m / q if q > 0 else math.inf
        interval = _recommended_interval_s(cost, m_need, max_interval_s)
        steps = _steps(interval, sc.step_time_s)
        sc = sc.with_(tiers=[Tier("persistent", steps, cost, sc.tiers[0].restore_s)])
        b = goodput_breakdown(sc)
        band = {k: goodput_breakdown(sc.with_(failure_rate_per_instance_hour=r, restart_s=x))["goodput"]
                for k, (r, x) in points.items()}
        entry = {"interval_s": steps * sc.step_time_s, "interval_steps": steps,
                 "young_interval_s": min(young_interval_s(cost, m_need), max_interval_s)
                 if not math.isinf(m_need) else max_interval_s,
                 "goodput": b["goodput"], "goodput_band": band, "lost": b["lost"], "fallback_probability": q,
                 "cost_per_failure_s": b["cost_per_failure_s"]}
        if work_gpu_hours is not None:
            days = training_days(work_gpu_hours, gpus, b["goodput"])
            entry["training_days"] = None if math.isinf(days) else days
        modes[mode] = entry
    return {"instances": base.instances, "gpus": gpus, "failure_rate_per_instance_hour": rate,
            "mtbf_hours": m / SECONDS_PER_HOUR, "mtbf_s": m, "failures_per_day": 86400.0 / m,
            "checkpoint_cost_s": cost, "step_time_s": base.step_time_s, "detect_s": base.detect_s,
            "restart_s": base.restart_s, "heal_s": base.heal_s, "restore_s": base.tiers[0].restore_s,
            "work_gpu_hours": work_gpu_hours, "modes": modes,
            "band": {**{k: {"failure_rate_per_instance_hour": r, "restart_s": x,
                            "mtbf_hours": 1.0 / (base.instances * r)} for k, (r, x) in points.items()},
                     "failure_rate_from": rate_from, "restart_from": restart_from},
            "warnings": warnings}


def goodput_curve(advice: dict, intervals_s: Iterable[float]) -> dict:
    """Goodput against the checkpoint interval for each recovery mode of an :func:`advise` result.

    Returns:
        ``{"interval_s": [...], mode: [goodput, ...] for each mode}``.
    """
    xs = [float(x) for x in intervals_s]
    out: dict[str, list] = {"interval_s": xs}
    for mode in MODEL_MODES:
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
    for mode, color in zip(MODEL_MODES, ("tab:red", "tab:blue")):
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


_OPTIONAL_PARTS = ("health_check", "hang", "straggle")  # lost-time parts listed only when the job had them


def _kept(tier: dict) -> str:
    """``"memory lost"``, ``"peer kept"``: a projected tier after a failure."""
    p = tier["survives_failure"]
    return f"{tier['name']} " + ("lost" if p == 0 else "kept" if p == 1 else f"kept {p * 100:.3g} %")


def _band(b: dict) -> str:
    """``"70.8-94.3 %"``: a goodput band's low and high."""
    return f"{b['low'] * 100:.1f}-{b['high'] * 100:.1f} %"


def _band_inputs(band: dict) -> str:
    """What a band assumes: the failure rates (and MTBF) and restart seconds of low and high."""
    lo, hi = band["low"], band["high"]
    return (f"band: low at {lo['failure_rate_per_instance_hour'] * 100:.3g} % per instance-hour and "
            f"{_duration(lo['restart_s'])} restarts, high at {hi['failure_rate_per_instance_hour'] * 100:.3g} % and "
            f"{_duration(hi['restart_s'])} (rate: {band['failure_rate_from']}; restart: {band['restart_from']})")


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
    head = ["RECOVERY MODE", "CHECKPOINT EVERY", "GOODPUT (LOW-HIGH)"] \
        + (["TRAINING DAYS"] if a.get("work_gpu_hours") else []) + ["LOST TO (% OF WALL TIME)"]
    rows = []
    for mode, m in a["modes"].items():
        lost = ", ".join(f"{k} {v * 100:.2g}" for k, v in m["lost"].items() if v >= 5e-5)
        row = [mode, f"{_duration(m['interval_s'])} ({m['interval_steps']} steps)",
               _pct(m["goodput"]) + (f" ({_band(m['goodput_band'])})" if m.get("goodput_band") else "")]
        if a.get("work_gpu_hours"):
            row.append("-" if m.get("training_days") is None else f"{m['training_days']:.1f}")
        rows.append(row + [lost])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    for r in [head] + rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if a.get("band"):
        lines.append(_band_inputs(a["band"]))
    if measured is not None:
        mm = measured
        st = "-" if mm["step_time_s"] is None else f"{mm['step_time_s']:.3g} s"
        lines.append(f"measured ({mm['job_id']}): {mm['steps']} steps in {mm['wall_s']:.4g} s, step {st}, "
                     f"goodput {_pct(mm['goodput'])}, {mm['faults']} faults, {len(mm['recoveries'])} recoveries")
        lines.append("  lost: " + ", ".join(f"{k} {_pct(v)}" for k, v in mm["lost_fraction"].items()
                                            if k not in _OPTIONAL_PARTS or v))  # only jobs that had them
        for name, t in mm["tiers"].items():
            every = "-" if t["interval_steps"] is None else f"{t['interval_steps']:g}"
            rs = "" if t["restore_s"] is None else f", restore {t['restore_s']:.3g} s"
            lines.append(f"  tier {name}: {t['checkpoints']} checkpoints, every {every} steps, "
                         f"blocked {t['blocked_s']:.3g} s each{rs}")
        for r in mm["recoveries"]:
            hc = f", health checks {r['health_check_s']:.3g} s" if r.get("health_check_s") else ""
            hung = f"hung {r['hang_s']:.3g} s before its detection, " if r.get("hang_s") else ""
            lines.append(f"  recovery from {r['restored_from']}: {hung}downtime {r['downtime_s']:.3g} s (restore "
                         f"{r['restore_s']:.3g} s{hc}), {r['recomputed_steps']} steps recomputed")
    if projection is not None:
        p = projection
        lines.append(f"projected with the job's measured costs at {p['instances']} instances (mid, low-high): "
                     + ", ".join(f"{mode} {_pct(m['goodput'])} ({_band(m['goodput_band'])})"
                                 for mode, m in p["modes"].items()))
        lines.append("  " + _band_inputs(p["band"]))
        lines.append("  tiers after a node loss: " + ", ".join(_kept(t) for t in p["tiers"]))
    return "\n".join(lines)
