"""The goodput model (hyperpod_lab.goodput): closed forms against the Monte Carlo simulator,
properties (hypothesis), the public figures of docs/goodput.md, calibration from a job's
events, and the ``goodput`` command (CLI and %hyperpod magic)."""

import io
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperpod_lab import goodput as gp
from hyperpod_lab.cli import run
from hyperpod_lab.errors import GoodputInputError, SpecError
from hyperpod_lab.events import Event, EventWriter
from hyperpod_lab.goodput import Scenario, Tier
from hyperpod_lab.goodput.scenario import replicas_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rate_for_mtbf(instances: int, mtbf_s: float) -> float:
    """Failure rate per instance-hour that gives a cluster of ``instances`` this MTBF (s)."""
    return 3600.0 / (instances * mtbf_s)


# ---- input checking -------------------------------------------------------------------------
def test_failure_rate_units():
    assert gp.parse_failure_rate("0.04%") == pytest.approx(0.0004)
    assert gp.parse_failure_rate(" 0.04 % ") == pytest.approx(0.0004)
    assert gp.parse_failure_rate(0.0004) == 0.0004
    assert gp.parse_failure_rate("0.0004") == 0.0004
    assert gp.parse_failure_rate(0) == 0.0
    assert gp.parse_failure_rate(1) == 1.0


@pytest.mark.parametrize("bad, words", [
    (-0.0004, ["negative", "fractions per instance-hour", "'0.04%'"]),
    ("-0.04%", ["negative", "fractions per instance-hour"]),
    (4, ["above 1", "fractions per instance-hour", "0.0004", "did you mean '4%'"]),
    ("0.04", None),  # fine: a fraction
    ("150%", ["above 100 %"]),
    ("fast", ["not a number", "fractions per instance-hour"]),
    (float("nan"), ["not finite"]),
    (True, ["not a failure rate"]),
])
def test_bad_failure_rates_name_the_unit(bad, words):
    if words is None:
        assert gp.parse_failure_rate(bad) == 0.04
        return
    with pytest.raises(GoodputInputError) as ei:
        gp.parse_failure_rate(bad)
    assert isinstance(ei.value, SpecError) and isinstance(ei.value, ValueError)
    for w in words:
        assert w in str(ei.value), str(ei.value)


def test_bad_input_is_refused_with_its_unit():
    tier = [Tier("persistent", 100, 10)]
    cases = [
        (lambda: gp.cluster_mtbf_hours(0, 0.0004), "at least 1 instance"),
        (lambda: gp.cluster_mtbf_hours(-5, 0.0004), "at least 1 instance"),
        (lambda: gp.cluster_mtbf_hours(2.5, 0.0004), "whole number of instances"),
        (lambda: gp.cluster_mtbf_hours(512, 4), "fractions per instance-hour"),
        (lambda: gp.young_interval_s(-1, 3600), "duration in seconds"),
        (lambda: gp.advise(512, "0.04%", -30, 2.0), "checkpoint_cost_s: -30.0 s: expected a finite duration in seconds"),
        (lambda: gp.advise(512, "0.04%", 30, 2.0, restart_s=-1), "restart_s"),
        (lambda: gp.advise(512, 0, 30, 2.0), "no finite MTBF"),
        (lambda: gp.advise(0, "0.04%", 30, 2.0), "at least 1 instance"),
        (lambda: Scenario(512, "0.04%", 0, tier), "step_time_s: 0.0 s"),
        (lambda: Scenario(512, "0.04%", 1, []), "at least one checkpoint tier"),
        (lambda: Scenario(512, "0.04%", 1, [Tier("memory", 1, 0.1, survives_failure=0.5)]), "must survive every failure"),
        (lambda: Scenario(512, "0.04%", 1, tier, mode="pray"), "checkpoint-restart, checkpointless"),
        (lambda: Scenario(5, "0.04%", 1, tier, mode="checkpointless", replicas=2), "groups of 2 replicas"),
        (lambda: Tier("persistent", 0, 10), "whole number of steps, at least 1"),
        (lambda: Tier("s3", 10, 10, survives_failure=95), "fraction in [0, 1] (not a percentage)"),
        (lambda: gp.training_days(6.5e6, 0, 1.0), "at least 1"),
    ]
    for call, words in cases:
        with pytest.raises(GoodputInputError) as ei:
            call()
        assert words in str(ei.value), (words, str(ei.value))


# ---- closed forms ---------------------------------------------------------------------------
def test_mtbf_and_intervals():
    assert gp.cluster_mtbf_hours(512, "0.04%") == pytest.approx(1 / (512 * 0.0004))
    assert gp.cluster_mtbf_hours(512, 0) == math.inf
    c, m = 60.0, 36000.0
    assert gp.young_daly_interval(c, m, order=1) == pytest.approx(math.sqrt(2 * c * m))
    x = c / (2 * m)
    assert gp.young_daly_interval(c, m) == gp.young_interval_s(c, m)
    assert gp.young_daly_interval(c, m, order=2) == pytest.approx(math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c)
    with pytest.raises(GoodputInputError, match="1 .Young 1974. or 2 .Daly 2006."):
        gp.young_daly_interval(c, m, order=3)
    assert gp.daly_interval_s(7200, 3600) == 3600  # C >= 2M: checkpoint every MTBF
    assert gp.training_days(6.5e6, 2048, 1.0) == pytest.approx(6.5e6 / 2048 / 24)
    assert gp.training_days(100, 1, 0.5) == pytest.approx(2 * 100 / 24)


def test_daly_interval_maximises_the_exact_exponential_goodput():
    c, r, m = 30.0, 600.0, 5 * 3600.0
    taus = np.geomspace(50, 20000, 4000)
    best = taus[np.argmax([gp.exponential_goodput(t, c, r, m) for t in taus])]
    assert gp.daly_interval_s(c, m) == pytest.approx(best, rel=0.01)
    assert abs(gp.young_interval_s(c, m) - best) > abs(gp.daly_interval_s(c, m) - best)


def test_closed_form_breakdown_adds_up_and_reduces_to_young_waste():
    sc = Scenario(512, "0.04%", 2.0, [Tier("persistent", 500, 30, restore_s=60)], detect_s=30, restart_s=900)
    b = gp.goodput_breakdown(sc)
    assert b["goodput"] + sum(b["lost"].values()) == pytest.approx(1.0)
    m, tau, c = sc.mtbf_s, 1000.0, 30.0
    assert b["cost_per_failure_s"] == pytest.approx(30 + 900 + 60 + (tau + c) / 2)
    assert b["goodput"] == pytest.approx((1 - (990 + (tau + c) / 2) / m) / (1 + c / tau))
    assert b["lost"]["heal"] == 0 and b["fallback_probability"] == 1.0
    # no failures: only the checkpoint stalls cost anything
    assert gp.expected_goodput(sc, failure_rate_per_instance_hour=0) == pytest.approx(tau / (tau + c))


