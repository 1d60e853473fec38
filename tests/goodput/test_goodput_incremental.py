"""The incremental goodput fold (``hyperpod_lab.goodput.GoodputMeter``, issue 13, finding 3):
fed one event at a time, or as a reader delivers them in polls, it gives what the batch
``measure_from_events`` gives; its state survives a JSON round trip mid-stream; and its state
does not grow with the number of steps."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_goodput import checkpointless_events, ev, job_events, jobs

from hyperpod_lab import goodput as gp
from hyperpod_lab.errors import GoodputInputError
from hyperpod_lab.events import Event
from hyperpod_lab.fold.facts import JobFacts

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _key(e):
    return (e.time, e.writer, e.seq)


def assert_same(a, b, path="m"):
    """Equal dicts/lists, floats within tolerance."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, a, b)
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool) and isinstance(b, (int, float)):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-9), (path, a, b)
    else:
        assert a == b, (path, a, b)


def polls(events, rng: random.Random, max_lines: int):
    """The events as an EventReader delivers them: one file per writer, each read in order; each
    poll takes 0..max_lines new lines of every file, sorted by time (writer, seq) within it."""
    files: dict[str, list] = {}
    for e in sorted(events, key=_key):
        files.setdefault(e.writer, []).append(e)
    pos = {w: 0 for w in files}
    while any(pos[w] < len(f) for w, f in files.items()):
        got = []
        for w, f in files.items():
            n = rng.randint(0, max_lines)
            got += f[pos[w]:pos[w] + n]
            pos[w] += n
        yield sorted(got, key=_key)


def measured_or_error(fn):
    try:
        return fn()
    except GoodputInputError as e:
        return ("error", str(e))


def by_meter(events, **kw):
    return gp.GoodputMeter(**kw).update_all(sorted(events, key=_key)).result()


# ---- the same as the batch function ---------------------------------------------------------
@pytest.mark.parametrize("make", [job_events, lambda: checkpointless_events(1.2), lambda: checkpointless_events(1.4)])
def test_one_by_one_gives_the_batch_result_on_the_fixed_jobs(make):
    events = make()
    assert_same(gp.measure_from_events(events), by_meter(events))
    assert_same(gp.measure_from_events(events), by_meter(events, window=2, tier_window=2))


