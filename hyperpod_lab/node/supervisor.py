"""The Slurm batch script's supervisor: pre-flight health checks, node loss, spare nodes, bad nodes.

``python -m hyperpod_lab.node.supervisor`` is what a rendered batch script runs after it has
set the job's environment (see ``hyperpod_lab.schedulers.slurm.render_sbatch``). It owns the
placement of the training steps inside the allocation; the training itself is the launch agent's
(torchrun) and the runtime's. Torch-free, so it starts in well under a second.

What it does, in order:

1. **Placement.** The allocation has ``nodes + spares`` nodes (``resiliency.spares``). Nodes the
   job excluded earlier (``<job_dir>/placement.json``, see below) are never used again. The
   first ``nodes`` usable nodes train; the rest wait as spares.
2. **Pre-flight health checks** (``resiliency.health_checks``): one ``srun`` step runs
   :mod:`hyperpod_lab.node.health` on every usable node (spares too) before any training step.
   A node that fails a check is excluded (``node.excluded`` {reason: "health check failed: <check>"});
   if fewer than ``nodes`` healthy nodes are left, the job fails at once with the reason (exit 1;
   no training step ran, and a failed batch script is not requeued).
3. **Training steps.**

   * ``checkpointless``: one ``srun`` step per node, each its own data-parallel replica group
     (``HYPERPOD_LAB_REPLICA_GROUP``). ``sbatch --no-kill`` keeps the allocation when a node
     fails, and Slurm kills only the steps that touch the failed node ("Killing JobId=.. StepId=..
     due to failed node", slurmctld; sbatch(1) ``--no-kill``: "the active job step ... will likely
     suffer a fatal error, but subsequent job steps may be run"): a step per node is what keeps
     the survivors training. A lost node's group is reported (``fault.detected`` {reason:
     "node down", node, rank, replica_group, slurm_state}) and, with a spare left, a new replica
     group starts on the spare and heals from a live peer (no requeue, no queue wait).
   * ``restart``: one ``srun`` step over the training nodes (torchrun's c10d rendezvous). A node
     lost during the step kills the step; with enough usable nodes (spares) the step runs again
     at once on the survivors and a spare, and the runtime restores from the fastest tier that
     survived (the lost node's ranks from the peer tier); else the job requeues itself
     (``auto_resume``: ``scontrol requeue`` then ``ExcNodeList`` of the excluded nodes, which
     Slurm accepts once the job is pending again) or fails.

4. **Bad nodes.** Every fault is counted against its node: node losses and failed steps
   here, and the launch agents' reports of a worker killed by a signal on that node (not a
   Python exception, not a peer's failure; see :meth:`Supervisor.read_agent_faults`). A
   node with :data:`FAULTS_TO_EXCLUDE` faults in one job is excluded (``node.excluded``): not
   chosen as a spare, not used by a later step or run, and named in the requeued job's
   ``ExcNodeList``. A checkpointless group on a node that gets excluded while it runs is stopped
   and replaced from a spare when there is one.

5. **Restart storms** (:mod:`hyperpod_lab.node.storm`, ``resiliency.storm_restarts`` = K):
   every relaunch here (a restart step after a lost node, a spare's replica group replacing an
   ended one, a requeue for want of nodes) goes through the job's storm guard, whose counts
   outlive requeues (``<job_dir>/storm-supervisor.json``). When K relaunches in a row made no
   step progress (or one fault repeated), or a launch agent declared a storm (``storm.json``),
   the supervisor relaunches and requeues nothing, stops the steps still running (the agents
   get :data:`STORM_GRACE_S` to exit on their own), runs ``scontrol update JobId=<id>
   Requeue=0`` and exits 3. A job started again after a storm (a requeue by hand, ``RequeueExit``)
   does the same at once.

``<job_dir>/placement.json`` (written atomically by this process only): ``{"faults": {node: n},
"excluded": {node: reason}, "time": epoch s}``; it outlives requeues.

Limits: the batch script runs on the allocation's first node, so losing that node ends the job
(Slurm then requeues it with ``--requeue``); the Lighthouse of a checkpointless job runs there too.

Exit status: 0 when training finished (rank 0's ``finished`` event), 1 when the job failed (the
reason is the last ``hyperpod-lab:`` line of the Slurm log), or the failed training step's own
status; 3 (``STORM_EXIT``) after a restart storm.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from hyperpod_lab.atomicfile import write_json_atomic
from hyperpod_lab.events import (
    AGENT_WRITER_PREFIX,
    RANK_WRITER_PREFIX,
    SUPERVISOR_WRITER,
    EventKind,
    EventReader,
    EventWriter,
    FaultReason,
    LocalFiles,
)
from hyperpod_lab.jobdir import (
    ENV_HOT_SPARE,
    ENV_HOT_SPARES,
    ENV_REPLICA_GROUP,
    ENV_REPLICA_GROUPS,
    RECOVERY_CHECKPOINTLESS,
    RECOVERY_RESTART,
    JobPaths,
    claim_groups,
)
from hyperpod_lab.node import storm as _storm

FAULTS_TO_EXCLUDE = 2
"""Faults on one node in one job after which the node is excluded from the job's placements."""

