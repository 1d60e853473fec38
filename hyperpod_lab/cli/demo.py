"""``hyperpod-lab demo``: the main job, end to end, and the flagship comparison.

Brings the local dev cluster up, executes the example notebooks headless (nbclient, a real
kernel; ``examples/quickstart.ipynb``, then ``examples/flagship.ipynb``), and meanwhile prints
every event of every job they submit as it arrives (``step`` events at most one line per second
per job); ends with a summary per job (steps, checkpoints, faults, recoveries, wall time), then
the flagship's side-by-side table of the two recovery modes and its elastic scaling events.

The flagship (``examples/flagship.ipynb``; docs/demo.md): the same script
(``examples/train_lm.py``), steps, nodes and injected fault (SIGKILL of rank 1 once step
:data:`FAULT_STEP` is done) under ``--recovery restart`` and ``--recovery checkpointless``;
then the checkpointless job loses a node (``elastic.scaled`` 2 -> 1) and gets one back
(``hyperpod-lab scale --add-nodes 1``: 1 -> 2). :func:`compare_recoveries` derives every number
of the table from the jobs' events (:func:`recovery_row`); :func:`flagship_verdict` is the demo's
pass/fail rule.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Callable

from hyperpod_lab.cli.render import MAX_LINE, event_line, human_bytes
from hyperpod_lab.errors import HyperPodLabError, JobStateError
from hyperpod_lab.events import Event
from hyperpod_lab.jobdir import DEFAULT_FAULT_KIND

#: the flagship's jobs: same script, steps, nodes and fault; only ``--recovery`` differs
FLAGSHIP_STEPS = 200  # long enough for the node loss and the join to happen well before the end
CHECKPOINT_EVERY = 20  # both jobs' --checkpoint-every: persistent checkpoints at steps 19, 39, ...
FAULT_STEP = 22  # rank 1 is SIGKILLed once this step is reported done (after the step-19 checkpoint;
# the kill, through srun --overlap, lands a few steps later: the table's "fault after step")
FLAGSHIP_NAMES = {"restart": "flagship-restart", "checkpointless": "flagship-checkpointless"}
#: ``checkpoint.restored`` tiers read from storage (memory and peer are RAM on a node; replica
#: is a live peer's memory over the network)
STORAGE_TIERS = ("persistent", "s3")
MODE_LABELS = {"restart": "checkpoint-restart", "checkpointless": "checkpointless"}


# ---- acting on a running job ---------------------------------------------------------------
def wait_for(client, job_id: str, pred: Callable[[list[Event]], object], what: str,
             timeout_s: float = 300.0, interval_s: float = 0.3) -> object:
    """Poll the job's events until ``pred(events)`` (all events so far, in time order) is truthy;
    return that value.

    Raises:
        TimeoutError: not within ``timeout_s`` seconds (the message names ``what``).
        JobStateError: the job ended (``finished`` event or a terminal state) before it held.
    """
    reader, events = client.event_reader(job_id), []
    deadline = time.monotonic() + timeout_s
    next_status = time.monotonic() + 5.0  # the scheduler is asked every 5 s only (a remote command)
    while True:
        events.extend(reader.poll())
        got = pred(events)
        if got:
            return got
        ended = any(e.kind == "finished" for e in events)
        if not ended and time.monotonic() >= next_status:
            next_status = time.monotonic() + 5.0
            ended = client.status(job_id).state.is_terminal()
        if ended:
            events.extend(reader.poll())
            got = pred(events)
            if got:
                return got
            raise JobStateError(f"job {job_id} ended before {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id}: no {what} within {timeout_s:g} s")
        time.sleep(interval_s)


def inject_at_step(client, job_id: str, rank: int = 1, step: int = FAULT_STEP, kind: str = DEFAULT_FAULT_KIND,
                   timeout_s: float = 600.0) -> dict:
    """Wait until the job reported ``step`` done (a ``step`` event with ``step >= step``; the
    wait includes the queue), then inject the fault (:meth:`Client.inject_fault`). Returns the
    fault's info plus ``at_step`` (the newest step reported when it was injected) and ``time``
    (epoch s, just before the injection)."""
    reached = wait_for(client, job_id, lambda evs: last_step(evs) >= step and last_step(evs),
                       f"step {step}", timeout_s)
    t = time.time()
    info = client.inject_fault(job_id, rank, kind=kind)
    return {**info, "at_step": reached, "time": t}


def last_step(events: list[Event]) -> int:
    """The newest step a ``step`` event reported, or -1."""
    return max((e.data.get("step", -1) for e in events if e.kind == "step"), default=-1)


def _mode(events: list[Event]) -> str:
    for e in events:
        if e.kind == "recovery.completed" and e.data.get("mode") == "checkpointless":
            return "checkpointless"
        if e.kind in ("checkpoint.restored", "recovery.fallback") and e.data.get("tier") == "replica":
            return "checkpointless"
    return "restart"


def recovery_row(events: list[Event], incident: int = 0) -> dict:
    """One row of the comparison: how a job recovered from one failure incident, from its events.

    Args:
        events: the job's events (``client.event_reader(job).poll()``).
        incident: which failure incident (0: the first, the injected fault), as the job facts fold
            counts them (:mod:`hyperpod_lab.fold.facts`).

    Returns:
        ``{"mode"`` (``restart`` or ``checkpointless``: a ``recovery.completed`` with ``mode:
        checkpointless`` or a ``replica`` restore), ``"label"`` (checkpoint-restart /
        checkpointless), ``"downtime_s"`` (s, the fold's: the incident's first detection to the
        first step completed after its recovery), ``"steps_lost"`` (steps completed before the
        fault and done again: the goodput measurement's ``recomputed_steps``, last ``step`` event
        before the detection + 1 - the step resumed), ``"storage_read_bytes"`` (bytes read from
        storage by the restores of the incident: ``read_bytes`` of its ``checkpoint.restored``
        events of tier persistent or s3; None when one of them does not say), ``"restored_from"``
        (tiers restored from, e.g. ``["persistent"]`` or ``["replica"]``), ``"restored_bytes"``
        (state bytes restored, any tier), ``"restarts"`` (worker-group restarts by torchrun's
        agents: ``recovery.started`` events), ``"fault_step"`` (the last step done before the
        fault), ``"detected_at"`` (epoch s)}``. An incident's restores and restarts are the events
        from its detection to the next incident's (a checkpointless replacement heals after the
        survivors' recovery ends the downtime).

    Raises:
        ValueError: the job has no such recovered incident.
    """
    from hyperpod_lab.fold.facts import fold
    from hyperpod_lab.goodput import measure_from_events

    events = sorted(events, key=lambda e: e.time)
    incidents = fold(events).incidents
    recovered = [i for i in incidents if i["recovered_at"] is not None and i["end_at"] is not None]
    if incident >= len(recovered):
        raise ValueError(f"the job has {len(recovered)} recovered failure incident(s), not {incident + 1}: did the "
                         "fault land and the job recover?")
    inc = recovered[incident]
    rec = measure_from_events(events)["recoveries"][incident]
    start = inc["detected_at"] if inc["detected_at"] is not None else inc["end_at"] - (inc["downtime_s"] or 0.0)
    later = [i["detected_at"] for i in incidents if i["detected_at"] is not None and i["detected_at"] > start]
    end = min(later) if later else float("inf")
    # a worker's restart is noted by its agent at once; a restore comes after the detection
    window = [e for e in events if start - 1.0 <= e.time < end]
    restores = [e for e in window if e.kind == "checkpoint.restored"]
    storage = [e for e in restores if e.data.get("tier") in STORAGE_TIERS]
    unknown = any(not isinstance(e.data.get("read_bytes"), int) for e in storage)
    mode = _mode(events)
    return {"mode": mode, "label": MODE_LABELS[mode], "downtime_s": rec["downtime_s"],
            "steps_lost": rec["recomputed_steps"],
            "storage_read_bytes": None if unknown else sum(e.data["read_bytes"] for e in storage),
            "restored_from": sorted({str(e.data.get("tier")) for e in restores}),
            "restored_bytes": sum(int(e.data.get("bytes") or 0) for e in restores),
            "restarts": sum(1 for e in window if e.kind == "recovery.started"),
            "fault_step": inc["last_step"], "detected_at": inc["detected_at"]}


def compare_recoveries(client, *job_ids: str, incident: int = 0) -> list[dict]:
    """:func:`recovery_row` of each job (e.g. the checkpoint-restart one and the checkpointless
    one), in the order given, each with ``"job_id"`` added. Reads the events through ``client``."""
    return [{"job_id": j, **recovery_row(client.event_reader(j).poll(), incident)} for j in job_ids]


def format_comparison(rows: list[dict]) -> str:
    """The rows of :func:`compare_recoveries` as a fixed-width text table (what the notebook and
    ``hyperpod-lab demo`` print)."""
    head = ["recovery mode", "downtime (s)", "steps lost (redone)", "storage reads", "restarts", "restored from",
            "fault after step"]
    body = [[r["label"], f"{r['downtime_s']:.2f}", str(r["steps_lost"]),
             human_bytes(r["storage_read_bytes"]) + ("" if not r["storage_read_bytes"] else f" ({r['storage_read_bytes']:,} B)"),
             str(r["restarts"]), ", ".join(f"{t} ({human_bytes(r['restored_bytes'])})" for t in r["restored_from"]) or "-",
             str(r["fault_step"])]
            for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), "-+-".join("-" * w for w in widths)] + [line(b) for b in body])


def elastic_events(events: list[Event]) -> list[dict]:
    """The job's ``elastic.scaled`` events, oldest first: ``{"time", "step", "old_replicas",
    "new_replicas", "old_accumulation_steps", "accumulation_steps", "global_batch_size",
    "effective_batch", "old_lr", "lr", "lr_rule"}`` (their data; see docs/events.md)."""
    keys = ("step", "old_replicas", "new_replicas", "old_accumulation_steps", "accumulation_steps",
            "global_batch_size", "effective_batch", "old_lr", "lr", "lr_rule")
    return [{"time": e.time, **{k: e.data.get(k) for k in keys}}
            for e in sorted(events, key=lambda e: e.time) if e.kind == "elastic.scaled"]


def format_elastic(events: list[Event], since: float | None = None) -> str:
    """The ``elastic.scaled`` events (from ``since``, epoch s) as one line each: replicas, gradient
    accumulation, global batch and learning rate before and after."""
    rows = [r for r in elastic_events(events) if since is None or r["time"] >= since]
    if not rows:
        return "no elastic.scaled events"
    return "\n".join(
        f"step {r['step']}: replica groups {r['old_replicas']} -> {r['new_replicas']}, gradient accumulation "
        f"{r['old_accumulation_steps']} -> {r['accumulation_steps']} micro-batches, global batch "
        f"{r['global_batch_size']} kept (effective {r['effective_batch']}), lr {r['old_lr']:g} -> {r['lr']:g} "
        f"(rule {r['lr_rule']})" for r in rows)


def flagship_verdict(rows: list[dict], statuses: dict[str, str] | None = None,
                     elastic: list[dict] | None = None) -> tuple[bool, str]:
    """The demo's rule: every job completed, the checkpointless row read 0 bytes from storage and
    its downtime is lower than checkpoint-restart's, and (when ``elastic`` is given) the
    checkpointless job scaled 2 -> 1 -> 2 replica groups. Returns ``(ok, reason)``."""
    bad = [f"{j} is {s}" for j, s in (statuses or {}).items() if s != "completed"]
    if bad:
        return False, "not every job completed: " + "; ".join(bad)
    by = {r["mode"]: r for r in rows}
    if set(by) != {"restart", "checkpointless"}:
        return False, f"need one checkpoint-restart and one checkpointless job, got {sorted(by)}"
    cl, cr = by["checkpointless"], by["restart"]
    if cl["storage_read_bytes"] != 0:
        return False, f"checkpointless recovery read {human_bytes(cl['storage_read_bytes'])} from storage (expected 0)"
    if not cl["downtime_s"] < cr["downtime_s"]:
        return False, (f"checkpointless downtime {cl['downtime_s']:.2f} s is not lower than checkpoint-restart's "
                       f"{cr['downtime_s']:.2f} s")
    if elastic is not None:
        seq = [(r["old_replicas"], r["new_replicas"]) for r in elastic]
        if (2, 1) not in seq or (1, 2) not in seq[seq.index((2, 1)):]:
            return False, f"the checkpointless job did not scale 2 -> 1 -> 2 replica groups: {seq}"
    return True, (f"checkpointless: {cl['downtime_s']:.2f} s downtime, {cl['steps_lost']} steps lost, 0 bytes read "
                  f"from storage; checkpoint-restart: {cr['downtime_s']:.2f} s, {cr['steps_lost']} steps lost, "
                  f"{human_bytes(cr['storage_read_bytes'])} read")


def execute_notebook(path: str, timeout_s: float, cwd: str | None = None):
    """Run every cell of a notebook in a fresh kernel; return the executed notebook.
    Raises nbclient's CellExecutionError on the first failing cell."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=int(timeout_s), kernel_name="python3",
                   resources={"metadata": {"path": cwd or os.path.dirname(os.path.abspath(path))}}).execute()
    return nb


