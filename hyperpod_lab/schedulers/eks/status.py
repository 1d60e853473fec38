"""The operator's view of an EKS job as our JobStatus and events (pure functions).

The HyperPod (or Kubeflow) operator reports a job in its custom resource's ``status``:
``conditions``, ``restartCount``, ``latestFaultyPodInstanceList``, ``elasticScalingStatus``.
:func:`job_status` maps it to a :class:`~hyperpod_lab.submit.jobs.JobStatus`; :func:`status_events`
turns the change since the last look into events of the writer
:data:`~hyperpod_lab.events.OPERATOR_WRITER`, so the sidebar, widgets and ``EventReader`` show the
faults and recoveries the operator saw like those the runtime writes. Nothing here talks to Kubernetes.
"""

from __future__ import annotations

from typing import Any

from hyperpod_lab.events import EventKind
from hyperpod_lab.submit.jobs import JobStatus

__all__ = ["job_status", "status_events"]

_COMPLETED = ("Completed", "Succeeded")
_FAILED = ("Failed",)
_RUNNING = ("Running", "PodsRunning")
_RESTARTING = ("Restarting",)


def job_status(obj: dict[str, Any] | None, cancelled: bool = False) -> tuple[JobStatus, int | None, str | None]:
    """Our JobStatus from a custom resource's ``status`` (``conditions``: the newest True one wins).

    ``None`` (the resource is gone) is CANCELLED when we cancelled it, else FAILED.
    """
    if obj is None:
        return ((JobStatus.CANCELLED, None, "cancelled") if cancelled
                else (JobStatus.FAILED, None, "the job's resource was deleted outside hyperpod-lab"))
    conds = [c for c in (obj.get("status") or {}).get("conditions") or [] if str(c.get("status")) == "True"]
    if not conds:
        return JobStatus.PENDING, None, None
    last = sorted(conds, key=lambda c: c.get("lastTransitionTime") or "")[-1]
    kind, reason = last.get("type"), last.get("message") or last.get("reason")
    if kind in _COMPLETED:
        return JobStatus.COMPLETED, 0, reason
    if kind in _FAILED:
        return JobStatus.FAILED, None, reason
    if kind in _RUNNING or kind in _RESTARTING:
        return JobStatus.RUNNING, None, reason
    return JobStatus.PENDING, None, reason


