"""What the ``hyperpod-lab`` command shows people: one line per event, a progress bar and a summary.

* :func:`event_line`: an event as one line of at most :data:`MAX_LINE` characters (ellipsised),
  ``HH:MM:SS kind text``, with a one-line text per :class:`~hyperpod_lab.events.EventKind` that
  names the fields that matter (docs/events.md), e.g. a ``health.checked`` as ``n1 passed: gpu
  skipped, shm 23.5 GiB free, storage 1.9 ms, clock +6.7 ms``. Control characters in event data
  (a script's metric names, a fault's reason) are shown as spaces, never sent to the terminal.
* :class:`EventView`: a followed job's events. On a terminal (a ``rich`` Console), a progress
  bar (step/total, steps/s, ETA) under the event lines, and a summary table at the end; anywhere
  else plain lines (steps with their total and ETA) and the summary as ``summary: ...`` lines.
  With ``json_lines`` each event is its JSON line (:meth:`Event.to_json`) and nothing else.
* :func:`summary_rows`: a job's summary (faults, recoveries, downtime, checkpoints, goodput) as
  ``(name, value)`` rows, from the one job facts fold (:mod:`hyperpod_lab.fold.facts`) and the
  goodput measurement (:func:`hyperpod_lab.goodput.measure.measure_from_events`).

Terminal output uses ``rich`` (https://github.com/Textualize/rich): ``Progress``, ``Table``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable, TextIO

from hyperpod_lab.events import Event, EventKind, stopped_ranks
from hyperpod_lab.fold.aggregate import KIND_TONES, JobAggregate
from hyperpod_lab.fold.facts import JobFacts
from hyperpod_lab.node.health import CHECKS, FAILED, PASSED, SKIPPED

__all__ = ["MAX_LINE", "EventView", "event_line", "event_text", "human_bytes", "human_seconds", "make_console",
           "summary_rows", "table"]

MAX_LINE = 200
"""The most characters of one event line (without ``--json``); longer ones end in ``…``."""

KIND_WIDTH = max(len(k.value) for k in EventKind)


# ---- numbers and words -------------------------------------------------------------------------
def human_bytes(n: Any) -> str:
    """``n`` bytes as ``512 B``, ``21.4 MiB``, ``1.2 GiB`` (binary units); ``unknown`` for None."""
    if n is None or isinstance(n, bool) or not isinstance(n, (int, float)):
        return "unknown"
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    return str(n)


def human_seconds(s: Any) -> str:
    """Seconds as ``1.9 ms``, ``2.47 s``, ``4 min 05 s``, ``2 h 03 min``; ``?`` when not a number."""
    if s is None or isinstance(s, bool) or not isinstance(s, (int, float)):
        return "?"
    if abs(s) < 1:
        return f"{s * 1000:.1f} ms"
    if abs(s) < 100:
        return f"{s:.2f} s" if abs(s) < 10 else f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def _eta(s: float | None) -> str:
    """Seconds left as ``H:MM:SS`` (``?`` unknown)."""
    if s is None or s != s or s < 0:
        return "?"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}"


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.0f}" if 1e4 <= abs(v) < 1e15 else f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_num(x) for x in v)
    return _clean(v)


def _clean(v: Any) -> str:
    """``str(v)`` on one line: what is not printable (control characters: escape sequences, new
    lines; line and paragraph separators) becomes a space, runs of white space one space."""
    s = str(v)
    if s.isprintable():
        return s
    return " ".join("".join(c if c.isprintable() else " " for c in s).split())


def _plural(n: Any, word: str) -> str:
    return f"{_num(n)} {word}" + ("" if n == 1 else "s")


def _ranks(r: Any) -> str:
    if isinstance(r, (list, tuple)):
        return ("rank " if len(r) == 1 else "ranks ") + ", ".join(_num(x) for x in r)
    return f"rank {_num(r)}"


def _who(d: dict) -> str:
    """``rank 0 on n1`` / ``ranks 2, 3 on n2`` / ``n2`` from an event's rank and node."""
    parts = []
    if d.get("rank") is not None:
        parts.append(_ranks(d["rank"]))
    elif d.get("ranks"):  # the EKS operator's list of faulty ranks
        parts.append(_ranks(d["ranks"]))
    if d.get("node") is not None:
        parts.append(("on " if parts else "") + _clean(d["node"]))
    return " ".join(parts)