SAME_INCIDENT_S = 1.0  # worker deaths on one node this close together (one failure round of its agent) are one fault, s
POLL_S = 0.2  # how often running steps are polled (seconds)
NODE_POLL_S = 1.0  # checkpointless: how often Slurm's view of the training nodes is read (seconds; 2 RPCs)
STORM_GRACE_S = 10.0  # after an agent declared a storm, its peers get this long to exit (seconds)
EVENTS_POLL_S = 1.0  # how often the job's events are read for agents' faults (seconds)
LOST_STATES = ("down", "drain", "fail", "not_responding", "power", "maint", "reboot", "unknown")
"""sinfo ``%T`` state words (lower case, ``*`` = not responding) that make a node unusable."""


_HEALTH_FAILED_LINE = re.compile(r"^(?:\d+: )?hyperpod-lab: health (\S+): (\w+) failed \([\d.]+ s\): (.*)$")
"""A failed check as :mod:`hyperpod_lab.node.health` prints it (``_line``), behind srun's label."""


def say(message: str) -> None:
    """One ``hyperpod-lab:`` line on stdout (the Slurm log)."""
    sys.stdout.write(f"hyperpod-lab: {message}\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- the allocation
def _run(argv: Sequence[str], timeout: float = 30.0) -> str:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()[:300]}")
    return out.stdout


def expand_nodelist(nodelist: str) -> list[str]:
    """``n[1-3],gpu7`` -> ``["n1", "n2", "n3", "gpu7"]`` (``scontrol show hostnames``)."""
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    return _run(["scontrol", "show", "hostnames", nodelist]).split()


def job_nodes(slurm_job_id: str) -> list[str]:
    """The nodes the job holds now (``squeue -h -j ID -o %N``, the job's node list alone on its
    line; with ``--no-kill`` a failed node is removed from it). Not parsed out of ``scontrol show
    job -o``, where a job name holding `` NodeList=...`` would be read as the node list."""
    text = _run(["squeue", "-h", "-j", slurm_job_id, "-o", "%N"]).strip()
    first = text.splitlines()[0].strip() if text else ""
    return expand_nodelist(first) if first and first != "(null)" else []


def node_states(nodes: Sequence[str]) -> dict[str, str]:
    """``{node: state}`` from ``sinfo -h -N -n NODES -o '%N|%T'`` (e.g. ``"idle"``, ``"down*"``)."""
    if not nodes:
        return {}
    out = _run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T"])
    return {n: s for n, _, s in (line.partition("|") for line in out.split()) if n}


def node_addr(node: str) -> str:
    """The node's address (``NodeAddr`` of ``scontrol show node``), else its name."""
    try:
        m = re.search(r"NodeAddr=(\S+)", _run(["scontrol", "show", "node", node]))
    except RuntimeError:
        return node
    return m.group(1) if m else node


def node_reason(node: str) -> str | None:
    """Why Slurm took the node (an admin's reason, "Not responding", "Kill task failed", ...), or
    None: ``sinfo -h -N -n NODE -o %E`` (sinfo(1): ``%E`` the reason a node is unavailable, the
    whole text however many ``x=y`` or spaces it holds; ``none`` when there is none)."""
    try:
        out = _run(["sinfo", "-h", "-N", "-n", node, "-o", "%E"])
    except RuntimeError:
        return None
    reason = out.splitlines()[0].strip() if out.strip() else ""
    return reason if reason and reason not in ("none", "(null)") else None


def is_lost(state: str | None) -> bool:
    """Whether a sinfo state word means the node cannot run the job's steps."""
    if state is None:
        return True
    s = state.lower()
    return s.endswith("*") or any(w in s for w in LOST_STATES)