def _flagship_jobs(records) -> dict[str, object]:
    """The newest flagship job of each mode among ``records`` (by the flagship's job names)."""
    out = {}
    for mode, name in FLAGSHIP_NAMES.items():
        mine = sorted((r for r in records if r.name == name), key=lambda r: r.submitted_at)
        if mine:
            out[mode] = mine[-1]
    return out


def flagship_report(client, restart_job: str, checkpointless_job: str, since: float | None = None,
                    statuses: dict[str, str] | None = None) -> tuple[bool, str]:
    """The flagship's result as text (the notebook's last cell and ``hyperpod-lab demo`` print it):
    the side-by-side table of the injected fault (:func:`compare_recoveries`), the checkpointless
    job's ``elastic.scaled`` events from ``since`` (epoch s; default: after the first incident),
    and the verdict (:func:`flagship_verdict`). Returns ``(ok, text)``."""
    rows = compare_recoveries(client, restart_job, checkpointless_job)
    events = client.event_reader(checkpointless_job).poll()
    if since is None:  # the node loss and the scale-up: after the injected fault's incident closed
        from hyperpod_lab.fold.facts import fold

        incs = fold(events).incidents
        since = incs[1]["detected_at"] if len(incs) > 1 and incs[1]["detected_at"] else float("inf")
    scaled = [r for r in elastic_events(events) if r["time"] >= since - 1.0]
    ok, reason = flagship_verdict(rows, statuses, scaled)
    text = "\n".join([
        f"Same script (train_lm.py), steps, nodes and fault (SIGKILL of rank 1 requested once step {FAULT_STEP} was "
        f"done; checkpoints every {CHECKPOINT_EVERY} steps):",
        format_comparison(rows), "",
        "Elastic scaling of the checkpointless job (a node lost, then `hyperpod-lab scale --add-nodes 1`):",
        format_elastic(events, since - 1.0), "",
        ("PASS: " if ok else "FAIL: ") + reason])
    return ok, text