def _join(*parts: Any) -> str:
    return ", ".join(str(p) for p in parts if p)


# ---- one line per kind ---------------------------------------------------------------------------
def _submitted(d: dict) -> str:
    shape = ""
    if d.get("nodes") is not None:
        shape = _plural(d["nodes"], "node")
        if d.get("procs_per_node") is not None:
            shape += f" x {_num(d['procs_per_node'])}"
        if d.get("world_size") is not None:
            shape += f" = {_plural(d['world_size'], 'rank')}"
    where = f" to {_clean(d['cluster'])}" if d.get("cluster") else ""
    native = f" (job {_clean(d['native_id'])})" if d.get("native_id") is not None else ""
    return f"{_clean(d.get('name', 'job'))}{where}{native}" + (f": {shape}" if shape else "")


def _started(d: dict) -> str:
    text = _plural(d.get("world_size", "?"), "rank")
    if d.get("nodes") is not None:
        text += f" on {_plural(d['nodes'], 'node')}"
    if d.get("script"):
        text += f": {os.path.basename(_clean(d['script']))}"
    if d.get("restart_count"):
        text += f" (restart {_num(d['restart_count'])})"
    return text


_STEP_FIELDS = ("step", "loss", "steps_per_s", "total_steps")


def _metric(k: str, v: Any) -> str:
    name = _clean(k)
    if name.endswith("_per_s"):
        return f"{_num(v)} {name[:-6]}/s"
    return f"{name} {_num(v)}"


def _step(d: dict, total: int | None = None) -> str:
    total = d.get("total_steps") if d.get("total_steps") is not None else total
    step = d.get("step")
    head = f"step {_num(step)}" + (f"/{_num(total)}" if total is not None else "")
    parts = [f"loss {_num(d['loss'])}" if d.get("loss") is not None else "",
             f"{d['steps_per_s']:.3g} steps/s" if isinstance(d.get("steps_per_s"), (int, float)) else ""]
    parts += [_metric(k, v) for k, v in sorted(d.items()) if k not in _STEP_FIELDS and v is not None]
    return _join(head, *parts)


def _tier_step(d: dict) -> str:
    text = _clean(d.get("tier", "?"))
    if d.get("step") is not None:
        text += f" step {_num(d['step'])}"
    return text


def _checkpoint_saved(d: dict) -> str:
    head = _tier_step(d)
    who = _who(d)
    if d.get("of_rank") is not None:
        who = _join(who, f"copy of rank {_num(d['of_rank'])}")
    elif d.get("of_ranks"):  # a node's one peer event (node_saves)
        who = _join(who, f"copies of {_ranks(d['of_ranks'])}")
    timing = f"{human_bytes(d.get('bytes'))} in {human_seconds(d.get('total_s'))}"
    if d.get("blocked_s") is not None:
        timing += f" ({human_seconds(d['blocked_s'])} blocking)"
    extra = [f"{_num(d['attempts'])} attempts" if (d.get("attempts") or 0) > 1 else ""]
    if d.get("tier") == "s3" and d.get("path"):
        extra.append(_clean(d["path"]))
    return f"{head}" + (f" ({who})" if who else "") + ": " + _join(timing, *extra)