# --------------------------------------------------------------------------- placement record
@dataclass
class Placement:
    """Faults per node and excluded nodes of one job (``<job_dir>/placement.json``)."""

    path: str
    faults: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)
    counted: set[str] = field(default_factory=set)  # event keys already counted ("writer:seq")

    @classmethod
    def load(cls, job_dir: str) -> "Placement":
        path = JobPaths(job_dir).placement
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as e:
            say(f"placement record {path} is unreadable ({e}); starting a new one")
            return cls(path)
        return cls(path, {str(k): int(v) for k, v in (data.get("faults") or {}).items()},
                   {str(k): str(v) for k, v in (data.get("excluded") or {}).items()},
                   set(data.get("counted") or []))

    def save(self) -> None:
        write_json_atomic(self.path, {"faults": self.faults, "excluded": self.excluded,
                                      "counted": sorted(self.counted), "time": time.time()})


# --------------------------------------------------------------------------- the supervisor
@dataclass
class Step:
    """One running ``srun`` step."""

    nodes: list[str]
    proc: subprocess.Popen
    group: int | None = None  # checkpointless: its replica group
    started: float = field(default_factory=time.time)
    lost: bool = False  # its node was reported lost (and its group replaced) while the step still ran


class Supervisor:
    """Places the job's steps on the allocation and reacts to node loss (see the module doc).

    Args:
        job_dir, job_id: the job's directory (shared storage) and hyperpod-lab id.
        nodes: training nodes (``spec.nodes``); spares: the allocation's extra nodes.
        mode: ``"checkpointless"`` or ``"restart"``.
        launch: the training command. restart: run by one step over all training nodes, with
            ``{head_addr}`` replaced by the first training node's address; checkpointless: run by
            one step per node.
        srun_opts: options for every training ``srun`` (e.g. ``--cpus-per-task=2``, ``--label``).
        procs_per_node: ranks per node (the global ranks of a checkpointless group).
        health: run the pre-flight health checks; health_args: extra arguments of
            ``python -m hyperpod_lab.node.health``.
        requeue: the job may requeue itself when it has too few usable nodes (``auto_resume``).
        python: interpreter on the nodes.
    """

    def __init__(self, job_dir: str, job_id: str, *, nodes: int, spares: int, mode: str, launch: list[str],
                 srun_opts: list[str], procs_per_node: int, health: bool, health_args: list[str],
                 requeue: bool, python: str, slurm_job_id: str, restart: int):
        self.job_dir, self.job_id, self.nodes, self.spares, self.mode = job_dir, job_id, nodes, spares, mode
        self.launch, self.srun_opts, self.procs_per_node = launch, srun_opts, procs_per_node
        self.health, self.health_args, self.may_requeue, self.python = health, health_args, requeue, python
        self.slurm_job_id, self.restart = slurm_job_id, restart
        self.placement = Placement.load(job_dir)
        self.events = EventWriter(job_dir, SUPERVISOR_WRITER, job_id)
        self.reader = EventReader(job_dir)
        self.steps: list[Step] = []
        self.hot: dict[str, Step] = {}  # checkpointless: node -> its hot spare's step, waiting for a group
        self.hot_spares = mode == RECOVERY_CHECKPOINTLESS and os.environ.get(ENV_HOT_SPARES, "1") != "0"
        self.next_group = nodes
        self.finished_rc: int | None = None
        self._last_events = 0.0
        self._last_node_poll = time.monotonic()
        self._last_fault_time: dict[str, float] = {}
        self._finished = False  # a rank's 'finished' event was read (training_finished)

    # ---- placement -------------------------------------------------------------------------
    def usable(self, busy: Sequence[str] = ()) -> list[str]:
        """Nodes of the allocation that are up, not excluded and not in ``busy``, in order."""
        held = job_nodes(self.slurm_job_id)
        states = node_states(held)
        return [n for n in held if n not in self.placement.excluded and n not in busy and not is_lost(states.get(n))]

    def exclude(self, node: str, reason: str) -> None:
        if node in self.placement.excluded:
            return
        self.placement.excluded[node] = reason
        self.placement.save()
        say(f"node {node} excluded: {reason}")
        self.events.emit(EventKind.NODE_EXCLUDED, node=node, reason=reason,
                         faults=self.placement.faults.get(node, 0), excluded=sorted(self.placement.excluded))

    def count_fault(self, node: str, key: str | None = None) -> None:
        """One more fault on ``node`` (``key``: an event already counted is not counted again)."""
        if key is not None:
            if key in self.placement.counted:
                return
            self.placement.counted.add(key)
        self.placement.faults[node] = self.placement.faults.get(node, 0) + 1
        self.placement.save()
        if self.placement.faults[node] >= FAULTS_TO_EXCLUDE:
            self.exclude(node, f"faulted {self.placement.faults[node]} times in this job")

    def read_agent_faults(self) -> None:
        """Count the launch agents' reports of a worker killed on a node.

        A node is blamed for a worker that died of a signal (the OOM killer, SIGBUS/SIGSEGV of a
        bad GPU or memory, a kill): the agent's root-cause ``fault.detected`` with a ``signal``
        other than SIGTERM/SIGINT (those are the agent's own stop of the siblings). A Python
        exception is the script's, not the node's (it would fail on any node), and the workers
        of other nodes that fail because a peer died exit with an error, not a signal. Several
        workers of one node killed within :data:`SAME_INCIDENT_S` count once. A rank's
        ``finished`` read on the way is noted for :meth:`training_finished`.
        """
        for ev in self.reader.poll():
            d = ev.data
            if ev.kind == EventKind.FINISHED.value and ev.writer.startswith(RANK_WRITER_PREFIX):
                self._finished = True
            if (ev.kind != EventKind.FAULT_DETECTED.value or not ev.writer.startswith(AGENT_WRITER_PREFIX) or not d.get("node")
                    or d.get("root_cause") is False or d.get("signal") in (None, "SIGTERM", "SIGINT")):
                continue
            node = str(d["node"])
            if ev.time - self._last_fault_time.get(node, float("-inf")) < SAME_INCIDENT_S:
                continue
            self._last_fault_time[node] = ev.time
            self.count_fault(node, f"{ev.writer}:{ev.seq}")

    def read_stragglers(self) -> None:
        """Exclude the nodes whose launch agent flagged a straggler with ``resiliency.on_straggler
        = exclude`` (:func:`hyperpod_lab.node.straggler.excluded_nodes`): a checkpointless
        group there is replaced by a spare (:meth:`excluded_running`), later placements avoid it."""
        from hyperpod_lab.node.straggler import excluded_nodes

        for node, reason in excluded_nodes(self.job_dir).items():
            self.exclude(node, reason)

    # ---- health ----------------------------------------------------------------------------
    def preflight(self, candidates: list[str]) -> list[str]:
        """Run the health checks on ``candidates``; returns the healthy ones (failing ones excluded)."""
        from hyperpod_lab.node.health import load_results, summarize

        run_id = f"{self.slurm_job_id}.{self.restart}.{int(time.time())}"
        say(f"pre-flight health checks on {','.join(candidates)}")
        argv = ["srun", f"--nodes={len(candidates)}", f"--ntasks={len(candidates)}", "--ntasks-per-node=1",
                f"--nodelist={','.join(candidates)}", "--kill-on-bad-exit=0", "--label",
                self.python, "-m", "hyperpod_lab.node.health", "--node-run-id", run_id, *self.health_args]
        t0 = time.time()
        printed: dict[str, list[tuple[str, str]]] = {}  # node -> failed checks, from the nodes' output
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, errors="replace") as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                m = _HEALTH_FAILED_LINE.match(line.rstrip("\n"))
                if m:
                    printed.setdefault(m.group(1), []).append((m.group(2), m.group(3)))
            rc = proc.wait()
        sys.stdout.flush()
        results = {r.node: r for r in load_results(self.job_dir, run_id)}
        failed = summarize(list(results.values()))
        for node in candidates:
            if node not in results:
                # no result file: a node whose shared storage is unwritable cannot write one, but
                # its output (srun --label) says which checks failed
                failed.setdefault(node, []).extend(printed.get(node) or [
                    ("run", f"the health check did not report (srun exit {rc})")])
        for node, checks in sorted(failed.items()):
            for check, detail in checks:
                say(f"health check failed on {node}: {check}: {detail}")
            self.exclude(node, "health check failed: " + ", ".join(c for c, _ in checks))
        healthy = [n for n in candidates if n not in failed]
        say(f"pre-flight health checks: {len(healthy)}/{len(candidates)} nodes healthy in {time.time() - t0:.1f} s")
        return healthy

    # ---- steps -----------------------------------------------------------------------------
    def _srun(self, nodes: list[str], command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        argv = ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
                f"--nodelist={','.join(nodes)}", *self.srun_opts, *command]
        return subprocess.Popen(argv, env={**os.environ, **(env or {})})

    def start_hot_spares(self) -> None:
        """Checkpointless: start a hot spare on each spare node that has none: the launch command
        with ``$HYPERPOD_LAB_HOT_SPARE`` and no replica group, so its processes start, import and
        run the script up to ``hp.init()`` and wait there (``runtime.context``) for
        :meth:`replace_group` to assign them a group."""
        if not self.hot_spares:
            return
        busy = [n for st in self.steps if st.proc.poll() is None for n in st.nodes] + list(self.hot)
        for node in self.usable(busy)[:max(0, self.spares - len(self.hot))]:
            say(f"hot spare on {node}: started, waiting for a replica group")
            env = {k: v for k, v in os.environ.items() if k != ENV_REPLICA_GROUP}
            env[ENV_HOT_SPARE] = "1"
            argv = ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", f"--nodelist={node}",
                    *self.srun_opts, *self.launch]
            self.hot[node] = Step([node], subprocess.Popen(argv, env=env))

    def _new_group(self) -> int:
        """A replica group number no group of the job has had (:func:`claim_groups`: also none
        that ``hyperpod-lab scale`` gave a joining allocation)."""
        files, paths = LocalFiles(), JobPaths(self.job_dir)
        try:
            files.makedirs(paths.replicas)
            group = claim_groups(files.create_new, paths, self.next_group)
        except OSError as e:  # the spare still starts: a refused claim must not stop the recovery
            group = self.next_group
            say(f"could not claim replica group number {group} on the shared storage ({e}); using it unclaimed")
        self.next_group = group + 1
        return group

    def _assign(self, node: str, group: int) -> bool:
        """Tell the hot spare on ``node`` its replica group (``spares/<node>.json``, atomic);
        False when the shared storage refused (the spare then starts cold)."""
        path = JobPaths(self.job_dir).spare_assignment(node)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_json_atomic(path, {"group": group, "time": time.time()})
            return True
        except OSError as e:
            say(f"could not assign the hot spare on {node} ({e}); starting the group cold")
            return False

    def stop_hot_spares(self) -> None:
        """Stop the hot spares still waiting (they also leave by themselves within a second of
        the job's ``finished``)."""
        for node, step in list(self.hot.items()):
            _stop_srun(step.proc)
            del self.hot[node]

    def start_group(self, node: str, group: int) -> None:
        say(f"replica group {group} on {node}")
        self.steps.append(Step([node], self._srun([node], self.launch, {ENV_REPLICA_GROUP: str(group)}), group))

    def start_restart_step(self, nodes: list[str]) -> None:
        head = node_addr(nodes[0])
        say(f"training on {','.join(nodes)} (rendezvous on {nodes[0]}, {head})")
        command = [a.replace("{head_addr}", head) for a in self.launch]
        self.steps.append(Step(list(nodes), self._srun(nodes, command)))

    def group_ranks(self, group: int) -> list[int]:
        return [group * self.procs_per_node + r for r in range(self.procs_per_node)]

    def ranks_on(self, node: str) -> list[int]:
        """Global ranks whose newest rank file names ``node``."""
        paths, ranks = JobPaths(self.job_dir), []
        try:
            names = os.listdir(paths.ranks)
        except OSError:
            return []
        for name in names:
            rank = JobPaths.rank_of(name)
            if rank is None:
                continue
            try:
                with open(paths.rank_file(rank)) as f:
                    if json.load(f).get("node") == node:
                        ranks.append(rank)
            except (OSError, ValueError):
                continue
        return sorted(ranks)

    def report_lost(self, node: str, state: str | None, group: int | None) -> None:
        ranks = self.group_ranks(group) if group is not None else self.ranks_on(node)
        say(f"node {node} lost (Slurm state {state or 'removed from the job'})")
        data: dict[str, Any] = {"reason": FaultReason.NODE_DOWN.value, "node": node, "rank": ranks,
                                "slurm_state": (state or "removed from the job").upper(),
                                "slurm_reason": node_reason(node), "detected_by": SUPERVISOR_WRITER}
        if group is not None:
            data["replica_group"] = group
        self.events.emit(EventKind.FAULT_DETECTED, **data)
        self.count_fault(node)

    def lost_nodes(self, nodes: Sequence[str]) -> dict[str, str | None]:
        """Which of ``nodes`` Slurm took away: ``{node: state}`` (None: no longer in the job)."""
        held = set(job_nodes(self.slurm_job_id))
        states = node_states(list(nodes))
        return {n: (states.get(n) if n in held else None) for n in nodes
                if n not in held or is_lost(states.get(n))}

    def training_finished(self) -> bool:
        """Whether rank 0 wrote ``finished``: the job's events read on from the cursor the fault
        counting keeps (:meth:`read_agent_faults`), not every rank file again from its start."""
        self.read_agent_faults()
        return self._finished

    # ---- requeue ---------------------------------------------------------------------------
    def requeue_or_fail(self, why: str) -> int:
        excluded = sorted(self.placement.excluded)
        if not self.may_requeue:
            say(f"job failed: {why} (auto_resume is off: no requeue)")
            return 1
        say(f"requeueing the job: {why}" + (f"; excluding {','.join(excluded)}" if excluded else ""))
        for step in self.steps:
            if step.proc.poll() is None:
                step.proc.terminate()
        rc = subprocess.call(["scontrol", "requeue", self.slurm_job_id])
        if rc != 0:
            say(f"job failed: {why}; scontrol requeue {self.slurm_job_id} failed ({rc})")
            return 1
        if excluded:  # accepted only once the job is pending again (not while it runs)
            for _ in range(50):
                if subprocess.call(["scontrol", "update", f"JobId={self.slurm_job_id}",
                                    f"ExcNodeList={','.join(excluded)}"], stderr=subprocess.DEVNULL) == 0:
                    break
                time.sleep(0.1)
        time.sleep(60)  # Slurm ends this batch script (the job is requeued)
        return 1

    # ---- restart storms (hyperpod_lab.node.storm) ---------------------------------------
    storm_stopped = False  # the job ended in a restart storm

    @functools.cached_property
    def storm(self) -> _storm.StormGuard:
        """The storm guard of this supervisor's relaunches (its counts survive requeues)."""
        return _storm.StormGuard(self.job_dir, self.events, _storm.storm_restarts_from_env(),
                                 JobPaths(self.job_dir).storm_supervisor,
                                 steps_are_durable=self.mode == RECOVERY_CHECKPOINTLESS)

    def relaunch_allowed(self, fault: _storm.Fault) -> bool:
        """A run ended with ``fault`` and would be relaunched (or requeued): False when that is a
        restart storm (declared now, with ``job.failed``, or earlier by a launch agent)."""
        return self.storm_stopped is False and self.storm.failure(fault) is None

    def storm_waited(self) -> bool:
        """A launch agent declared a storm more than :data:`STORM_GRACE_S` ago (its peers may
        wait in a rendezvous that will never complete)."""
        try:
            return time.time() - os.stat(_storm.marker_path(self.job_dir)).st_mtime > STORM_GRACE_S
        except OSError:
            return False

    def stop_storm(self) -> int:
        """End the job after a restart storm: stop its steps, tell Slurm not to requeue it, exit 3.

        ``scontrol update JobId=<id> Requeue=0`` (scontrol(1): "Requeue=<0|1> Stipulates whether a
        job should be requeued after a node failure: 0 for no, 1 for yes"): the job was submitted
        with ``--requeue``, so a node failing while it ends would otherwise put it back in the queue.
        """
        first = not self.storm_stopped
        self.storm_stopped = True
        self.stop_hot_spares()
        for step in self.steps:
            if step.proc.poll() is None:
                step.proc.terminate()
        for step in self.steps:
            try:
                step.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                step.proc.kill()
        if first:
            found = _storm.declared(self.job_dir) or self.storm.declared or {}
            rc = subprocess.call(["scontrol", "update", f"JobId={self.slurm_job_id}", "Requeue=0"],
                                 stderr=subprocess.DEVNULL)
            say(f"job failed: {found.get('reason', 'restart storm')}; no requeue "
                f"(scontrol update Requeue=0: {'done' if rc == 0 else f'failed ({rc})'}); exit {_storm.STORM_EXIT}")
        return _storm.STORM_EXIT

    # ---- main loops ------------------------------------------------------------------------
    def run(self) -> int:
        if _storm.declared(self.job_dir) is not None:
            return self.stop_storm()  # a restart storm ended this job: a requeue or re-run does nothing
        self.read_agent_faults()
        usable = self.usable()
        if self.health:
            usable = self.preflight(usable)
        if len(usable) < self.nodes:
            why = (f"{len(usable)} usable nodes, the job needs {self.nodes}"
                   + (f" (excluded: {', '.join(f'{n}: {r}' for n, r in sorted(self.placement.excluded.items()))})"
                      if self.placement.excluded else ""))
            if self.health and any(r.startswith("health check failed") for r in self.placement.excluded.values()):
                say(f"job failed before training: {why}")  # a node failed its checks: fail fast
                return 1
            if not self.relaunch_allowed(_storm.Fault(None, None, "too few usable nodes")):
                return self.stop_storm()
            return self.requeue_or_fail(why)
        active, spares = usable[:self.nodes], usable[self.nodes:]
        if spares:
            say(f"spare nodes: {','.join(spares)}")
        if self.mode == RECOVERY_CHECKPOINTLESS:
            rc = self.run_checkpointless(active)
            return _storm.STORM_EXIT if self.storm_stopped else rc
        return self.run_restart(active)

    def _spare(self) -> str | None:
        busy = [n for s in self.steps if s.proc.poll() is None for n in s.nodes]
        free = self.usable(busy)
        warm = [n for n in free if n in self.hot and self.hot[n].proc.poll() is None]
        return (warm or free or [None])[0]

    def run_checkpointless(self, active: list[str]) -> int:
        for group, node in enumerate(active):
            self.start_group(node, group)
        self.start_hot_spares()
        rcs: list[int] = []
        while True:
            for node in [n for n, st in self.hot.items() if st.proc.poll() is not None]:
                say(f"hot spare on {node} ended ({self.hot.pop(node).proc.returncode})")
            running = [s for s in self.steps if s.proc.poll() is None]
            for step in [s for s in self.steps if s.proc.returncode is not None and s not in running]:
                self.steps.remove(step)
                rcs.append(step.proc.returncode)
                self.on_group_ended(step)
            if self.excluded_running():
                continue
            if not any(s.proc.poll() is None for s in self.steps):
                break
            self.maybe_read_events()
            self.maybe_find_lost_nodes()
            time.sleep(POLL_S)
        self.stop_hot_spares()
        if self.training_finished():
            return 0
        bad = [rc for rc in rcs if rc != 0]
        return bad[-1] if bad else 0

    def on_group_ended(self, step: Step) -> None:
        node, rc = step.nodes[0], step.proc.returncode
        if self.storm_stopped:
            return
        if step.lost:  # reported and replaced while slurmctld was still killing it
            say(f"replica group {step.group} on lost node {node} ended ({rc})")
            return
        if self.training_finished():
            say(f"replica group {step.group} on {node} ended ({rc})")
            return
        # srun's status does not tell a lost node: under --no-kill a step whose node failed can
        # end with 0 (sbatch(1): its tasks "will not be considered terminated"); Slurm's view does
        lost = self.lost_nodes([node])
        if lost:
            self.report_lost(node, lost[node], step.group)
        elif rc == 0:
            say(f"replica group {step.group} on {node} ended ({rc})")
            return
        elif node not in self.placement.excluded:
            say(f"replica group {step.group} on {node} failed (exit {rc})")
            self.count_fault(node)
        self.replace_group(step)

    def maybe_find_lost_nodes(self) -> None:
        """Every :data:`NODE_POLL_S`: a training node that Slurm marked DOWN (or took from the
        job) is reported and its group replaced at once, not when its ``srun`` step ends (slurmctld
        kills that step, but its end can come seconds later)."""
        now = time.monotonic()
        if now - self._last_node_poll < NODE_POLL_S:
            return
        self._last_node_poll = now
        live = {s.nodes[0]: s for s in self.steps if s.proc.poll() is None and not s.lost}
        if not live:
            return
        for node, state in self.lost_nodes(list(live)).items():
            step = live[node]
            step.lost = True
            self.report_lost(node, state, step.group)
            if not self.training_finished():
                self.replace_group(step, FaultReason.NODE_DOWN.value)

    def replace_group(self, step: Step, reason: str | None = None) -> None:
        if not self.relaunch_allowed(_storm.Fault(step.group, step.nodes[0], reason or f"exit {step.proc.returncode}")):
            self.stop_storm()  # a restart storm: no replacement, the other groups stop too
            return
        spare = self._spare()
        if spare is None:
            say(f"no spare node for replica group {step.group}; the other groups go on")
            return
        group = self._new_group()
        hot = self.hot.pop(spare, None)
        if hot is not None and hot.proc.poll() is None and self._assign(spare, group):
            hot.group, hot.started = group, time.time()
            self.steps.append(hot)
            say(f"spare node {spare} joins as replica group {group} (hot spare; replacing group {step.group} "
                f"on {step.nodes[0]})")
        else:
            say(f"spare node {spare} joins as replica group {group} (replacing group {step.group} on {step.nodes[0]})")
            self.start_group(spare, group)
        self.start_hot_spares()  # another spare node left: warm it up

    def excluded_running(self) -> bool:
        """Stop a checkpointless group whose node was excluded while it ran (a spare replaces it)."""
        for step in self.steps:
            if step.proc.poll() is None and step.nodes[0] in self.placement.excluded and self._spare():
                say(f"stopping replica group {step.group} on excluded node {step.nodes[0]}")
                _stop_srun(step.proc)
                return True
        return False

    def maybe_read_events(self) -> None:
        now = time.monotonic()
        if now - self._last_events >= EVENTS_POLL_S:
            self._last_events = now
            self.read_agent_faults()
            self.read_stragglers()

    def run_restart(self, active: list[str]) -> int:
        while True:
            self.start_restart_step(active)
            step = self.steps[-1]
            while step.proc.poll() is None and not self.storm_waited():
                self.maybe_read_events()
                time.sleep(POLL_S)
            if _storm.declared(self.job_dir) is not None:
                return self.stop_storm()  # the launch agents declared a restart storm
            rc = step.proc.returncode
            self.steps.remove(step)
            if self.training_finished():
                return 0
            lost = self.lost_nodes(active)  # srun's status alone does not tell a lost node
            if not lost:
                return rc  # 0, or the launch agents gave up (max_retries): the job ends with their status
            for node, state in lost.items():
                self.report_lost(node, state, None)
            if not self.relaunch_allowed(_storm.Fault(None, ",".join(sorted(lost)), FaultReason.NODE_DOWN.value)):
                return self.stop_storm()
            usable = self.usable()
            if len(usable) < self.nodes:
                return self.requeue_or_fail(f"lost {','.join(lost)}; {len(usable)} usable nodes, "
                                            f"the job needs {self.nodes}")
            survivors = [n for n in active if n in usable]
            active = (survivors + [n for n in usable if n not in survivors])[:self.nodes]
            say(f"resuming on {','.join(active)} without a requeue")