@PROPS
@given(events=jobs(), window=st.sampled_from([64, 256, None]))
def test_one_by_one_gives_the_batch_result(events, window):
    batch = measured_or_error(lambda: gp.measure_from_events(events))
    meter = gp.GoodputMeter(window=window)
    results = []
    for e in sorted(events, key=_key):
        meter.update(e)
        results.append(measured_or_error(meter.result))
    assert_same(batch, results[-1])
    # every prefix too: the meter answers at any time what the batch function says of the prefix
    evs = sorted(events, key=_key)
    for i in range(0, len(evs), max(1, len(evs) // 5)):
        assert_same(measured_or_error(lambda: gp.measure_from_events(evs[:i + 1])), results[i])


@PROPS
@given(events=jobs(), window=st.integers(1, 8))
def test_a_tiny_window_still_adds_up(events, window):
    """With a window shorter than how late an item comes (here: a checkpoint re-saved at a step
    saved before the restart merges with the first save, whose stall began runs ago), the
    step time may differ from the batch one; the facts do not, and the breakdown still adds up."""
    batch = measured_or_error(lambda: gp.measure_from_events(events))
    m = measured_or_error(gp.GoodputMeter(window=window).update_all(sorted(events, key=_key)).result)
    if not isinstance(batch, dict):
        assert m == batch
        return
    for k in ("wall_s", "steps", "faults", "job_id"):
        assert_same(batch[k], m[k], k)
    for name, t in batch["tiers"].items():
        assert_same({k: v for k, v in t.items() if k != "restore_s"},
                    {k: v for k, v in m["tiers"][name].items() if k != "restore_s"})
    parts = [v for v in m["lost_s"].values() if v is not None]
    assert all(v >= 0.0 for v in parts)
    if m["useful_s"] is not None:
        assert m["useful_s"] + sum(parts) == pytest.approx(m["wall_s"], abs=1e-9)


@PROPS
@given(events=jobs(), seed=st.integers(0, 2**32 - 1), max_lines=st.integers(1, 6))
def test_poll_sized_chunks_give_the_batch_result(events, seed, max_lines):
    """Delivered as a reader does, files read at different paces (another writer's events come
    a poll later than events of a later time): the same result while nothing is more than the
    window late (here: always, the jobs are short)."""
    meter = gp.GoodputMeter()
    delivered = []
    for chunk in polls(events, random.Random(seed), max_lines):
        for e in chunk:
            meter.update(e)
        delivered += chunk
    # the facts fold takes events as given; the meter's own part must place the late ones
    # exactly: compare against the batch measurement with facts folded in the same order
    batch = measured_or_error(lambda: gp.measure_from_events(events))
    got = measured_or_error(meter.result)
    if isinstance(batch, dict):
        same_facts = _facts_of(delivered) == _facts_of(sorted(events, key=_key))
        if same_facts:
            assert_same(batch, got)
        else:  # the step time and the tiers are the meter's own: exact whatever the facts
            for k in ("step_time_s", "tiers"):
                if k == "tiers":
                    for name, t in batch["tiers"].items():
                        for f in ("checkpoints", "interval_steps", "blocked_s", "blocked_total_s"):
                            assert_same(t[f], got["tiers"][name][f], f"tiers.{name}.{f}")
                else:
                    assert_same(batch[k], got[k], k)
    else:
        assert_same(batch, got)


def _facts_of(events):
    f = JobFacts()
    for e in events:
        f.update(e)
    d = f.to_dict()
    d.pop("last_event")
    return d


def test_late_events_within_the_window_are_placed_exactly():
    """Checkpoints reported by a slow rank, read after every other event, still merge with the
    fast rank's (the slowest rank's blocked_s) and come off the step time of the pair their
    stall began in."""
    events = job_events()
    late = [e for e in events if e.writer == "rank-1" and e.kind == "checkpoint.saved"]
    for e in late:  # the slow rank blocked longer: its report decides
        e.data["blocked_s"] = 0.05
        e.data["total_s"] = 0.06
    rest = [e for e in events if e not in late]
    meter = gp.GoodputMeter().update_all(sorted(rest, key=_key)).update_all(sorted(late, key=_key))
    assert_same(gp.measure_from_events(events), meter.result())
    # a break read late (a restart between two step events) still splits the run
    ev.seq = {}
    steps = [ev("step", t, step=s) for s, t in enumerate([1.0, 2.0, 3.0, 13.0, 14.0])]  # 10 s: a restart
    gap = ev("started", 3.5, "agent-n9")
    meter = gp.GoodputMeter().update_all(steps).update_all([gap])
    assert meter.result()["step_time_s"] == pytest.approx(1.0)
    assert_same(gp.measure_from_events(steps + [gap]), meter.result())


def test_errors_until_there_is_something_to_measure():
    meter = gp.GoodputMeter()
    with pytest.raises(GoodputInputError, match="no events"):
        meter.result()
    meter.update(ev("submitted", 1.0, "client"))
    with pytest.raises(GoodputInputError, match="no step events"):
        meter.result()
    meter.update(ev("step", 2.0, step=0))
    assert meter.result()["steps"] == 1 and meter.result()["step_time_s"] is None


# ---- saved state ----------------------------------------------------------------------------
@PROPS
@given(events=jobs(), cut=st.floats(0.0, 1.0), window=st.sampled_from([64, 256]))
def test_saved_state_continues_the_fold(events, cut, window):
    evs = sorted(events, key=_key)
    n = int(len(evs) * cut)
    first = gp.GoodputMeter(window=window).update_all(evs[:n])
    saved = json.loads(json.dumps(first.to_dict(), allow_nan=False))
    resumed = gp.GoodputMeter(saved, window=window).update_all(evs[n:])
    # or stored beside the facts (as the server does): facts passed back in
    facts = JobFacts(json.loads(json.dumps(first.facts.to_dict())))
    beside = gp.GoodputMeter(json.loads(json.dumps(first.to_dict(facts=False))), facts, window=window)
    beside.update_all(evs[n:])
    whole = measured_or_error(lambda: gp.measure_from_events(events))
    assert_same(whole, measured_or_error(resumed.result))
    assert_same(whole, measured_or_error(beside.result))


# ---- bounded ---------------------------------------------------------------------------------
def long_job(steps: int, every: int = 10, fault_every: int = 20_000):
    """``steps`` 0.1 s steps; memory and persistent checkpoints every ``every`` steps reported
    by two ranks (the slower one a poll late); a fault, restart and restore from memory every
    ``fault_every`` steps."""
    seq: dict = {}

    def e(kind, t, writer="rank-0", **data):
        seq[writer] = seq.get(writer, -1) + 1
        return Event(kind=kind, job_id="long", time=t, writer=writer, seq=seq[writer], data=data)

    t, out = 0.0, [e("started", 0.0)]
    for s in range(steps):
        t += 0.1
        out.append(e("step", round(t, 6), step=s, loss=1.0))
        if (s + 1) % every == 0:
            for tier, cost in (("memory", 0.01), ("persistent", 0.05)):
                for r in (0, 1):
                    out.append(e("checkpoint.saved", round(t + cost, 6), f"rank-{r}", tier=tier, step=s,
                                 blocked_s=cost * (1 - r / 10), total_s=cost))
                t += cost
        if (s + 1) % fault_every == 0:
            out.append(e("fault.detected", round(t + 0.5, 6), "agent-n1", rank=1))
            out.append(e("checkpoint.restored", round(t + 2.0, 6), tier="memory", step=s, seconds=0.5))
            t += 3.0
            out.append(e("recovery.completed", round(t, 6), restored_step=s, restored_from="memory",
                         restart_count=s // fault_every))
    return out


def test_state_does_not_grow_with_the_number_of_steps():
    events = long_job(100_000)
    meter = gp.GoodputMeter()
    sizes = {}
    for i, e in enumerate(events):
        meter.update(e)
        if i + 1 in (2_000, len(events) // 2, len(events)):
            sizes[i + 1] = len(json.dumps(meter.to_dict()))
    small, mid, big = sizes.values()
    # a few tens of KiB whatever the length: the window, 64 steps per tier, one dict per incident
    assert big < 64 * 1024, sizes
    assert big - small < 8 * 1024, sizes  # the growth is the incidents (5 here), not the steps
    assert len(meter._clock.items) <= gp.measure.DEFAULT_WINDOW
    assert all(len(t.recent) <= gp.measure.DEFAULT_TIER_WINDOW for t in meter._tiers.values())
    m, batch = meter.result(), gp.measure_from_events(events)
    assert_same(batch, m)
    assert m["steps"] == 100_000 and m["faults"] == 5 and m["tiers"]["memory"]["checkpoints"] == 10_000
    assert m["step_time_s"] == pytest.approx(0.1, rel=1e-5) and m["tiers"]["persistent"]["interval_steps"] == 10


def test_tier_count_is_capped():
    meter = gp.GoodputMeter()
    meter.update(ev("step", 1.0, step=0))
    for i in range(gp.measure.MAX_TIERS + 10):
        meter.update(ev("checkpoint.saved", 2.0 + i, tier=f"t{i}", step=0, blocked_s=0.1))
    assert len(meter.result()["tiers"]) == gp.measure.MAX_TIERS