def _checkpoint_restored(d: dict) -> str:
    head = _tier_step(d)
    if d.get("tier") == "replica":
        where = _join(f"replica group {_num(d['replica_group'])}" if d.get("replica_group") is not None else "",
                      f"on {_clean(d['node'])}" if d.get("node") else "")
        return f"{head}: {where} healed from a live peer" if where else f"{head}: healed from a live peer"
    who = _who(d)
    if d.get("from_rank") is not None:
        who = _join(who, f"from rank {_num(d['from_rank'])}" + (f" on {_clean(d['from_node'])}"
                                                                 if d.get("from_node") else ""))
    timing = f"{human_bytes(d.get('bytes'))} in {human_seconds(d.get('seconds'))}"
    extra = []
    if d.get("read_bytes") is not None:
        extra.append(f"{human_bytes(d['read_bytes'])} read from storage")
    if d.get("tier") == "s3" and d.get("path"):
        extra.append(_clean(d["path"]))
    return head + (f" ({who})" if who else "") + ": " + _join(timing, *extra)


def _checkpoint_corrupt(d: dict) -> str:
    return f"{_tier_step(d)} skipped: {_clean(d.get('reason', '?'))}" + (
        f" ({_clean(d['path'])})" if d.get("path") else "")


def _checkpoint_failed(d: dict) -> str:
    attempt = f" attempt {_num(d['attempt'])}" if d.get("attempt") is not None else ""
    if d.get("will_retry"):
        then = f"retry in {human_seconds(d.get('retry_in_s'))}"
    elif d.get("will_retry") is False:
        then = "no retry; training goes on"
    else:
        then = ""
    return f"{_tier_step(d)}{attempt} failed: " + _join(_clean(d.get("reason", "?")), then)


def _fault_detected(d: dict) -> str:
    reason = _clean(d.get("reason", "?"))
    if reason == "hang":
        where = f" in {_clean(d['section'])}" if d.get("section") else ""
        at = f" at step {_num(d['step'])}" if d.get("step") is not None else ""
        limit = ""
        if d.get("hang_timeout_s") is not None:
            limit = f" (timeout {human_seconds(d['hang_timeout_s'])}" + (
                f", {_clean(d['timeout_source'])})" if d.get("timeout_source") else ")")
        return f"{_who(d)} hung: no progress for {human_seconds(d.get('stalled_s'))}{where}{at}{limit}"
    if reason == "node down":
        state = f" (Slurm {_clean(d['slurm_state'])})" if d.get("slurm_state") else ""
        ranks = f", {_ranks(d['rank'])}" if d.get("rank") is not None else ""
        group = f", replica group {_num(d['replica_group'])}" if d.get("replica_group") is not None else ""
        return f"node {_clean(d.get('node', '?'))} down{state}{ranks}{group}"
    who = _who(d)
    if d.get("replica_group") is not None:
        who = _join(who, f"replica group {_num(d['replica_group'])}")
    extra = []
    if d.get("detected_by") and d.get("detection_s") is not None:
        extra.append(f"detected by {_clean(d['detected_by'])} in {human_seconds(d['detection_s'])}")
    if d.get("root_cause") is False:
        extra.append("not the root cause")
    stopped = stopped_ranks(d)
    if stopped:  # the siblings its agent stopped
        extra.append(f"its agent stopped {_ranks(stopped[:64])}")
    return f"{who or 'job'}: {reason}" + (f" ({'; '.join(extra)})" if extra else "")


def _recovery_started(d: dict) -> str:
    head = f"restart {_num(d.get('restart_count', '?'))}"
    if d.get("node"):
        head += f" on {_clean(d['node'])}"
    return head + (f": {_clean(d['reason'])}" if d.get("reason") else "")