def _stop_srun(proc: subprocess.Popen) -> None:
    """Stop an ``srun`` step and wait for it: SIGINT twice (srun: the first SIGINT reports, a
    second within 1 s kills the step), then SIGKILL after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hyperpod_lab.node.supervisor", description=__doc__.split("\n")[0])
    p.add_argument("--job-dir", required=True)
    p.add_argument("--job-id", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--spares", type=int, default=0)
    p.add_argument("--mode", choices=[RECOVERY_CHECKPOINTLESS, RECOVERY_RESTART], required=True)
    p.add_argument("--procs-per-node", type=int, default=1)
    p.add_argument("--health-checks", action="store_true")
    p.add_argument("--health-arg", action="append", default=[], help="an argument for the health check")
    p.add_argument("--requeue", action="store_true", help="requeue the job when too few nodes are usable")
    p.add_argument("--srun-opt", action="append", default=[], help="an option for every training srun")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("launch", nargs=argparse.REMAINDER, help="-- the training command")
    a = p.parse_args(argv)
    launch = a.launch[1:] if a.launch[:1] == ["--"] else a.launch
    if not launch:
        p.error("the training command is missing (after --)")
    slurm_job_id = os.environ.get("SLURM_JOB_ID", "")
    if not slurm_job_id:
        p.error("SLURM_JOB_ID is not set: the supervisor runs inside a Slurm batch script")
    if a.mode == RECOVERY_CHECKPOINTLESS:
        os.environ.setdefault(ENV_REPLICA_GROUPS, str(a.nodes))
    sup = Supervisor(a.job_dir, a.job_id, nodes=a.nodes, spares=a.spares, mode=a.mode, launch=launch,
                     srun_opts=a.srun_opt, procs_per_node=a.procs_per_node, health=a.health_checks,
                     health_args=a.health_arg, requeue=a.requeue, python=a.python, slurm_job_id=slurm_job_id,
                     restart=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # scancel: Slurm ends the steps itself
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
