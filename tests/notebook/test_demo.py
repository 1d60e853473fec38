"""The flagship demo (issue 18 item 7): ``examples/flagship.ipynb`` run headless on the real dev
cluster by ``hyperpod_lab.cli.demo.run_demo`` (what ``bash scripts/demo.sh`` runs after the
quickstart): the same script, steps, nodes and SIGKILL of rank 1 under checkpoint-restart and
checkpointless recovery, then the checkpointless job loses a node and gets one back.

The comparison's numbers are recomputed here from the raw events, independently of the
library's fold: downtime (first ``fault.detected`` detection to ``recovery.completed``), steps
lost (last ``step`` before the detection + 1 - the step resumed), storage reads (``read_bytes``
of the ``persistent`` restores). Plus the verdict's failure reasons, without a cluster.
"""

import os

from hyperpod_lab.cli import demo
from hyperpod_lab.submit.client import Client

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _detected(e) -> float:
    return e.data.get("detected_at") or e.time


def _first_incident(events):
    """(detection time, the recovery.completed that ended it, last step before it) from raw events."""
    faults = [e for e in events if e.kind == "fault.detected"]
    t0 = min(_detected(e) for e in faults)
    rec = min((e for e in events if e.kind == "recovery.completed" and e.time >= t0), key=lambda e: e.time)
    last = max(e.data["step"] for e in events if e.kind == "step" and e.time <= t0)
    return t0, rec, last


def test_flagship_compares_the_two_modes_and_scales_from_the_events(dev_cluster):
    client = Client()
    before = {r.job_id for r in client.store.list()}
    lines: list[str] = []
    code = demo.run_demo(os.path.join(REPO, "examples", "flagship.ipynb"), lines.append, timeout_s=600)
    out = "\n".join(lines)
    assert code == 0, out[-6000:]
    new = [r for r in client.store.list() if r.job_id not in before]
    jobs = demo._flagship_jobs(new)
    assert set(jobs) == {"restart", "checkpointless"}, [r.name for r in new]
    restart, cl = jobs["restart"].job_id, jobs["checkpointless"].job_id
    rows = {r["mode"]: r for r in demo.compare_recoveries(client, restart, cl)}

    # checkpoint-restart: every rank restarted and read the step-9 checkpoint from shared storage
    ev = client.event_reader(restart).poll()
    t0, rec, last = _first_incident(ev)
    r = rows["restart"]
    assert abs(r["downtime_s"] - (rec.time - t0)) < 1e-6, (r, rec.time - t0)
    assert rec.data["restored_step"] == demo.CHECKPOINT_EVERY - 1, rec.data  # the kill lands after step 22
    assert r["steps_lost"] == last + 1 - (rec.data["restored_step"] + 1) >= demo.FAULT_STEP + 1 - demo.CHECKPOINT_EVERY
    assert r["fault_step"] == last, (r, last)
    restored = [e for e in ev if e.kind == "checkpoint.restored"]
    assert [e.data["tier"] for e in restored] == ["persistent"], restored
    assert r["storage_read_bytes"] == restored[0].data["read_bytes"] >= restored[0].data["bytes"] > 0, restored
    assert r["restarts"] == len([e for e in ev if e.kind == "recovery.started"]) == 2  # both nodes' workers

    # checkpointless: the survivor went on, rank 1 healed from its memory, nothing read from storage
    ev = client.event_reader(cl).poll()
    t0, rec, last = _first_incident(ev)
    c = rows["checkpointless"]
    assert rec.data["mode"] == "checkpointless"
    assert abs(c["downtime_s"] - (rec.time - t0)) < 1e-6, (c, rec.time - t0)
    assert c["steps_lost"] == max(0, last + 1 - rec.data["resumed_step"]) <= 1, (c, last, rec.data)
    assert c["fault_step"] == last >= demo.FAULT_STEP, (c, last)
    assert c["storage_read_bytes"] == 0 and c["restored_from"] == ["replica"], c
    assert not [e for e in ev if e.kind == "checkpoint.restored" and e.data["tier"] != "replica"]
    assert c["restarts"] == 1  # only the killed rank's worker
    assert c["downtime_s"] < r["downtime_s"]

    # elastic: the node loss (2 -> 1, accumulation doubled, global batch kept) and the join (1 -> 2)
    scaled = [e.data for e in ev if e.kind == "elastic.scaled"]
    down = [d for d in scaled if (d["old_replicas"], d["new_replicas"]) == (2, 1)]
    up = [d for d in scaled if (d["old_replicas"], d["new_replicas"]) == (1, 2)]
    assert len(down) >= 2 and len(up) >= 2, scaled  # the kill's and the node loss's
    assert all(d["accumulation_steps"] == 2 * d["old_accumulation_steps"] and d["effective_batch"] ==
               d["global_batch_size"] for d in down), down
    assert [e for e in ev if e.kind == "checkpoint.restored" and e.data.get("replica_group") == 2], \
        "the node added by scale did not heal from a peer"
    assert [e for e in ev if e.kind == "finished"][-1].data["steps"] == demo.FLAGSHIP_STEPS

    # what the CLI printed: the table and the verdict, the same text the notebook prints
    ok, text = demo.flagship_report(client, restart, cl, statuses={restart: "completed", cl: "completed"})
    assert ok and text in out, out[-4000:]
    header = text.splitlines()[1]
    assert [h.strip() for h in header.split("|")][:5] == ["recovery mode", "downtime (s)", "steps lost (redone)",
                                                          "storage reads", "restarts"], header
    assert "replica groups 2 -> 1" in text and "replica groups 1 -> 2" in text


def _row(mode, downtime, reads, lost=0):
    return {"mode": mode, "label": demo.MODE_LABELS[mode], "downtime_s": downtime, "steps_lost": lost,
            "storage_read_bytes": reads, "restored_from": [], "restored_bytes": 0, "restarts": 1, "fault_step": 22}


def test_verdict_fails_with_the_reason():
    good = [_row("restart", 5.0, 1000, 6), _row("checkpointless", 0.5, 0)]
    scaled = [{"old_replicas": 2, "new_replicas": 1}, {"old_replicas": 1, "new_replicas": 2}]
    assert demo.flagship_verdict(good, {"a": "completed"}, scaled)[0]
    ok, why = demo.flagship_verdict(good, {"a": "completed", "b": "failed"})
    assert not ok and "b is failed" in why
    ok, why = demo.flagship_verdict([_row("restart", 5.0, 1000), _row("checkpointless", 0.5, 4096)])
    assert not ok and "read 4.0 KiB from storage" in why
    ok, why = demo.flagship_verdict([_row("restart", 0.4, 1000), _row("checkpointless", 0.5, 0)])
    assert not ok and "not lower" in why
    ok, why = demo.flagship_verdict([_row("restart", 0.4, 1000), _row("checkpointless", 0.5, None)])
    assert not ok and "unknown" in why
    ok, why = demo.flagship_verdict(good, None, [{"old_replicas": 1, "new_replicas": 2}])
    assert not ok and "2 -> 1 -> 2" in why
    assert "steps lost (redone)" in demo.format_comparison(good)