def _recovery_completed(d: dict) -> str:
    downtime = f"downtime {human_seconds(d['downtime_s'])}" if d.get("downtime_s") is not None else ""
    if d.get("mode") == "checkpointless":
        lost = d.get("lost_replica_groups")
        return _join(f"checkpointless: step {_num(d.get('resumed_step', '?'))} redone with "
                     f"{_plural(d.get('replicas', '?'), 'replica')}",
                     f"lost replica groups {_num(lost)}" if lost else "", downtime)
    head = f"restart {_num(d['restart_count'])}: " if d.get("restart_count") is not None else ""
    if "restored_step" in d and d["restored_step"] is None and d.get("restored_from") is None:
        restored = "running again"  # the EKS operator's report: pods back, no step yet
    else:
        restored = f"step {_num(d.get('restored_step', '?'))} restored from {_clean(d.get('restored_from', '?'))}"
    return head + _join(restored, downtime)


def _recovery_fallback(d: dict) -> str:
    return (f"replica group {_num(d.get('replica_group', '?'))}: no live replica, restored "
            f"{_tier_step(d)}" + (f": {_clean(d['reason'])}" if d.get("reason") else ""))


def _elastic_scaled(d: dict) -> str:
    def change(name: str, old: str, new: str, fmt: Callable[[Any], str] = _num) -> str:
        if d.get(new) is None:
            return ""
        return f"{name} {fmt(d[old])} -> {fmt(d[new])}" if d.get(old) is not None else f"{name} {fmt(d[new])}"

    lr = change("lr", "old_lr", "lr")
    if lr and d.get("lr_rule"):
        lr += f" ({_clean(d['lr_rule'])})"
    return _join(f"at step {_num(d['step'])}" if d.get("step") is not None else "",
                 change("nodes", "old_nodes", "new_nodes"), change("ranks", "old_world_size", "new_world_size"),
                 change("replicas", "old_replicas", "new_replicas"),
                 change("accumulation", "old_accumulation_steps", "accumulation_steps"),
                 f"global batch {_num(d['global_batch_size'])}" if d.get("global_batch_size") is not None else "", lr)


def _health_check(name: str, c: dict) -> str:
    """One check of a ``health.checked`` event: ``shm 23.5 GiB free``; '' for nothing to say."""
    status = c.get("status")
    if status == FAILED:
        return f"{name} FAILED: {_clean(c.get('detail', ''))}"
    if status == SKIPPED:
        return "" if name == "versions" else f"{name} skipped"  # versions: none expected (found ones in --json)
    if status != PASSED:
        return f"{name} {_clean(status)}"
    if name == "gpu" and c.get("visible") is not None:
        return f"gpu {_num(c['visible'])} visible"
    if name == "shm" and c.get("free_bytes") is not None:
        return f"shm {human_bytes(c['free_bytes'])} free"
    if name == "storage" and c.get("write_s") is not None:
        return f"storage {human_seconds(c['write_s'])}"
    if name == "clock" and isinstance(c.get("skew_s"), (int, float)):
        return f"clock {c['skew_s'] * 1000:+.1f} ms"
    if name == "versions" and isinstance(c.get("versions"), dict) and c["versions"].get("torch"):
        return f"torch {_clean(c['versions']['torch'])}"
    return f"{name} passed"


def _health_checked(d: dict) -> str:
    checks = d.get("checks") if isinstance(d.get("checks"), dict) else {}
    # failures first, then node.health's order (gpu, shm, storage, versions, clock), unknown checks last
    order = {n: i for i, n in enumerate(CHECKS)}
    items = sorted(((n, c) for n, c in checks.items() if isinstance(c, dict)),
                   key=lambda nc: (nc[1].get("status") != FAILED, order.get(nc[0], len(order)), str(nc[0])))
    verdict = "passed" if d.get("ok") else "FAILED"
    text = ", ".join(filter(None, (_health_check(_clean(n), c) for n, c in items)))
    return f"{_clean(d.get('node', '?'))} {verdict}" + (f": {text}" if text else "")


def _health_failed(d: dict) -> str:
    return f"{_clean(d.get('node', '?'))} {_clean(d.get('check', '?'))} failed: {_clean(d.get('detail', ''))}"


