"""A node's launch agent reports a failed worker group as one ``fault.detected``, not one a rank.

At 8 ranks a node, one rank's failure made torchrun SIGTERM the 7 others and the agent wrote 8
events (2,048 when every node's ranks stop; issue 27). Now the root cause's event names the
stopped ranks (``stopped_ranks``), and the fold, the timeline, log triage and the CLI still
show each stopped rank as a consequence. A real launch of ``hyperpod_lab.node.launch``
(torchrun's agent) with 8 worker processes on this host; one worker SIGKILLs itself, as the
OOM killer or ``inject-fault`` would.
"""

import json
import os

from agents import launch_standalone

from hyperpod_lab.cli.render import event_text
from hyperpod_lab.events import Event
from hyperpod_lab.fold.aggregate import JobAggregate
from hyperpod_lab.submit.logtriage.select import failing_ranks

# attempt 0: local rank 3 is SIGKILLed, the others wait (torchrun SIGTERMs them); attempt 1: all succeed
SCRIPT = """
import os, signal, time
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if os.environ["LOCAL_RANK"] == "3":
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
"""


def test_one_rank_killed_of_eight_is_one_event_naming_the_seven_stopped(tmp_path):
    r = launch_standalone(tmp_path, SCRIPT, 8, "kill3")
    assert r.returncode == 0, r.stderr[-3000:]
    events_dir = tmp_path / "job" / "events"
    events = [Event.from_json(line) for name in sorted(os.listdir(events_dir)) if name.startswith("agent-")
              for line in open(events_dir / name) if line.strip()]
    faults = [e for e in events if e.kind == "fault.detected"]
    assert len(faults) == 1, [e.data for e in faults]
    d = faults[0].data
    assert d["rank"] == 3 and d["signal"] == "SIGKILL" and d["root_cause"] is True, d
    assert d["stopped_ranks"] == [0, 1, 2, 4, 5, 6, 7], d

    agg = JobAggregate()
    for e in events:
        agg.fold(e)
    lanes = agg.lanes()
    assert [m.get("root_cause") for m in lanes["3"]["marks"] if m["kind"] == "fault.detected"] == [True]
    for rank in (0, 1, 2, 4, 5, 6, 7):  # each stopped rank's lane: a consequence, drawn fainter
        marks = [m for m in lanes[str(rank)]["marks"] if m["kind"] == "fault.detected"]
        assert [(m["root_cause"], m["stopped_by"]) for m in marks] == [(False, 3)], marks
    # the timeline's one line for the incident names the stopped ranks
    lines = [e for e in agg.timeline() if e["kind"] == "fault.detected"]
    assert len(lines) == 1 and lines[0]["rank"] == 3, lines
    assert lines[0]["label"].endswith("(SIGKILL); its agent stopped ranks 0-2, 4-7"), lines[0]["label"]
    # log triage: the failed rank first, then the stopped ones (at most 4 failing ranks a view)
    as_dicts = [json.loads(e.to_json()) for e in faults]
    assert failing_ranks(as_dicts) == [3, 0, 1, 2]
    assert "its agent stopped ranks 0, 1, 2, 4, 5, 6, 7" in event_text(faults[0])


def test_a_fold_of_the_per_rank_events_of_older_agents_is_unchanged():
    """Events an older agent wrote (one per stopped rank, ``root_cause: false``) still fold as
    before: no ``stopped_by``, one timeline line."""
    agg = JobAggregate()
    t0 = 1_700_000_000.0
    agg.fold(Event(kind="fault.detected", job_id="j", time=t0, writer="agent-n1", seq=0,
                   data={"rank": 1, "node": "n1", "signal": "SIGKILL", "root_cause": True}))
    agg.fold(Event(kind="fault.detected", job_id="j", time=t0, writer="agent-n1", seq=1,
                   data={"rank": 0, "node": "n1", "signal": "SIGTERM", "root_cause": False}))
    assert [m.get("stopped_by") for m in agg.lanes()["0"]["marks"]] == [None]
    assert [e["label"] for e in agg.timeline() if e["kind"] == "fault.detected"] == ["fault: rank 1 on n1 (SIGKILL)"]