# ---- properties ----------------------------------------------------------------------------
tiers_st = st.lists(st.tuples(st.integers(1, 5000), st.floats(0, 300), st.floats(0, 600), st.floats(0, 1)),
                    min_size=1, max_size=3)


def make_scenario(instances, rate, step, tiers, mode, detect, heal, extra_restart, replicas_exp, q):
    ts = [Tier(f"t{i}", n, c, r, 1.0 if i == len(tiers) - 1 else sv) for i, (n, c, r, sv) in enumerate(tiers)]
    replicas = 2 ** replicas_exp
    # physically, restarting a job costs at least healing it: restart >= heal + the stalls
    restart = heal + sum(t.blocked_s for t in ts) + extra_restart
    return Scenario(instances * replicas, rate, step, ts, mode=mode, detect_s=detect, restart_s=restart,
                    heal_s=heal, replicas=replicas, fallback_probability=q)


scenario_args = dict(
    instances=st.integers(1, 2048), rate=st.floats(0, 0.05), step=st.floats(0.01, 60), tiers=tiers_st,
    mode=st.sampled_from(gp.MODEL_MODES), detect=st.floats(0, 600), heal=st.floats(0, 600),
    extra_restart=st.floats(0, 3600), replicas_exp=st.integers(0, 2), q=st.none() | st.floats(0, 1))


@PROPS
@given(**scenario_args)
def test_goodput_is_a_fraction(**kw):
    sc = make_scenario(**kw)
    b = gp.goodput_breakdown(sc)
    assert 0.0 <= b["goodput"] <= 1.0
    assert all(v >= 0 for v in b["lost"].values())
    assert b["goodput"] + sum(b["lost"].values()) == pytest.approx(1.0)


@PROPS
@given(**scenario_args, factor=st.floats(1.0, 100.0))
def test_goodput_does_not_rise_with_the_failure_rate(factor, **kw):
    sc = make_scenario(**kw)
    worse = sc.with_(failure_rate_per_instance_hour=min(1.0, sc.failure_rate_per_instance_hour * factor))
    assert gp.expected_goodput(worse) <= gp.expected_goodput(sc) + 1e-12


@PROPS
@given(**scenario_args, factor=st.floats(1.0, 100.0), which=st.integers(0, 2))
def test_goodput_does_not_rise_with_the_checkpoint_cost(factor, which, **kw):
    sc = make_scenario(**kw)
    k = which % len(sc.tiers)
    slower = list(sc.tiers)
    slower[k] = Tier(slower[k].name, slower[k].interval_steps, slower[k].blocked_s * factor,
                     slower[k].restore_s, slower[k].survives_failure)
    assert gp.expected_goodput(sc.with_(tiers=slower)) <= gp.expected_goodput(sc) + 1e-12


@settings(max_examples=12, deadline=None)
@given(cost=st.floats(5, 300), mtbf_per_cost=st.floats(30, 3000), downtime_per_mtbf=st.floats(0, 0.1),
       seed=st.integers(0, 2 ** 16))
def test_young_daly_interval_minimises_simulated_lost_time(cost, mtbf_per_cost, downtime_per_mtbf, seed):
    """Lost time (1 - goodput) simulated on a grid of intervals around Daly's: Daly's and
    Young's are within 5 % of the best of the grid (the same failure times for every interval)."""
    m = cost * mtbf_per_cost
    daly_s = gp.young_daly_interval(cost, m, order=2)
    step = daly_s / 100
    base = Scenario(64, rate_for_mtbf(64, m), step, [Tier("persistent", 100, cost)],
                    detect_s=0, restart_s=downtime_per_mtbf * m)
    young = gp.young_daly_interval(cost, m, order=1) / daly_s
    lost = {f: 1 - gp.simulate(base.with_(tiers=[Tier("persistent", round(100 * f), cost)]),
                               failures=1500, seed=seed)["goodput"]
            for f in (0.4, 0.6, 0.8, 1.0, young, 1.25, 1.6, 2.5)}
    assert lost[1.0] <= 1.05 * min(lost.values()), lost
    assert lost[young] <= 1.05 * min(lost.values()), lost


# ---- closed forms against the Monte Carlo simulator ---------------------------------------
@settings(max_examples=10, deadline=None)
@given(cost=st.floats(1, 600), mtbf_h=st.floats(0.5, 48), downtime_s=st.floats(0, 3600),
       interval_factor=st.floats(0.3, 3), seed=st.integers(0, 2 ** 16))
def test_simulation_matches_the_exact_exponential_form(cost, mtbf_h, downtime_s, interval_factor, seed):
    m = mtbf_h * 3600
    tau = max(1.0, interval_factor * gp.daly_interval_s(cost, m))
    exact = gp.exponential_goodput(tau, cost, downtime_s, m)
    if exact < 0.7:  # the simulation's noise grows as goodput falls (2 % at 0.5 with 4,000 failures)
        return
    sc = Scenario(128, rate_for_mtbf(128, m), tau / 200, [Tier("persistent", 200, cost)], detect_s=0,
                  restart_s=downtime_s)
    sim = gp.simulate(sc, failures=4000, seed=seed)
    assert sim["goodput"] == pytest.approx(exact, rel=0.02)


def test_simulation_matches_first_order_closed_form_with_several_tiers():
    tiers = [Tier("memory", 10, 0.5, restore_s=5, survives_failure=0.9),
             Tier("persistent", 100, 20, restore_s=60, survives_failure=0.95),
             Tier("s3", 500, 5, restore_s=300)]
    sc = Scenario(1024, "0.01%", 1.5, tiers, detect_s=20, restart_s=300)
    sim = gp.simulate(sc, failures=4000, seed=3)
    closed = gp.goodput_breakdown(sc)
    assert sim["goodput"] == pytest.approx(closed["goodput"], rel=0.02)
    assert set(sim["restored_from"]) == {"memory", "persistent", "s3"}  # every tier was used
    n = sim["failures"]
    assert sim["restored_from"]["memory"] / n == pytest.approx(0.9, abs=0.02)
    assert sim["restored_from"]["s3"] / n == pytest.approx(0.1 * 0.05, abs=0.005)
    for kind in ("checkpoint", "restore"):
        assert sim["lost"][kind] == pytest.approx(closed["lost"][kind], rel=0.1)