def _node_excluded(d: dict) -> str:
    faults = f" ({_plural(d['faults'], 'fault')})" if d.get("faults") is not None else ""
    excluded = f"; excluded now: {_num(d['excluded'])}" if d.get("excluded") else ""
    return f"{_clean(d.get('node', '?'))}: {_clean(d.get('reason', '?'))}{faults}{excluded}"


def _straggler_detected(d: dict) -> str:
    score = f"{d['score']:.2f}x" if isinstance(d.get("score"), (int, float)) else "?x"
    vs = ""
    if d.get("step_s") is not None and d.get("median_step_s") is not None:
        vs = f" (step {human_seconds(d['step_s'])} vs {human_seconds(d['median_step_s'])})"
    at = f" at step {_num(d['step'])}" if d.get("step") is not None else ""
    action = f": {_clean(d['action'])}" if d.get("action") else ""
    return f"{_who(d)} {score} slower than the others{vs}{at}{action}"


def _job_failed(d: dict) -> str:
    head = _join(f"after {_plural(d['restarts'], 'restart')}" if d.get("restarts") is not None else "",
                 _clean(d["criterion"]) if d.get("criterion") else "",
                 f"exit {_num(d['exit_code'])}" if d.get("exit_code") is not None else "",
                 "no requeue" if d.get("requeue") is False else "")
    return (f"{head}: " if head else "") + _clean(d.get("reason", "?"))


def _finished(d: dict) -> str:
    parts = [_clean(d.get("status", "?"))]
    rest = [_plural(d["steps"], "step") if d.get("steps") is not None else "",
            f"final loss {_num(d['final_loss'])}" if d.get("final_loss") is not None else "",
            f"eval loss {_num(d['eval_loss'])}" if d.get("eval_loss") is not None else "",
            f"exit {_num(d['exit_code'])}" if d.get("exit_code") not in (None, 0) else "",
            _clean(d["reason"]) if d.get("reason") else ""]
    rest = _join(*rest)
    return parts[0] + (f": {rest}" if rest else "")


_TEXT: dict[str, Callable[[dict], str]] = {
    EventKind.SUBMITTED.value: _submitted,
    EventKind.STARTED.value: _started,
    EventKind.STEP.value: _step,
    EventKind.CHECKPOINT_SAVED.value: _checkpoint_saved,
    EventKind.CHECKPOINT_RESTORED.value: _checkpoint_restored,
    EventKind.CHECKPOINT_CORRUPT.value: _checkpoint_corrupt,
    EventKind.CHECKPOINT_FAILED.value: _checkpoint_failed,
    EventKind.FAULT_DETECTED.value: _fault_detected,
    EventKind.RECOVERY_STARTED.value: _recovery_started,
    EventKind.RECOVERY_COMPLETED.value: _recovery_completed,
    EventKind.RECOVERY_FALLBACK.value: _recovery_fallback,
    EventKind.ELASTIC_SCALED.value: _elastic_scaled,
    EventKind.HEALTH_CHECKED.value: _health_checked,
    EventKind.HEALTH_FAILED.value: _health_failed,
    EventKind.NODE_EXCLUDED.value: _node_excluded,
    EventKind.STRAGGLER_DETECTED.value: _straggler_detected,
    EventKind.JOB_FAILED.value: _job_failed,
    EventKind.FINISHED.value: _finished,
}


def _generic(d: dict) -> str:
    return " ".join(f"{_clean(k)}={_num(v)}" for k, v in sorted(d.items()))


def event_text(ev: Event, total_steps: int | None = None) -> str:
    """The kind-specific part of :func:`event_line` (no time, no kind, no length limit).

    A kind's text names its fields that matter (docs/events.md); an event whose data lacks what
    its kind's text needs (an older writer, another backend) shows its fields as ``key=value``.
    """
    d = ev.data if isinstance(ev.data, dict) else {}
    fn = _TEXT.get(ev.kind, _generic)
    try:
        text = fn(d, total_steps) if fn is _step else fn(d)
    except (KeyError, TypeError, ValueError, AttributeError):
        return _generic(d)
    # a report written on the job's behalf (the EKS backend's translation of the operator's status)
    return f"{text} ({_clean(d['source'])})" if fn is not _generic and d.get("source") else text


