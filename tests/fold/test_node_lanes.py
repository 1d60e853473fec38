"""JobAggregate's lanes per node (issue 27 item 3): the dashboard's answer is sized by nodes, not
ranks; a fault of any rank shows on its node's lane, named with the rank; one node's ranks are
expanded on request. Events are built in memory with the real Event type (no job runs), shaped
as benchmarks/scale.py's synthetic jobs (8 ranks a node, memory checkpoints with rank and node)."""

from __future__ import annotations

import json

from hyperpod_lab.events import Event
from hyperpod_lab.fold.aggregate import NODE_MARKS, JobAggregate

T0 = 1_700_000_000.0
PER_NODE = 8


def _job(ranks: int, fault_rank: int, node_down: int | None = None, steps: int = 20) -> list[Event]:
    """``ranks`` ranks on nodes n0, n1, ... (8 each): steps from rank 0, a memory checkpoint of
    every rank every 5 steps (with its rank and node, as the runtime writes them), a fault of
    ``fault_rank`` reported by its node's agent at the middle step, every rank restoring; with
    ``node_down``, the supervisor's node-down report of that node naming its 8 ranks."""
    seq: dict[str, int] = {}
    out: list[Event] = []

    def ev(kind: str, writer: str, t: float, **data) -> None:
        seq[writer] = seq.get(writer, -1) + 1
        out.append(Event(kind=kind, job_id="j", time=T0 + t, writer=writer, seq=seq[writer], data=data))

    nodes = ranks // PER_NODE
    ev("submitted", "client", 0, cluster="dev", nodes=nodes, procs_per_node=PER_NODE, world_size=ranks)
    for step in range(steps):
        t = 1 + step
        ev("step", "rank-0", t, step=step, loss=1.0 / (step + 1), steps_per_s=1.0)
        if step % 5 == 4:
            for r in range(ranks):
                ev("checkpoint.saved", f"rank-{r}", t + 0.01 + r * 1e-6, tier="memory", step=step, rank=r,
                   node=f"n{r // PER_NODE}")
        if step == steps // 2:
            n = fault_rank // PER_NODE
            ev("fault.detected", f"agent-n{n}", t + 0.1, rank=fault_rank, node=f"n{n}", reason="exception", exitcode=1)
            if node_down is not None:
                ev("fault.detected", "supervisor", t + 0.2, reason="node down", node=f"n{node_down}",
                   rank=list(range(node_down * PER_NODE, node_down * PER_NODE + PER_NODE)), slurm_state="DOWN")
            ev("recovery.started", f"agent-n{n}", t + 0.3, node=f"n{n}", reason="local worker failed")
            for r in range(ranks):
                ev("checkpoint.restored", f"rank-{r}", t + 0.5 + r * 1e-6, tier="memory", step=step - 1, rank=r,
                   node=f"n{r // PER_NODE}")
    return out


def _fold(events: list[Event]) -> JobAggregate:
    agg = JobAggregate(max_buckets=512)
    for e in events:
        agg.fold(e)
    return agg


def test_a_fault_on_rank_1337_shows_on_its_nodes_lane_and_the_node_expands_to_its_8_ranks():
    agg = _fold(_job(2048, fault_rank=1337, node_down=3))
    s = agg.summary(100)
    assert s["ranks"] == 2048 and len(s["nodes"]) == 256 and s["nodes"][:3] == ["n0", "n1", "n2"]
    assert set(s["lanes"]) == {"job", *s["nodes"]}  # a lane per node: no lane of a rank
    assert "1337" not in s["lanes"] and s["expanded"] is None
    n167 = s["lanes"]["n167"]
    assert n167["ranks"] == "ranks 1336-1343" and n167["rank_count"] == 8 and n167["faults"] == 1
    faults = [m for m in n167["marks"] if m["cat"] == "fault"]
    assert [(m["rank"], m["ranks"], m["label"]) for m in faults] == [
        (1337, [1337], "fault: rank 1337 on n167 (exception)")]
    # the restore of its 8 ranks is one mark naming them, not 8
    restores = [m for m in n167["marks"] if m["kind"] == "checkpoint.restored"]
    assert [(m["ranks"], m["label"]) for m in restores] == [
        (list(range(1336, 1344)), "restored memory step 9 · ranks 1336-1343")]
    # the memory checkpoints of its 8 ranks: one span before the fault, one after
    spans = [(sp["step0"], sp["step1"], sp["count"], sp["ranks"]) for sp in n167["spans"] if sp["kind"] == "checkpoint"]
    assert spans == [(4, 9, 16, 8), (14, 19, 16, 8)], spans
    # the node-down report of n3 names its 8 ranks: one mark on n3's lane
    down = [m for m in s["lanes"]["n3"]["marks"] if m["cat"] == "fault"]
    assert len(down) == 1 and down[0]["ranks"] == list(range(24, 32)) and "node n3 down" in down[0]["label"]
    # a node other than the fault's shows no fault
    assert s["lanes"]["n0"]["faults"] == 0

    e = agg.summary(100, node="n167")["expanded"]
    assert e["node"] == "n167" and list(e["lanes"]) == [str(r) for r in range(1336, 1344)]
    assert [m["label"] for m in e["lanes"]["1337"]["marks"] if m["cat"] == "fault"] == [
        "fault: rank 1337 on n167 (exception)"]
    assert not [m for m in e["lanes"]["1336"]["marks"] if m["cat"] == "fault"]
    assert agg.summary(100, node="no-such-node")["expanded"] is None
    # the state keeps which node each rank is on
    back = JobAggregate.from_state(json.loads(json.dumps(agg.to_state())))
    assert back.summary(100, node="n167") == agg.summary(100, node="n167")