def run_demo(notebook: str, say: Callable[[str], None], timeout_s: float = 900.0,
             flagship: str | None = "") -> int:
    """Run ``notebook``, then the flagship notebook, headless against the dev cluster, printing
    the jobs' events live, a summary per job and the flagship's comparison.

    Args:
        notebook: the first notebook (``examples/quickstart.ipynb``).
        say: prints one line.
        timeout_s: seconds per notebook.
        flagship: the flagship notebook; ``""`` (default): ``flagship.ipynb`` beside ``notebook``
            when it exists; None: none.

    Returns:
        0 when every notebook ran, every job it submitted completed and the flagship's verdict
        (:func:`flagship_verdict`: checkpointless read 0 bytes from storage and had the lower
        downtime, the job scaled 2 -> 1 -> 2) holds; else 1, with the reason printed last.
    """
    from hyperpod_lab import devcluster
    from hyperpod_lab.submit.client import Client, summarize

    if not os.path.isfile(notebook):
        raise HyperPodLabError(f"notebook {notebook} not found; run the demo from the hyperpod-lab checkout "
                               f"or pass --notebook PATH")
    if flagship == "":
        candidate = os.path.join(os.path.dirname(os.path.abspath(notebook)), "flagship.ipynb")
        flagship = candidate if os.path.isfile(candidate) and os.path.abspath(notebook) != candidate else None
    notebooks = [notebook] + ([flagship] if flagship else [])
    t0 = time.time()
    say("== dev cluster")
    devcluster.up()
    client = Client()
    before = {r.job_id for r in client.store.list()}
    readers, events, done, last_step_line = {}, {}, set(), {}
    errors: list[str] = []

    def pump() -> None:
        for rec in client.store.list():
            if rec.job_id not in before and rec.job_id not in readers:
                readers[rec.job_id] = client.event_reader(rec.job_id)
                events[rec.job_id] = []
                say(f"-- job {rec.job_id} on {rec.cluster} ({rec.orchestrator} {rec.native_id})")
        for jid, reader in readers.items():
            for ev in reader.poll():
                events[jid].append(ev)
                if ev.kind == "step" and time.time() - last_step_line.get(jid, 0.0) < 1.0:
                    continue  # step events: at most one line per second per job
                if ev.kind == "step":
                    last_step_line[jid] = time.time()
                prefix = f"[{jid[:28]}] "
                say(prefix + event_line(ev, width=MAX_LINE - len(prefix)))
                if ev.kind == "finished":
                    done.add(jid)

    for nb in notebooks:
        result: dict = {}

        def worker(path=nb, out=result):
            try:
                out["nb"] = execute_notebook(path, timeout_s)
            except Exception as e:  # reported below, with the cell's error
                out["error"] = e

        say(f"== executing {nb} headless")
        t_nb = time.time()
        th = threading.Thread(target=worker, daemon=True)
        th.start()
        while True:
            pump()
            if not th.is_alive() and set(readers) <= done:
                break
            if not th.is_alive() and time.time() - t_nb > timeout_s:
                break
            time.sleep(0.3)
        th.join()
        if "error" in result:
            errors.append(f"notebook {nb} failed: {str(result['error'])[-2000:]}")
            break
    ok = not errors
    say("== summary")
    statuses = {}
    for jid, evs in events.items():
        try:  # the runtime's 'finished' comes moments before the scheduler's own end state
            rec = client.wait(jid, timeout_s=120)
        except TimeoutError:
            rec = client.status(jid)
        statuses[jid] = rec.status
        ok = ok and rec.status == "completed"
        say(f"{jid}: {rec.status}; " + json.dumps(summarize(evs)))
    reason = "; ".join(errors) or ("" if ok else "not every job completed: " + ", ".join(
        f"{j} {s}" for j, s in statuses.items() if s != "completed"))
    jobs = _flagship_jobs([client.get(j) for j in events]) if not errors else {}
    if (flagship or jobs) and not errors:  # the flagship ran (as the second notebook or the only one)
        if set(jobs) != set(FLAGSHIP_NAMES):
            ok, reason = False, f"the flagship notebook did not submit both jobs ({sorted(FLAGSHIP_NAMES.values())})"
        else:
            say("== flagship: checkpoint-restart vs checkpointless")
            try:
                good, text = flagship_report(client, jobs["restart"].job_id, jobs["checkpointless"].job_id,
                                             statuses={r.job_id: statuses.get(r.job_id, r.status) for r in jobs.values()})
            except ValueError as e:
                good, text = False, f"FAIL: {e}"
            for line in text.splitlines():
                say(line)
            if not good:
                ok, reason = False, text.splitlines()[-1][len("FAIL: "):]
    say(f"demo wall time {time.time() - t0:.1f} s")
    if not ok:
        say(f"demo failed: {reason or 'see above'}")
    return 0 if ok else 1