def _ellipsis(s: str, width: int) -> str:
    return s if len(s) <= width else s[:width - 1] + "…"


def event_line(ev: Event, total_steps: int | None = None, *, suffix: str = "", width: int = MAX_LINE) -> str:
    """One event as one line of at most ``width`` characters: ``HH:MM:SS kind text`` (local time).

    Args:
        ev: the event.
        total_steps: the job's total steps, shown in a ``step`` line as ``step 12/25``.
        suffix: text appended to the line (the follower's ``ETA 0:00:04``).
        width: the most characters (default :data:`MAX_LINE`); a longer line ends in ``…``.

    Returns:
        The line, no new line at its end, no control characters.
    """
    text = event_text(ev, total_steps)
    if suffix:
        text = _join(text, suffix)
    t = time.strftime("%H:%M:%S", time.localtime(ev.time))
    return _ellipsis(f"{t} {_clean(ev.kind):<{KIND_WIDTH}} {text}".rstrip(), width)


# ---- the summary ---------------------------------------------------------------------------------
def summary_rows(events: Iterable[Event], facts: JobFacts | None = None) -> list[tuple[str, str]]:
    """A job's summary as ``(name, value)`` rows: status, steps, loss, wall time, faults, the
    nodes (per node, as the Lab's lanes: ``256 nodes x 8 ranks; faults on n167 (rank 1337)``,
    :meth:`hyperpod_lab.fold.aggregate.JobAggregate.nodes_line`; one row whatever the rank
    count), recoveries and their downtime, checkpoints per tier, pre-flight runs, excluded
    nodes, stragglers, a restart storm's failure, and the measured goodput when the job made steps.

    Args:
        events: the job's events (any order).
        facts: their fold (:func:`hyperpod_lab.fold.facts.fold`), when the caller has it.
    """
    events = list(events)
    if facts is None:
        from hyperpod_lab.fold.facts import fold

        facts = fold(events)
    rows: list[tuple[str, str]] = []
    rows.append(("status", _clean(facts.status) if facts.status else "no 'finished' event yet"))
    steps = f"{facts.steps}" + (f" of {facts.total_steps}" if facts.total_steps is not None else "")
    rows.append(("steps", f"{steps} in {human_seconds(facts.wall_s)}"))
    if facts.first_loss is not None:
        last = facts.final_loss if facts.final_loss is not None else facts.last_loss
        evals = [e.data.get("eval_loss") for e in events if e.kind == EventKind.FINISHED.value]
        rows.append(("loss", f"{_num(facts.first_loss)} -> {_num(last)}"
                     + (f" (eval {_num(evals[-1])})" if evals and evals[-1] is not None else "")))
    faults = f"{facts.faults}"
    if facts.fault_events != facts.faults:
        faults += f" ({_plural(facts.fault_events, 'report')})"
    rows.append(("faults", faults))
    agg = JobAggregate(max_buckets=16)
    for e in events:
        agg.fold(e)
    nodes = agg.nodes_line()
    if nodes:
        rows.append(("nodes", nodes))
    known = [d for d in facts.downtimes_s if d is not None]
    rec = f"{facts.recoveries}"
    if known:
        rec += f", downtime {human_seconds(sum(known))}"
        if len(known) > 1:
            rec += f" ({', '.join(human_seconds(d) for d in known)})"
    rows.append(("recoveries", rec))
    saved: dict[str, int] = {}
    for e in events:
        if e.kind == EventKind.CHECKPOINT_SAVED.value:
            tier = _clean(e.data.get("tier", "?"))
            saved[tier] = saved.get(tier, 0) + 1
    ck = f"{facts.checkpoints} saved" + (f" ({', '.join(f'{t} {n}' for t, n in saved.items())})" if saved else "")
    rows.append(("checkpoints", f"{ck}, {facts.restores} restored"))
    if facts.preflight_runs:
        failed = sorted({n for r in facts.preflight_runs for n in r.get("failed") or []})
        rows.append(("pre-flight", f"{_plural(len(facts.preflight_runs), 'run')}, {human_seconds(facts.preflight_s)}"
                     + (f", failed: {', '.join(_clean(n) for n in failed)}" if failed else "")))
    if facts.excluded_nodes:
        rows.append(("excluded nodes", "; ".join(f"{_clean(x['node'])} ({_clean(x.get('reason'))})"
                                                  for x in facts.excluded_nodes)))
    if facts.straggle_steps:
        rows.append(("stragglers", f"{human_seconds(facts.straggle_s)} lost over {facts.straggle_steps} steps"))
    if facts.failure:
        rows.append(("failure", _clean(facts.failure.get("reason", "?"))))
    if facts.steps:
        from hyperpod_lab.errors import GoodputInputError
        from hyperpod_lab.goodput.measure import measure_from_events

        try:
            m = measure_from_events(events)
        except GoodputInputError:
            m = {}
        if isinstance(m.get("goodput"), (int, float)):
            lost = sorted(((v, k) for k, v in (m.get("lost_s") or {}).items() if v and v > 0), reverse=True)[:3]
            rows.append(("goodput", f"{m['goodput'] * 100:.1f} %" + (
                f" (step time {human_seconds(m.get('step_time_s'))}; lost: "
                + ", ".join(f"{k.replace('_', ' ')} {human_seconds(v)}" for v, k in lost) + ")" if lost else "")))
    return rows