def status_events(prev: dict[str, Any], obj: dict[str, Any] | None, procs_per_node: int, now: float,
                  cancelled: bool = False) -> tuple[list[tuple[EventKind, dict[str, Any]]], dict[str, Any]]:
    """Events the operator's status implies since ``prev`` (pure; ``prev`` = ``{}`` at first).

    * first Running condition -> ``started`` {nodes, world_size, source};
    * ``restartCount`` up -> ``fault.detected`` {rank, ranks (the job's ranks: with ``nprocPerNode``
      "1", a restart-mode HyperPod job whose one process a pod is our launch agent, the operator's
      rank r is pod r, i.e. ranks r*procs_per_node ... r*procs_per_node+procs_per_node-1), pods, instances, restart_type (PLR:
      process-level, JLR: job-level), restart_count, reason, source} and ``recovery.started``
      {restart_count, reason, node: null, source};
    * Running again after a restart -> ``recovery.completed`` {restart_count, downtime_s (seconds
      from the ``Restarting`` condition to the ``Running`` one after it, by their
      ``lastTransitionTime``; else from when the fault was first seen to ``now``),
      restored_step: null, restored_from: null, source};
    * ``elasticScalingStatus.targetReplicas`` changed -> ``elastic.scaled`` {old_nodes, new_nodes,
      old_world_size, new_world_size, source};
    * a terminal condition (or the resource gone) -> ``finished`` {status, exit_code, reason, source}.

    Returns:
        (events as (kind, data) pairs, the new state to pass as ``prev`` next time).
    """
    st = dict(prev)
    out: list[tuple[EventKind, dict[str, Any]]] = []
    src = {"source": "operator"}
    if st.get("finished"):
        return out, st
    state, code, reason = job_status(obj, cancelled)
    status = (obj or {}).get("status") or {}
    if state == JobStatus.RUNNING and not st.get("started"):
        nodes = _replicas(obj)
        out.append((EventKind.STARTED, {"nodes": nodes, "world_size": nodes * procs_per_node, **src}))
        st["started"] = True
        st["nodes"] = nodes
    restarts = int(status.get("restartCount") or 0)
    if restarts > int(st.get("restart_count", 0)):
        faulty = status.get("latestFaultyPodInstanceList") or {}
        ranks = [int(r) for r in faulty.get("faultyRankList") or [] if str(r).lstrip("-").isdigit()]
        unit = str(((obj or {}).get("spec") or {}).get("nprocPerNode") or "")
        if unit == "1" and procs_per_node > 1:  # the operator counts its processes: one a pod, our agent
            ranks = [r * procs_per_node + i for r in ranks for i in range(procs_per_node)]
        rtype = faulty.get("restartType")
        out.append((EventKind.FAULT_DETECTED, {
            "rank": ranks[0] if ranks else None, "ranks": ranks, "pods": list(faulty.get("faultyPodList") or []),
            "instances": list(faulty.get("faultyInstanceIdList") or []), "restart_type": rtype,
            "restart_count": restarts, "node": None,
            "reason": f"the operator restarted the job ({rtype or 'restart'}), restart {restarts}", **src}))
        out.append((EventKind.RECOVERY_STARTED, {"restart_count": restarts, "node": None,
                                                 "reason": f"operator restart ({rtype or 'unknown'})", **src}))
        st["restart_count"] = restarts
        st.setdefault("fault_time", now)
        st["recovering"] = True
    running_now = state == JobStatus.RUNNING and _newest_true(obj) in _RUNNING
    if st.get("recovering") and running_now:
        fault_t, back_t = _cond_time(obj, _RESTARTING), _cond_time(obj, _RUNNING)
        t0 = st.pop("fault_time", now)
        downtime = back_t - fault_t if fault_t is not None and back_t is not None and back_t >= fault_t else now - t0
        out.append((EventKind.RECOVERY_COMPLETED, {
            "restart_count": st.get("restart_count", 0), "downtime_s": round(downtime, 3),
            "restored_step": None, "restored_from": None, **src}))
        st["recovering"] = False
    target = (status.get("elasticScalingStatus") or {}).get("targetReplicas")
    if isinstance(target, dict) and target:
        new = sum(int(v) for v in target.values())
        old = int(st.get("nodes") or _replicas(obj))
        if new != old:
            out.append((EventKind.ELASTIC_SCALED, {"old_nodes": old, "new_nodes": new,
                                                   "old_world_size": old * procs_per_node,
                                                   "new_world_size": new * procs_per_node, **src}))
        st["nodes"] = new
    if state.is_terminal():
        out.append((EventKind.FINISHED, {"status": {JobStatus.COMPLETED: "succeeded"}.get(state, state.value),
                                         "exit_code": code, "reason": reason, **src}))
        st["finished"] = True
    return out, st


def _cond_time(obj: dict[str, Any] | None, types: tuple[str, ...]) -> float | None:
    """Epoch seconds of the newest condition of one of ``types`` (its ``lastTransitionTime``)."""
    from datetime import datetime

    times = []
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") in types and c.get("lastTransitionTime"):
            try:
                times.append(datetime.fromisoformat(str(c["lastTransitionTime"]).replace("Z", "+00:00")).timestamp())
            except ValueError:
                pass
    return max(times) if times else None


def _newest_true(obj: dict[str, Any] | None) -> str | None:
    conds = [c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if str(c.get("status")) == "True"]
    return sorted(conds, key=lambda c: c.get("lastTransitionTime") or "")[-1].get("type") if conds else None


def _replicas(obj: dict[str, Any] | None) -> int:
    spec = (obj or {}).get("spec") or {}
    if "replicaSpecs" in spec:
        return sum(int(r.get("replicas") or 0) for r in spec["replicaSpecs"])
    return sum(int(r.get("replicas") or 0) for r in (spec.get("pytorchReplicaSpecs") or {}).values())
