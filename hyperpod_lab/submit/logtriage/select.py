"""Which ranks a triage view reads, whatever the job's size (issue 27, item 4).

A view of a job of thousands of ranks never opens every rank's files: it reads the *failing*
ranks, named by the job's ``fault.detected`` events (the first failure first, in the order
:func:`fault_order` gives), and a small fixed sample of *healthy* ranks for contrast
(:func:`healthy_sample`: :data:`SAMPLE_HEALTHY` ranks spread evenly over the ranks that started,
deterministic). The number of files a view opens is then bounded by
``(MAX_FAILING + SAMPLE_HEALTHY) x files per rank``, a constant, not the rank count.

The fault events come from the job's fold where a caller has one (the server's watcher folds
every event of a tracked job into its :class:`~hyperpod_lab.fold.aggregate.JobAggregate`:
:func:`faults_from_aggregate`, no file read), else from the event files themselves
(:func:`read_fault_events`, one ``read_tails`` call: one round trip to a Slurm login node).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from hyperpod_lab.errors import HyperPodLabError
from hyperpod_lab.submit.logtriage.parse import SECONDARY

SAMPLE_HEALTHY = 4  #: healthy ranks a view reads beside the failing ones, for contrast
MAX_FAILING = 4  #: failing ranks (from the fault events) a view reads, the first failure first
FAULT_EVENT_BYTES = 4 << 20  #: most bytes of each event file read to find fault.detected events
SMALL_EVENT_FILE = 1 << 20  #: rank-*.jsonl files (steps) larger than this are not read for faults
MAX_RANK_EVENT_FILES = 16  #: a job with more rank-*.jsonl files than this: none is read for faults
FAULT = "fault.detected"


def fault_order(ev: dict) -> tuple:
    """Sort key of a ``fault.detected`` event dict (``{"time", "data"}``): root causes first.

    A reason that is a consequence of another rank's failure (a peer's "connection closed by
    peer", a SIGTERM, a store timeout: :data:`~hyperpod_lab.submit.logtriage.parse.SECONDARY`)
    goes last; then those marked ``root_cause`` (each node's agent names its own root cause, by
    error-file age, so a consequence can carry it too); then the earliest (``data.detected_at``,
    else ``time``, seconds since the epoch)."""
    d = ev.get("data") or {}
    when = d.get("detected_at") or ev.get("time") or 0
    return (bool(SECONDARY.search(str(d.get("reason") or ""))), not d.get("root_cause"),
            when if isinstance(when, (int, float)) else 0)


def fault_ranks(ev: dict) -> list[int]:
    """The ranks a ``fault.detected`` event names: ``data.rank`` as an int, or a list of them
    (the checkpointless survivors' leader names a lost replica group's ranks); [] when none."""
    r = (ev.get("data") or {}).get("rank")
    rs = r if isinstance(r, list) else [r]
    return [x for x in rs if isinstance(x, int) and not isinstance(x, bool) and x >= 0]


def failing_ranks(faults: Iterable[dict], known: Iterable[int] | None = None, limit: int = MAX_FAILING) -> list[int]:
    """The ranks the fault events name, the first failure first (:func:`fault_order`), each
    once, at most ``limit``; only ranks in ``known`` (the ranks that started) when given. The
    ranks an agent stopped because another failed (``data.stopped_ranks``) come after every
    rank that failed itself."""
    ok = set(known) if known is not None else None
    out: list[int] = []
    ordered = sorted(faults, key=fault_order)
    for ranks in [fault_ranks(ev) for ev in ordered] + [stopped_ranks(ev) for ev in ordered]:
        for r in ranks:
            if r not in out and (ok is None or r in ok):
                out.append(r)
                if len(out) >= limit:
                    return out
    return out


def stopped_ranks(ev: dict) -> list[int]:
    """The ranks a node's agent stopped because the event's rank failed (an event as a dict:
    :func:`hyperpod_lab.events.stopped_ranks` of its ``data``); [] when none."""
    from hyperpod_lab.events import stopped_ranks as listed

    data = ev.get("data")
    return listed(data) if isinstance(data, dict) else []


def healthy_sample(known: list[int], failing: Iterable[int], k: int = SAMPLE_HEALTHY) -> list[int]:
    """``k`` ranks of ``known`` (ascending) that are not ``failing``, spread evenly: the ranks at
    positions ``0, n/k, 2n/k, ...`` of the healthy ones (the lowest rank always among them: rank
    0 prints most). The same job gives the same sample on every request. Ascending."""
    bad = set(failing)
    healthy = [r for r in known if r not in bad]
    n = len(healthy)
    if n <= k:
        return healthy
    return sorted({healthy[i * n // k] for i in range(k)})


def view_ranks(known: list[int], faults: Iterable[dict]) -> tuple[list[int], list[int]]:
    """``(failing, sample)``: the failing ranks of ``faults`` among ``known`` (the first failure
    first, at most :data:`MAX_FAILING`) and the healthy sample (:func:`healthy_sample`)."""
    failing = failing_ranks(faults, known)
    return failing, healthy_sample(known, failing)


def cursor_ranks(cursor: dict[str, int]) -> list[int]:
    """The ranks a log cursor's keys (``"R:source"``) name, ascending: a follow poll reads the
    ranks its first view read."""
    out = set()
    for key in cursor:
        head = key.split(":", 1)[0]
        if head.isdigit():
            out.add(int(head))
    return sorted(out)


def read_fault_events(files, job_dir: str, max_bytes: int = FAULT_EVENT_BYTES) -> list[dict]:
    """The job's ``fault.detected`` events as dicts (``hyperpod_lab.events`` schema), read in one
    :func:`~hyperpod_lab.events.read_tails` call with at most ``max_bytes`` bytes of each event
    file. The launch agents', the supervisor's and the other writers' files are read; the ranks'
    own files (``rank-*.jsonl``: mostly steps) only while the job has at most
    :data:`MAX_RANK_EVENT_FILES` of them, and each only while under :data:`SMALL_EVENT_FILE`
    bytes (a rank writes a fault itself only in a checkpointless job: at scale the server's
    fold, :func:`faults_from_aggregate`, has those). [] when the events cannot be listed."""
    from hyperpod_lab.events import RANK_WRITER_PREFIX, EventReader, events_dir

    try:
        listing = files.list_files(events_dir(job_dir))
    except (OSError, HyperPodLabError):
        return []
    rank_files = {n: s for n, s in listing.items() if n.startswith(RANK_WRITER_PREFIX)}
    many = len(rank_files) > MAX_RANK_EVENT_FILES
    # a file whose cursor is its size is not read at all
    skip = {n: s for n, s in rank_files.items() if many or s > SMALL_EVENT_FILE}
    try:
        evs = EventReader(job_dir, files, skip).poll(max_bytes=max_bytes)
    except (OSError, HyperPodLabError):
        return []
    return [json.loads(e.to_json()) for e in evs if e.kind == FAULT]


def faults_from_aggregate(agg: Any) -> list[dict]:
    """The ``fault.detected`` events a :class:`~hyperpod_lab.fold.aggregate.JobAggregate` folded,
    as event dicts (``{"kind", "time", "writer", "seq", "data": {"rank", "node", "reason",
    "root_cause"?}}``) from its lanes' marks: every writer's, the ranks' own files included, with
    no file read. A fault naming several ranks is one dict per rank."""
    out = []
    for lane in agg.lanes().values():
        for m in lane["marks"]:
            if m.get("kind") != FAULT or m.get("rank") is None:
                continue
            data = {k: m[k] for k in ("rank", "node", "reason", "root_cause") if k in m}
            out.append({"kind": FAULT, "time": m.get("t"), "writer": m.get("writer"), "seq": m.get("seq"),
                        "data": data})
    return out