@pytest.mark.parametrize("q", [0.2, None])
def test_simulation_matches_closed_form_checkpointless_with_fallback(q):
    """Checkpointless: peers heal most failures; the rest fall back to the persistent tier —
    either with a given probability, or when the other replica of the failed instance's state
    also fails within the healing window (per-instance failure times in the simulation)."""
    rate = "0.5%"  # high, so that losing both replicas within the 1 h window happens (~0.5 %)
    tiers = [Tier("persistent", 400, 30, restore_s=120)]
    sc = Scenario(256, rate, 2.0, tiers, mode="checkpointless", detect_s=10, restart_s=600, heal_s=60,
                  heal_window_s=3600, replicas=2, fallback_probability=q)
    sim = gp.simulate(sc, failures=6000, seed=11)
    closed = gp.goodput_breakdown(sc)
    expected_q = q if q is not None else -math.expm1(-0.005 / 3600 * 3600)
    assert closed["fallback_probability"] == pytest.approx(expected_q)
    n = sim["failures"]
    assert sim["fallbacks"] / n == pytest.approx(expected_q, abs=4 * math.sqrt(expected_q * (1 - expected_q) / n))
    assert sim["fallbacks"] > 10
    assert sim["goodput"] == pytest.approx(closed["goodput"], rel=0.02)
    cr = gp.simulate(sc.with_(mode="checkpoint-restart"), failures=6000, seed=11)
    assert sim["goodput"] > cr["goodput"] + 0.05


def test_simulation_is_seeded():
    sc = Scenario(64, "0.1%", 1.0, [Tier("persistent", 100, 5)])
    assert gp.simulate(sc, failures=200, seed=5) == gp.simulate(sc, failures=200, seed=5)
    assert gp.simulate(sc, failures=200, seed=5) != gp.simulate(sc, failures=200, seed=6)


# ---- public figures -------------------------------------------------------------------------
def test_public_figures_are_reproduced():
    rows = {r["key"]: r["value"] for r in gp.public_figures()}
    assert rows["cluster_mtbf_512"]["mtbf_hours"] == pytest.approx(4.9, abs=0.05)
    l3 = rows["llama3_interruptions"]
    assert l3["mtbf_hours"] == pytest.approx(3.0, abs=0.1) and l3["per_day"] == pytest.approx(7.76, abs=0.005)
    rate = rows["llama3_rate"]
    assert rate["rate_blog"] * 100 == pytest.approx(0.0161, abs=0.00005)
    assert rate["rate_paper"] * 100 == pytest.approx(0.0158, abs=0.00005)
    assert rows["opt175b_rate"]["rate"] * 100 == pytest.approx(0.0588, abs=0.00005)
    days = rows["llama3_days"]
    assert days["days_ideal"] == pytest.approx(132, abs=0.5)
    assert days["implied_goodput"] == pytest.approx(1.0, abs=0.01)
    assert days["days_ideal"] < days["days_cl"] < days["days_cr"]