def test_the_reply_grows_with_the_nodes_not_the_ranks():
    """64 ranks (8 nodes) and 2,048 ranks (256 nodes), the same job shape: the reply per node lane
    is about the same (within 1.5x), so 2,048 ranks' reply is at most 1.5 x 32 x 64 ranks'; an
    expanded node adds about one node's ranks' lanes whatever the job's size."""
    size, per_node, expand = {}, {}, {}
    for ranks in (64, 2048):
        agg = _fold(_job(ranks, fault_rank=ranks - 3))
        s = agg.summary(100)
        size[ranks] = len(json.dumps(s))
        per_node[ranks] = size[ranks] / len(s["nodes"])
        expand[ranks] = len(json.dumps(agg.summary(100, node="n1"))) - size[ranks]
    assert per_node[2048] <= 1.5 * per_node[64], (size, per_node)
    assert size[2048] <= 1.5 * (2048 // 64) * size[64], size
    assert expand[2048] <= 1.5 * expand[64], expand
    # the timeline names all 2,048 ranks in its labels but lists at most 64 in an entry
    agg = _fold(_job(2048, fault_rank=5))
    ck = [e for e in agg.summary(100)["timeline"] if e["kind"] == "checkpoint"]
    assert ck and all(len(e["ranks"]) == 64 and e["rank_count"] == 2048 and "ranks 0-2047" in e["label"] for e in ck)


def test_ranks_no_event_placed_are_drawn_by_block_or_on_the_node_of_their_block():
    """Steps of rank 0 only and no node named: the ranks are drawn in blocks of the job's ranks
    per node ("ranks 0-3"); a block whose named ranks are all on one node is drawn on it."""
    evs = [Event("submitted", "j", T0, "client", 0, {"procs_per_node": 4, "nodes": 2, "world_size": 8})]
    evs += [Event("checkpoint.saved", "j", T0 + 1, f"rank-{r}", 0, {"tier": "peer", "step": 0}) for r in range(8)]
    agg = _fold(evs)
    assert agg.summary(10)["nodes"] == ["ranks 0-3", "ranks 4-7"]
    agg.fold(Event("fault.detected", "j", T0 + 2, "agent-n9", 0, {"rank": 5, "node": "n9", "reason": "exception"}))
    s = agg.summary(10)
    assert s["nodes"] == ["ranks 0-3", "n9"] and s["lanes"]["n9"]["ranks"] == "ranks 4-7"
    assert agg.node_ranks("n9") == [4, 5, 6, 7]


def test_a_node_lane_keeps_its_faults_first_when_its_marks_are_many():
    evs = []
    for i in range(NODE_MARKS + 10):
        evs.append(Event("straggler.detected", "j", T0 + i, "agent-n0", i,
                         {"rank": i % 8, "node": "n0", "score": 2.0, "step_s": i + 1.0, "step": i}))
    evs.append(Event("fault.detected", "j", T0 + 500, "agent-n0", 999, {"rank": 3, "node": "n0", "reason": "x"}))
    lane = _fold(evs).summary(10)["lanes"]["n0"]
    assert len(lane["marks"]) == NODE_MARKS and lane["dropped_marks"] == 11 and lane["faults"] == 1


def test_a_checkpointless_nodes_lane_names_its_replica_group():
    """Checkpointless, a replica group per node: the node's lane says its group (from the agent's
    fault and the replica restore, which name both); a node no event grouped says None."""
    evs = [Event("checkpoint.saved", "j", T0 + 1, f"rank-{r}", 0, {"tier": "memory", "step": 0, "rank": r,
                                                                   "node": f"n{r // 2}"}) for r in range(6)]
    evs.append(Event("fault.detected", "j", T0 + 2, "agent-n1", 0,
                     {"rank": 3, "node": "n1", "replica_group": 1, "reason": "exception"}))
    evs.append(Event("checkpoint.restored", "j", T0 + 3, "rank-4", 1,
                     {"tier": "replica", "step": 5, "rank": 4, "node": "n2", "replica_group": 2}))
    agg = _fold(evs)
    lanes = agg.summary(10)["lanes"]
    assert [lanes[n]["replica_group"] for n in ("n0", "n1", "n2")] == [None, 1, 2]
    back = JobAggregate.from_state(json.loads(json.dumps(agg.to_state())))
    assert back.summary(10)["lanes"]["n2"]["replica_group"] == 2