def table(rows: list[list[Any]], header: list[str]) -> str:
    """Rows as a plain fixed-width text table under ``header`` (columns two spaces apart)."""
    rows = [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header)] + [fmt.format(*r) for r in rows])


# ---- following a job -----------------------------------------------------------------------------
def make_console(out: TextIO, console=None):
    """The ``rich`` Console to draw on: ``console`` when given, else one on ``out`` when ``out`` is
    a terminal (``isatty()``), else None (plain lines: a pipe, a file, a notebook's output)."""
    if console is not None:
        return console
    isatty = getattr(out, "isatty", None)
    if not (callable(isatty) and isatty()):
        return None
    from rich.console import Console

    return Console(file=out, force_jupyter=False, highlight=False)


#: the rich style of each tone of :data:`hyperpod_lab.fold.aggregate.KIND_TONES` (the notebook widget colours the same tones)
_TONE_STYLES = {"fault": "bold red", "job-failed": "bold red", "failed": "red", "warning": "yellow", "excluded": "yellow", "recovering": "cyan",
                "recovered": "green", "checkpoint": "dim", "restore": "dim", "end": "bold"}


class EventView:
    """Shows a followed job's events as they arrive, then its summary.

    Use as a context manager (the progress bar is drawn while inside), calling :meth:`show` per
    event and :meth:`summary` at the end.

    Args:
        say: writes one plain line (the CLI's ``say``).
        console: a ``rich`` Console (:func:`make_console`): a progress bar with the steps done of the
            total (``12/30 steps``), steps/s (the newest ``step`` event's ``steps_per_s``) and the ETA
            (the steps left at that rate) under the event lines (``step`` events move the bar instead of
            printing a line),
            and a summary table. None: plain lines, a ``step`` line with ``ETA H:MM:SS`` when the
            total is known, and ``summary: ...`` lines.
        spec: the job's JobSpec dict, for the total steps (its script's ``--steps N``; a ``step``
            event's ``total_steps`` metric wins).
        json_lines: each event as its JSON line, nothing else (``--json``).
    """

    def __init__(self, say: Callable[[str], None], console=None, spec: dict | None = None, json_lines: bool = False):
        self.say, self.console, self.json_lines = say, (None if json_lines else console), json_lines
        self.facts = JobFacts(spec=spec)
        self.events: list[Event] = []
        self.rate: float | None = None
        self._progress = self._task = None
        self._fields: dict | None = None

    def __enter__(self) -> "EventView":
        if self.console is not None:
            from rich.progress import BarColumn, Progress, TextColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[steps]}"),
                                      TextColumn("•"), TextColumn("{task.fields[rate]}"), TextColumn("•"),
                                      TextColumn("ETA {task.fields[eta]}"), console=self.console, refresh_per_second=4)
            self._progress.start()
            self._task = self._progress.add_task("waiting", total=self.facts.total_steps, steps="- steps",
                                                 rate="- steps/s", eta="?")
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def eta_s(self) -> float | None:
        """Seconds to the last step at the newest known rate, or None (total or rate unknown)."""
        f = self.facts
        if f.total_steps is None or f.step is None or not self.rate:
            return None
        return max(0, f.total_steps - (f.step + 1)) / self.rate

    def show(self, ev: Event) -> None:
        """Fold ``ev`` into the job's facts and show it."""
        self.events.append(ev)
        self.facts.update(ev)
        if self.json_lines:
            self.say(ev.to_json())
            return
        is_step = ev.kind == EventKind.STEP.value
        if is_step and isinstance(ev.data.get("steps_per_s"), (int, float)) and ev.data["steps_per_s"] > 0:
            self.rate = float(ev.data["steps_per_s"])
        total = self.facts.total_steps
        if self._progress is None:
            eta = f"ETA {_eta(self.eta_s())}" if is_step and total is not None and self.rate else ""
            self.say(event_line(ev, total, suffix=eta))
            return
        self._update_bar(ev)
        if not is_step:
            from rich.text import Text

            text = Text(event_line(ev, total), no_wrap=True, overflow="ellipsis")
            style = _TONE_STYLES.get(KIND_TONES.get(ev.kind, ""), "dim" if ev.kind.startswith("checkpoint.") else "")
            text.stylize(style, 9, 9 + KIND_WIDTH)
            self._progress.console.print(text)

    def _update_bar(self, ev: Event) -> None:
        f = self.facts
        done = (f.step + 1) if f.step is not None else 0
        if ev.kind == EventKind.RECOVERY_STARTED.value:
            what = "recovering"
        elif ev.kind == EventKind.FINISHED.value:
            what = _clean(ev.data.get("status", "finished"))
        elif f.step is not None:
            what = f"loss {_num(f.loss)}" if f.loss is not None else "running"
        else:
            what = "starting" if f.started_time is not None else "waiting"
        total = f.total_steps
        fields = dict(completed=done, total=total, description=what,
                      steps=f"{done}" + (f"/{total}" if total is not None else "") + " steps",  # done, not the index
                      rate=f"{self.rate:.3g} steps/s" if self.rate else "- steps/s", eta=_eta(self.eta_s()))
        # drawn again only when it changed (a step: at most one a second), so the lines printed under
        # it never show a stale bar, and a replay of many events does not draw it for each
        changed = fields != self._fields
        self._fields = fields
        self._progress.update(self._task, refresh=changed, **fields)

    def summary(self) -> list[tuple[str, str]]:
        """Show the summary (a table on a console, else ``summary: <status>`` then one line per
        row); nothing with ``json_lines``. Returns the rows."""
        if self.json_lines:
            return []
        rows = summary_rows(self.events, self.facts)
        if self.console is None:
            self.say(f"summary: {rows[0][1]}")
            for line in table([list(r) for r in rows[1:]], ["", ""]).splitlines()[1:]:
                self.say("  " + line.rstrip())
            return rows
        from rich.table import Table

        t = Table(title="summary", show_header=False, title_justify="left")
        t.add_column(style="bold")
        t.add_column()
        for name, value in rows:
            t.add_row(name, value)
        self.console.print(t)
        return rows