def test_docs_table_is_the_generated_one():
    table = gp.figures_table_markdown()
    with open(os.path.join(REPO, "docs", "goodput.md")) as f:
        assert table in f.read(), "docs/goodput.md is stale: paste `python -m hyperpod_lab.goodput --table`"
    p = subprocess.run([sys.executable, "-m", "hyperpod_lab.goodput", "--table"], capture_output=True, text=True,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == table
    rows = {r["key"]: r["value"] for r in gp.public_figures()}
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    for number in (f"every {rows['cluster_mtbf_512']['mtbf_hours']:.2f} h",
                   f"one every {rows['llama3_interruptions']['mtbf_hours']:.2f} h",
                   f"{rows['llama3_interruptions']['per_day']:.2f} a day",
                   f"{rows['llama3_rate']['rate_paper'] * 100:.4f} %", f"{rows['llama3_rate']['rate_blog'] * 100:.4f} %",
                   f"{rows['opt175b_rate']['rate'] * 100:.4f} %", f"{rows['llama3_days']['days_ideal']:.1f} days"):
        assert number in readme, f"README's goodput section is stale: {number!r} missing"


# ---- calibration from events ----------------------------------------------------------------
def ev(kind, t, writer="rank-0", **data):
    ev.seq[writer] = ev.seq.get(writer, -1) + 1
    return Event(kind=kind, job_id="job-1", time=t, writer=writer, seq=ev.seq[writer], data=data)


ev.seq = {}


def job_events():
    """A job of 0.5 s steps, memory checkpoints every 4 steps (0.05 s blocked, on 2 ranks),
    persistent every 8 (0.2 s); killed after step 9, restored from memory step 7 in 3 s."""
    ev.seq = {}
    out = [ev("submitted", 99.0, "client"), ev("started", 100.0, world_size=2)]
    t = 100.0
    for step in range(10):
        t += 0.5
        out.append(ev("step", t, step=step, loss=1.0 / (step + 1)))
        if (step + 1) % 4 == 0:
            for r in (0, 1):
                out.append(ev("checkpoint.saved", t + 0.05, f"rank-{r}", tier="memory", step=step,
                              blocked_s=0.05 if r == 0 else 0.04, total_s=0.05, rank=r))
            t += 0.05
        if (step + 1) % 8 == 0:
            out.append(ev("checkpoint.saved", t + 0.2, tier="persistent", step=step, blocked_s=0.2, total_s=0.2))
            t += 0.2
    # the fault: last step event at t (step 9); detected 1 s later; restarted; restored from memory step 7
    fault = t + 1.0
    out.append(ev("fault.detected", fault, "agent-n1", rank=1, node="n1", signal="SIGKILL"))
    out.append(ev("recovery.started", fault + 0.1, "agent-n1", restart_count=1, reason="local worker failed"))
    out.append(ev("started", fault + 2.0, world_size=2))
    for r in (0, 1):
        out.append(ev("checkpoint.restored", fault + 2.5, f"rank-{r}", tier="memory", step=7,
                      seconds=0.3 if r == 0 else 0.4, rank=r))
    t = fault + 3.0
    out.append(ev("recovery.completed", t, restored_step=7, restart_count=1, downtime_s=3.0, restored_from="memory"))
    for step in range(8, 12):
        out.append(ev("step", t, step=step, loss=0.1))
        t += 0.5
    out.append(ev("finished", t, status="succeeded", steps=12))
    return out


def test_measure_from_events():
    events = job_events()
    m = gp.measure_from_events(list(reversed(events)))  # any order
    json.dumps(m, allow_nan=False)
    assert m["step_time_s"] == pytest.approx(0.5)
    assert m["steps"] == 12 and m["faults"] == 1
    assert m["tiers"]["memory"] == {"checkpoints": 2, "interval_steps": 4, "blocked_s": pytest.approx(0.05),
                                    "blocked_total_s": pytest.approx(0.1), "restore_s": pytest.approx(0.4)}
    assert m["tiers"]["persistent"]["checkpoints"] == 1 and m["tiers"]["persistent"]["interval_steps"] is None
    (r,) = m["recoveries"]
    assert r["restored_from"] == "memory" and r["downtime_s"] == 3.0
    assert r["detect_s"] == pytest.approx(1.0) and r["restore_s"] == pytest.approx(0.4)
    assert r["restart_s"] == pytest.approx(2.6) and r["recomputed_steps"] == 2  # steps 8 and 9
    lost = m["lost_s"]
    assert lost["checkpoint"] == pytest.approx(0.3) and lost["recompute"] == pytest.approx(1.0)
    assert lost["other"] == pytest.approx(0.0, abs=1e-9)  # every lost second has a cause here
    assert m["wall_s"] == pytest.approx(events[-1].time - 100.0)
    assert m["goodput"] == pytest.approx(12 * 0.5 / m["wall_s"])
    assert m["goodput"] + sum(lost.values()) / m["wall_s"] == pytest.approx(1.0)


def job_events_with_health_checks():
    """job_events with the nodes' pre-flight health checks: before the start (n0 from 99.2 to
    99.6, n3 from 99.1 to 99.8, where n3's /dev/shm check fails and n3 is excluded; spare n2
    from 99.5 to 99.9) and again during the restart (n2, 1 s ending 1.5 s after the
    detection)."""
    base = job_events()
    fault = next(e for e in base if e.kind == "fault.detected").time
    ok = {"status": "passed", "detail": "", "seconds": 0.1}
    extra = [ev("health.checked", 99.6, "health-n0", node="n0", ok=True, seconds=0.4, checks={"gpu": ok}),
             ev("health.failed", 99.8, "health-n3", node="n3", check="shm", detail="64 MiB"),
             ev("health.checked", 99.8, "health-n3", node="n3", ok=False, seconds=0.7,
                checks={"gpu": ok, "shm": {"status": "failed", "detail": "64 MiB"}}),
             ev("node.excluded", 99.85, "supervisor", node="n3", reason="health check failed: shm", faults=0,
                excluded=["n3"]),
             ev("health.checked", 99.9, "health-n2", node="n2", ok=True, seconds=0.4, checks={"gpu": ok}),
             ev("health.checked", fault + 1.5, "health-n2", node="n2", ok=True, seconds=1.0, checks={"gpu": ok})]
    return base + extra


def test_measure_counts_the_health_checks_as_their_own_part():
    events = job_events_with_health_checks()
    plain = gp.measure_from_events(job_events())
    m = gp.measure_from_events(events)
    json.dumps(m, allow_nan=False)
    assert m["faults"] == 1 and len(m["recoveries"]) == 1  # a failed health check is no fault
    assert m["step_time_s"] == pytest.approx(0.5) and m["steps"] == 12
    # the wall time starts with the first pre-flight run (99.1), before 'started' (100)
    assert m["wall_s"] == pytest.approx(plain["wall_s"] + 0.9)
    lost = m["lost_s"]
    assert lost["health_check"] == pytest.approx(0.8 + 1.0)  # 99.1-99.9 and the 1 s during the restart
    (r,) = m["recoveries"]
    assert r["downtime_s"] == pytest.approx(3.0) and r["health_check_s"] == pytest.approx(1.0)
    assert r["restore_s"] == pytest.approx(0.4) and r["restart_s"] == pytest.approx(1.6)
    assert r["restore_s"] + r["restart_s"] + r["health_check_s"] == pytest.approx(r["downtime_s"])
    assert lost["restart"] == pytest.approx(1.6) and lost["restore"] == pytest.approx(0.4)
    assert lost["other"] == pytest.approx(0.1)  # 99.9 to the start at 100
    assert m["useful_s"] + sum(lost.values()) == pytest.approx(m["wall_s"])
    assert plain["lost_s"]["health_check"] == 0.0
    # the projection's restart includes the checks a restart runs
    assert gp.project(m, 64, "0.04%")["restart_s"] == pytest.approx(2.6)
    assert "health checks 1 s" in gp.report_text(gp.advise(64, "0.04%", checkpoint_cost_s=1, step_time_s=1),
                                                 measured=m)


def job_events_hung_and_straggling(stalled_s):
    """job_events where the fault is a hang (the watchdog's fault.detected 1 s after the last
    step event, with ``stalled_s``) and rank 1 was flagged a straggler after step 5 (0.45 s of
    compute a step against the others' 0.35, measured over 2 steps)."""
    out = []
    for e in job_events():
        if e.kind == "fault.detected":
            e = Event(kind=e.kind, job_id=e.job_id, time=e.time, writer=e.writer, seq=e.seq,
                      data={"rank": 1, "node": "n1", "reason": "hang", "stalled_s": stalled_s, "section": None})
        out.append(e)
        if e.kind == "step" and e.data["step"] == 5 and not any(x.kind == "recovery.completed" for x in out):
            out.append(ev("straggler.detected", e.time + 0.01, "agent-n1", rank=1, node="n1", score=1.29,
                          step_s=0.5, median_step_s=0.5, compute_s=0.45, median_compute_s=0.35, wait_s=0.05,
                          window=2, action="report"))
    return out


@pytest.mark.parametrize("stalled, hang, detect", [(0.7, 0.7, 0.3), (5.0, 1.0, 0.0), (0.0, 0.0, 1.0)])
def test_measure_counts_hang_and_straggling_time(stalled, hang, detect):
    """The hang's stall (at most the detection lag: the last step event is 1 s before the report)
    is its own part, the rest of the lag stays detection; the straggler cost 0.1 s on each of its
    2 measured steps and the 4 steps after it (6-9) until the fault: 0.6 s, taken from the
    steps' time (useful), never from another part."""
    plain = gp.measure_from_events(job_events())
    m = gp.measure_from_events(job_events_hung_and_straggling(stalled))
    json.dumps(m, allow_nan=False)
    (r,) = m["recoveries"]
    assert r["hang_s"] == pytest.approx(hang) and r["detect_s"] == pytest.approx(detect)
    lost = m["lost_s"]
    assert lost["hang"] == pytest.approx(hang) and lost["detect"] == pytest.approx(detect)
    assert lost["straggle"] == pytest.approx(0.6)
    assert m["useful_s"] == pytest.approx(plain["useful_s"] - 0.6)
    for k in ("checkpoint", "restart", "restore", "recompute", "other"):
        assert lost[k] == pytest.approx(plain["lost_s"][k], abs=1e-9), k
    assert m["useful_s"] + sum(lost.values()) == pytest.approx(m["wall_s"])
    assert m["lost_fraction"]["straggle"] == pytest.approx(0.6 / m["wall_s"])
    assert plain["lost_s"]["hang"] == 0.0 and plain["lost_s"]["straggle"] == 0.0
    text = gp.report_text(gp.advise(64, "0.04%", checkpoint_cost_s=1, step_time_s=1), measured=m)
    assert "straggle" in text and ("hang" in text) == (hang > 0)


def test_the_notebook_monitor_shows_hang_and_straggling_time(tmp_path):
    """The notebook widget's goodput line (hyperpod_lab.notebook.widgets.goodput_html) names the new parts."""
    from hyperpod_lab.notebook.widgets import JobMonitor
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobRecord, JobStore

    client = Client(JobStore(str(tmp_path / "store")))
    client.store.put(JobRecord(job_id="job-1", name="g", cluster="local", orchestrator="local", native_id="1",
                               job_dir=str(tmp_path / "job"), spec={"args": []}, status="running"))
    mon = JobMonitor("job-1", client=client, start=False)
    assert "measured after the first steps" in mon.goodput.value
    for e in sorted(job_events_hung_and_straggling(0.7), key=lambda e: (e.time, e.writer, e.seq)):
        mon._on_event(e)
    mon._render(force_plot=True)
    html = mon.goodput.value
    m = gp.measure_from_events(job_events_hung_and_straggling(0.7))
    assert f"goodput <b>{m['goodput'] * 100:.1f} %</b>" in html
    assert "data-cause='hang'" in html and "hung before detection" in html
    assert "data-cause='straggle'" in html and "waiting for stragglers" in html
    assert f"data-seconds='{m['lost_s']['straggle']:.6g}'" in html and "data-cause='health_check'" not in html


def test_project_from_measurement():
    m = gp.measure_from_events(job_events())
    p = gp.project(m, 2048, "0.0161%")
    json.dumps(p, allow_nan=False)
    assert [t["name"] for t in p["tiers"]] == ["memory", "persistent"]
    assert p["restart_s"] == pytest.approx(2.6) and p["detect_s"] == pytest.approx(1.0)
    modes = p["modes"]
    # this job restarts in 2.6 s: healing in the default 90 s is worse; in 1 s it is better
    assert 0 < modes["checkpointless"]["goodput"] < modes["checkpoint-restart"]["goodput"] <= 1
    modes = gp.project(m, 2048, "0.0161%", heal_s=1.0)["modes"]
    assert 0 < modes["checkpoint-restart"]["goodput"] < modes["checkpointless"]["goodput"] <= 1
    assert modes["checkpoint-restart"]["goodput"] > gp.project(m, 2048, "0.0161%", restart_s=900)["modes"][
        "checkpoint-restart"]["goodput"]
    with pytest.raises(GoodputInputError, match="no step events"):
        gp.measure_from_events([ev("submitted", 1.0, "client")])


def test_project_does_not_keep_a_node_local_tier_through_a_node_loss():
    """The job's memory tier (every 4 steps) lives in the node's /dev/shm: a projected failure
    (an instance failure) loses it, so the restore comes from the persistent tier (every 8):
    more recomputation than if memory survived."""
    m = gp.measure_from_events(job_events())
    p = gp.project(m, 2048, "0.0161%")
    tiers = {t["name"]: t for t in p["tiers"]}
    assert tiers["memory"]["survives_failure"] == 0.0 and tiers["persistent"]["survives_failure"] == 1.0
    assert p["node_loss_fraction"] == 1.0
    kept = gp.project(m, 2048, "0.0161%", node_loss_fraction=0.0)  # only process crashes: memory survives
    assert {t["name"]: t["survives_failure"] for t in kept["tiers"]} == {"memory": 1.0, "persistent": 1.0}
    lost, ok = p["modes"]["checkpoint-restart"], kept["modes"]["checkpoint-restart"]
    assert lost["lost"]["recompute"] > ok["lost"]["recompute"] and lost["goodput"] < ok["goodput"]
    # the closed form: memory lost -> recompute half the persistent interval (one persistent
    # checkpoint measured: its interval is the job's 12 steps of 0.5 s), stalls included
    per_failure = lost["lost"]["recompute"] * p["mtbf_hours"] * 3600
    assert per_failure == pytest.approx(12 * 0.5 / 2 * (1 + 0.05 / 2 + 0.2 / 6), rel=1e-6)
    per_failure_kept = ok["lost"]["recompute"] * kept["mtbf_hours"] * 3600
    assert per_failure_kept == pytest.approx(4 * 0.5 / 2 * (1 + 0.05 / 2 + 0.2 / 6), rel=1e-6)  # memory's 4
    half = gp.project(m, 2048, "0.0161%", node_loss_fraction=0.5)
    assert lost["goodput"] < half["modes"]["checkpoint-restart"]["goodput"] < ok["goodput"]
    # a peer copy lives on another node: it survives the node, as the persistent tier does
    peer = json.loads(json.dumps(m))
    peer["tiers"] = {"memory": m["tiers"]["memory"], "peer": dict(m["tiers"]["memory"]),
                     "persistent": m["tiers"]["persistent"]}
    assert {t["name"]: t["survives_failure"] for t in gp.project(peer, 2048, "0.0161%")["tiers"]} == \
        {"memory": 0.0, "peer": 1.0, "persistent": 1.0}
    # only node-local checkpoints: nothing to restore a lost node from
    only = json.loads(json.dumps(m))
    only["tiers"] = {"memory": m["tiers"]["memory"]}
    with pytest.raises(GoodputInputError, match="survives the loss of a node"):
        gp.project(only, 2048, "0.0161%")


def test_projection_is_a_band_over_the_failure_rate_and_the_restart_time():
    m = gp.measure_from_events(job_events())
    p = gp.project(m, 2048, "0.0161%")
    json.dumps(p, allow_nan=False)
    b = p["band"]
    assert b["mid"]["failure_rate_per_instance_hour"] == pytest.approx(0.000161)
    assert b["low"]["failure_rate_per_instance_hour"] == pytest.approx(0.000322)  # one value: half to twice
    assert b["high"]["failure_rate_per_instance_hour"] == pytest.approx(0.0000805)
    # one measured restart (2.6 s): half to twice it
    assert (b["high"]["restart_s"], b["mid"]["restart_s"], b["low"]["restart_s"]) == pytest.approx((1.3, 2.6, 5.2))
    for mode in gp.MODEL_MODES:
        g = p["modes"][mode]["goodput_band"]
        assert set(g) == {"low", "mid", "high"} and g["low"] < g["mid"] < g["high"], (mode, g)
        assert g["mid"] == p["modes"][mode]["goodput"]
    # a range: its ends, the geometric mean between them
    r = gp.project(m, 2048, "0.01%:0.04%", restart_s="60:960")["band"]
    assert r["low"]["failure_rate_per_instance_hour"] == pytest.approx(0.0004)
    assert r["mid"]["failure_rate_per_instance_hour"] == pytest.approx(0.0002)
    assert r["high"]["failure_rate_per_instance_hour"] == pytest.approx(0.0001)
    assert (r["high"]["restart_s"], r["mid"]["restart_s"], r["low"]["restart_s"]) == pytest.approx((60, 240, 960))
    assert r["failure_rate_from"].endswith("(range)") and r["restart_from"] == "given range"
    # several measured restarts: fewest to most seconds, the median in the middle
    many = json.loads(json.dumps(m))
    many["recoveries"] = [dict(m["recoveries"][0], restart_s=x, health_check_s=0.0) for x in (2.0, 10.0, 4.0)]
    mb = gp.project(many, 2048, "0.0161%")["band"]
    assert (mb["high"]["restart_s"], mb["mid"]["restart_s"], mb["low"]["restart_s"]) == (2.0, 4.0, 10.0)
    assert mb["restart_from"].startswith("measured: 3 restarts")
    with pytest.raises(GoodputInputError, match="backwards"):
        gp.project(m, 2048, "0.04%:0.01%")
    # the advice carries the band too
    a = gp.advise(512, "0.04%", 30, 2.0)
    for mode in gp.MODEL_MODES:
        g = a["modes"][mode]["goodput_band"]
        assert g["low"] < g["mid"] == a["modes"][mode]["goodput"] < g["high"]
    assert a["band"]["low"]["restart_s"] == 1800 and a["band"]["high"]["restart_s"] == 450


@pytest.mark.parametrize("rate, warned", [
    ("0.3", True), (0.3, True), ("0.00068", True), ("0.0001:0.004", True),
    ("0.3%", False), ("0.04%", False), (0.0004, False), ("0.00067", False), ("0.01%:0.06%", False),
])
def test_an_implausible_bare_rate_warns_and_names_the_units(rate, warned):
    w = gp.band.rate_warning(rate)
    assert (w is not None) == warned, w
    a = gp.advise(512, rate, 30, 2.0)
    assert bool(a["warnings"]) == warned
    if warned:
        assert "0.067 %" in w and "docs/goodput.md" in w and "--failure-rate-per-day" in w and "%'" in w


def test_a_per_day_rate_is_explicit():
    # Llama 3: 7.76 interruptions a day on 2,048 instances is the paper's 0.0158 % per instance-hour
    rows = {r["key"]: r for r in gp.public_figures()}
    assert gp.band.rate_from_per_day(7.76, 2048) == pytest.approx(7.76 / 24 / 2048)
    assert gp.band.rate_from_per_day(7.76, 2048) == pytest.approx(rows["llama3_rate"]["value"]["rate_paper"], rel=0.01)
    a = gp.advise(2048, None, 30, 2.0, failure_rate_per_day=7.76)
    assert a["failure_rate_per_instance_hour"] == pytest.approx(7.76 / 24 / 2048) and not a["warnings"]
    assert a["band"]["failure_rate_from"].startswith("7.76 failures a day on 2048 instances")
    with pytest.raises(GoodputInputError, match="one of the two"):
        gp.advise(2048, None, 30, 2.0)
    with pytest.raises(GoodputInputError, match="one of the two"):
        gp.advise(2048, "0.04%", 30, 2.0, failure_rate_per_day=7.76)
    with pytest.raises(GoodputInputError, match="failures a day"):
        gp.advise(2048, None, 30, 2.0, failure_rate_per_day="often")


def checkpointless_events(downtime_written):
    """0.5 s steps from t=40; group 1 killed after step 20 (t=50.5); its agent detects it at
    50.7, the survivors' leader at 50.9 (written at the first commit after the loss, 51.9, with
    recovery.completed); steps 21-24 follow, as in job_events."""
    ev.seq = {}
    out = [ev("started", 40.0, world_size=1)]
    out += [ev("step", 40.5 + s * 0.5, step=s, loss=1.0) for s in range(21)]
    out += [ev("fault.detected", 50.7, "agent-n1", rank=1, signal="SIGKILL", replica_group=1),
            ev("fault.detected", 51.9, rank=[1], replica_group=1, detected_by=0, detection_s=0.4, detected_at=50.9),
            ev("recovery.completed", 51.9, mode="checkpointless", restored_step=None, restored_from="none",
               resumed_step=21, downtime_s=downtime_written, replicas=2, lost_replica_groups=[1], restart_count=0)]
    out += [ev("step", 51.9 + s * 0.5, step=21 + s, loss=1.0) for s in range(4)]
    out.append(ev("finished", 53.9, status="succeeded", steps=25))
    return out


# written: the fold's meaning (from the first detection), and the old checkpointless one (from the
# last committed step: the detection lag again, which the measurement used to add to detect_s)
@pytest.mark.parametrize("written", [1.2, 1.4])
def test_measurement_counts_detection_once(written):
    m = gp.measure_from_events(checkpointless_events(written))
    assert m["faults"] == 1 and m["step_time_s"] == pytest.approx(0.5)
    (r,) = m["recoveries"]
    assert r["downtime_s"] == pytest.approx(1.2)  # first detection (50.7) to the first step after (51.9)
    assert r["detect_s"] == pytest.approx(0.2) and r["restore_s"] == 0.0 and r["recomputed_steps"] == 0
    # from the last step before the fault to the first after it, each second counted once
    assert r["detect_s"] + r["restart_s"] + r["restore_s"] == pytest.approx(51.9 - 50.5)
    lost = m["lost_s"]
    assert lost["detect"] + lost["restart"] + lost["restore"] == pytest.approx(1.4)
    assert lost["other"] == pytest.approx(0.0, abs=1e-9)
    assert m["useful_s"] + sum(lost.values()) == pytest.approx(m["wall_s"])


@st.composite
def jobs(draw):
    """Random jobs: runs of steps, checkpoints of any cost, faults reported by one or two agents
    at any delay, restores of any length (even longer than the downtime), any restored step;
    hangs (a watchdog's fault.detected {reason: hang} whose stalled_s may exceed the time since
    the last step) and stragglers flagged at any step (any excess, any window, even longer than
    the job, ranks flagged twice)."""
    seq: dict = {}

    def e(kind, t, writer="rank-0", **data):
        seq[writer] = seq.get(writer, -1) + 1
        return Event(kind=kind, job_id="j", time=t, writer=writer, seq=seq[writer], data=data)

    t, step, out = 0.0, 0, [e("started", 0.0)]
    if draw(st.booleans()):  # pre-flight health checks before the start, of any length
        for n in range(draw(st.integers(1, 3))):
            at = -draw(st.floats(0.0, 3.0))
            out.append(e("health.checked", at, f"health-n{n}", node=f"n{n}", ok=n != 1,
                         seconds=draw(st.floats(0.0, 10.0)), checks={}))
            if n == 1:
                out.append(e("health.failed", at, f"health-n{n}", node="n1", check="shm", detail="small"))
                out.append(e("node.excluded", at + 0.01, "supervisor", node="n1", reason="health check failed",
                             faults=0, excluded=["n1"]))
    for i in range(draw(st.integers(0, 3)) + 1):
        dt = draw(st.floats(0.01, 2.0))
        for _ in range(draw(st.integers(1, 8))):
            t += dt
            out.append(e("step", t, step=step, loss=1.0))
            if draw(st.integers(0, 5)) == 0:  # a straggler flagged after this step
                median = draw(st.floats(0.01, 2.0))
                split = {} if draw(st.booleans()) else {  # with the compute split, or step times only
                    "compute_s": median / 2 + draw(st.floats(-0.5, 3.0)), "median_compute_s": median / 2}
                out.append(e("straggler.detected", t + draw(st.floats(0.0, 0.5)), "agent-n1",
                             rank=draw(st.integers(0, 2)), node="n1", score=2.0,
                             step_s=median + draw(st.floats(-0.5, 3.0)), median_step_s=median,
                             window=draw(st.integers(0, 40)), action="report", **split))
            if draw(st.booleans()):
                blocked = draw(st.floats(0.0, 3.0))
                out.append(e("checkpoint.saved", t + blocked, tier=draw(st.sampled_from(["memory", "persistent"])),
                             step=step, blocked_s=blocked, total_s=blocked))
                t += blocked
            step += 1
        if draw(st.booleans()):
            t += draw(st.floats(0.0, 5.0))
            if draw(st.booleans()):  # a hang: the watchdog reports how long the rank made no progress
                out.append(e("fault.detected", t, "agent-n1", rank=1, reason="hang",
                             stalled_s=draw(st.floats(0.0, 60.0)), section=None))
            else:
                out.append(e("fault.detected", t, "agent-n1", rank=1))
            if draw(st.booleans()):
                out.append(e("fault.detected", t + draw(st.floats(0.0, 3.0)), "agent-n0", rank=0))
            if draw(st.booleans()):
                out.append(e("fault.detected", t + draw(st.floats(0.0, 30.0)), "supervisor", reason="node down",
                             node="n1", rank=[1], slurm_state="DOWN"))
            if draw(st.booleans()):  # a requeue checks the nodes again, at any time (even past the recovery)
                out.append(e("health.checked", t + draw(st.floats(0.0, 25.0)), "health-n2", node="n2",
                             ok=True, seconds=draw(st.floats(0.0, 30.0)), checks={}))
            down = draw(st.floats(0.0, 20.0))
            out.append(e("checkpoint.restored", t + draw(st.floats(0.0, 25.0)), tier="persistent", step=0,
                         seconds=draw(st.floats(0.0, 30.0))))
            t += down
            rstep = draw(st.none() | st.integers(0, 40))
            out.append(e("recovery.completed", t, restored_step=rstep, restart_count=i + 1,
                         downtime_s=draw(st.floats(0.0, 30.0)), restored_from="persistent"))
            step = 0 if rstep is None else rstep + 1
    t += 0.5
    out.append(e("step", t, step=step, loss=1.0))
    if draw(st.booleans()):
        out.append(e("finished", t + draw(st.floats(0.0, 2.0)), status="succeeded", steps=step + 1))
    return out


@PROPS
@given(events=jobs())
def test_lost_time_adds_up_to_the_wall_time_with_no_negative_part(events):
    m = gp.measure_from_events(events)
    lost = m["lost_s"]
    parts = [v for v in lost.values() if v is not None]
    assert all(v >= 0.0 for v in parts), lost
    assert m["wall_s"] >= 0.0
    if m["useful_s"] is None:
        assert lost["other"] is None and sum(parts) <= m["wall_s"] + 1e-9
    else:
        assert m["useful_s"] >= 0.0 and 0.0 <= (m["goodput"] or 0.0) <= 1.0
        assert m["useful_s"] + sum(parts) == pytest.approx(m["wall_s"], abs=1e-9)
    for r in m["recoveries"]:
        assert min(r["downtime_s"], r["restore_s"], r["restart_s"], r["health_check_s"], r["hang_s"]) >= 0.0
        assert r["restore_s"] + r["restart_s"] + r["health_check_s"] == pytest.approx(r["downtime_s"])
        assert r["detect_s"] is None or r["detect_s"] >= 0.0
    assert set(lost) == {"health_check", "checkpoint", "hang", "detect", "restart", "restore", "recompute",
                         "straggle", "other"}


def test_advise_is_json_and_recommends_daly():
    a = gp.advise(512, "0.04%", 30, 2.0, work_gpu_hours=1e6)
    json.dumps(a, allow_nan=False)
    cr = a["modes"]["checkpoint-restart"]
    assert a["mtbf_hours"] == pytest.approx(4.8828, abs=1e-3)
    assert cr["interval_steps"] == round(gp.daly_interval_s(30, a["mtbf_s"]) / 2.0)
    assert a["modes"]["checkpointless"]["goodput"] > cr["goodput"]
    assert cr["training_days"] == pytest.approx(1e6 / 4096 / cr["goodput"] / 24)
    assert a["modes"]["checkpointless"]["interval_s"] == 86400  # q = 1e-5: capped at a day
    half = gp.advise(512, "0.04%", 30, 2.0, fallback_probability=0.5)["modes"]["checkpointless"]
    assert half["interval_s"] == pytest.approx(gp.daly_interval_s(30, 2 * a["mtbf_s"]), abs=1.0)


# ---- the command ----------------------------------------------------------------------------
ARGS = ["goodput", "--instances", "512", "--failure-rate", "0.04%", "--checkpoint-cost", "30", "--step-time", "2"]


def test_cli_table_json_and_plot(tmp_path):
    out = io.StringIO()
    assert run(ARGS + ["--work-gpu-hours", "1e6"], out=out) is None
    text = out.getvalue()
    assert "MTBF 4.88 h" in text and "checkpoint-restart" in text and "checkpointless" in text
    assert "TRAINING DAYS" in text and "88.9 %" in text
    out = io.StringIO()
    run(ARGS + ["--json"], out=out)
    d = json.loads(out.getvalue())
    assert d["advice"] == json.loads(json.dumps(gp.advise(512, "0.04%", 30, 2.0)))
    png = tmp_path / "g.png"
    run(ARGS + ["--plot", str(png)], out=io.StringIO())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000


@pytest.mark.parametrize("argv, words", [
    (["--failure-rate", "4"], "fractions per instance-hour"),
    (["--instances", "0"], "at least 1 instance"),
    (["--checkpoint-cost", "-5"], "seconds"),
])
def test_cli_refuses_bad_input(argv, words):
    args = list(ARGS)
    i = args.index(argv[0])
    args[i + 1] = argv[1]
    with pytest.raises(GoodputInputError, match=words.replace("(", r"\(")):
        run(args, out=io.StringIO())


def test_cli_band_warning_and_per_day(capsys):
    out = io.StringIO()
    run(ARGS, out=out)
    text = out.getvalue()
    assert "GOODPUT (LOW-HIGH)" in text and "88.9 % (70.8-94.3 %)" in text
    assert "band: low at 0.08 % per instance-hour and 30 min restarts, high at 0.02 % and 7.5 min" in text
    assert capsys.readouterr().err == ""
    args = list(ARGS)
    args[args.index("0.04%")] = "0.3"
    out = io.StringIO()
    run(args + ["--json"], out=out)
    err = capsys.readouterr().err
    assert err.startswith("warning: --failure-rate 0.3: ") and "did you mean '0.3%'" in err, err
    assert json.loads(out.getvalue())["advice"]["warnings"]
    out = io.StringIO()
    per_day = ["goodput", "--instances", "2048", "--failure-rate-per-day", "7.76", "--checkpoint-cost", "30",
               "--step-time", "2", "--restart-s", "60:900", "--json"]
    run(per_day, out=out)
    d = json.loads(out.getvalue())["advice"]
    assert d["failure_rate_per_instance_hour"] == pytest.approx(7.76 / 24 / 2048)
    assert d["band"]["low"]["restart_s"] == 900 and d["band"]["high"]["restart_s"] == 60
    with pytest.raises(SpecError, match="not allowed with argument --failure-rate-per-day"):  # one or the other
        run(per_day + ["--failure-rate", "0.04%"], out=io.StringIO())


def test_cli_needs_costs_or_a_job():
    with pytest.raises(SpecError, match="--checkpoint-cost SECONDS and --step-time SECONDS"):
        run(["goodput", "--instances", "8", "--failure-rate", "0.04%"], out=io.StringIO())


def test_cli_measures_a_job(client, tmp_path):
    """A job record in a real JobStore whose events were written by the real EventWriter."""
    from hyperpod_lab.submit.jobs import JobRecord

    job_dir = tmp_path / "job"
    writers, now = {}, [0.0]
    for e in job_events():
        now[0] = e.time
        w = writers.setdefault(e.writer, EventWriter(str(job_dir), e.writer, "job-1", clock=lambda: now[0]))
        w.emit(e.kind, **e.data)
    client.store.put(JobRecord(job_id="job-1", name="job", cluster="local", orchestrator="local", native_id="1",
                               job_dir=str(job_dir), spec={}, status="succeeded"))
    out = io.StringIO()
    run(["goodput", "--instances", "2048", "--failure-rate", "0.0161%", "--job", "job-1"], out=out, client=client)
    text = out.getvalue()
    assert "measured (job-1): 12 steps" in text and "step 0.5 s" in text
    assert "tier memory: 2 checkpoints, every 4 steps" in text and "recovery from memory: downtime 3 s" in text
    assert "projected with the job's measured costs at 2048 instances (mid, low-high): checkpoint-restart " in text
    assert "tiers after a node loss: memory lost, persistent kept" in text
    out = io.StringIO()
    run(["goodput", "--instances", "2048", "--failure-rate", "0.0161%", "--job", "job-1", "--json"], out=out,
        client=client)
    d = json.loads(out.getvalue())
    assert d["measured"]["step_time_s"] == pytest.approx(0.5) and d["advice"]["step_time_s"] == pytest.approx(0.5)
    assert d["advice"]["checkpoint_cost_s"] == pytest.approx(0.2)  # the slowest tier's
    assert set(d["projection"]["modes"]) == set(gp.MODEL_MODES)
    for mode in gp.MODEL_MODES:
        assert set(d["projection"]["modes"][mode]["goodput_band"]) == {"low", "mid", "high"}


def test_magic_shows_the_plot_inline(ipython):
    from IPython.utils.capture import capture_output

    ip = ipython
    with capture_output() as cap:
        ip.run_line_magic("hyperpod", " ".join(ARGS))
    assert "checkpointless" in cap.stdout
    images = [o.data["image/png"] for o in cap.outputs if "image/png" in o.data]
    assert len(images) == 1
    with capture_output() as cap:
        ip.run_line_magic("hyperpod", "goodput --instances 512 --failure-rate 4 --checkpoint-cost 30 --step-time 2")
    assert "fractions per instance-hour" in cap.stderr


def test_docstring_examples_hold():
    import doctest
    import importlib
    import pkgutil

    attempted = 0
    for info in pkgutil.iter_modules(gp.__path__):  # the package's modules hold the docstrings
        if info.name == "__main__":
            continue
        result = doctest.testmod(importlib.import_module(f"hyperpod_lab.goodput.{info.name}"))
        assert result.failed == 0, info.name
        attempted += result.attempted
    assert attempted >= 1


def test_module_imports_neither_torch_nor_jupyter_nor_matplotlib():
    code = ("import sys, hyperpod_lab.goodput; "
            "print(sorted(m for m in ('torch', 'IPython', 'matplotlib', 'jupyter_server') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_advice_for_instance_counts_that_two_replicas_do_not_split():
    """The submit form asks for advice at whatever node count is typed: 1 or 3 nodes raised
    "do not split into groups of 2 replicas" for the checkpointless projection. Without given
    replicas the projection now uses the fewest replica groups that split the instances (one per
    node for 3, as ``--recovery checkpointless`` runs them) and says so; given ones still must split."""
    advise = gp.advise
    one = advise(1, "0.04%", 10, 1.0)
    assert one["modes"]["checkpointless"]["fallback_probability"] == 1.0  # nothing to heal from
    assert any("1 instance" in w for w in one["warnings"])
    three = advise(3, "0.04%", 10, 1.0)
    assert any("projected with 3" in w for w in three["warnings"])
    assert three["modes"]["checkpointless"]["fallback_probability"] < advise(4, "0.04%", 10, 1.0)[
        "modes"]["checkpointless"]["fallback_probability"]  # 3 copies are lost together less often than 2
    assert replicas_for(9)[0] == 3 and replicas_for(4) == (2, None)
    assert advise(4, "0.04%", 10, 1.0)["warnings"] == []
    with pytest.raises(GoodputInputError, match="groups of 2 replicas"):
        advise(3, "0.04%", 10, 1.0, replicas=2)
