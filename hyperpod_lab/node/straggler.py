"""Straggler detection: a rank whose steps are consistently slower than the other ranks'.

Torch-free (the Slurm supervisor imports :func:`excluded_nodes`).

**What a rank reports.** Every ``ctx.step`` splits the step's wall time (``step_s``, from the end
of the previous step) into *waiting* (``wait_s``: time in collectives and synchronisation the
runtime saw: sections opened with ``wait=True``, the checkpointless quorum and all-reduce,
``ctx.watch_ddp``'s gradient all-reduce wait, ``ctx.note_wait``) and *computing* (``compute_s =
step_s - wait_s``). In synchronous data parallelism every rank's ``step_s`` is the same (they
meet in the all-reduce every step), so the slow rank shows up as more compute and less waiting
while the others wait for it. Without any measured wait (a loop whose collectives the runtime
cannot see), ``compute_s = step_s`` on every rank and no rank can stand out: that is the
approximation, documented in docs/resiliency.md.

**The score.** The launch agent of each node (:class:`StragglerDetector`, fed by the
:class:`~hyperpod_lab.node.watchdog.Watchdog` from the ranks' heartbeats, after each start's
warm-up) keeps its local ranks' last :data:`WINDOW` steps and publishes their medians every
:data:`PUBLISH_S` seconds to ``<job_dir>/stragglers/<agent>.json`` (one small file per node,
rewritten atomically; nothing per step on shared storage). A rank's score is its lower median
compute time over the window (:func:`window_median`: an observed step, so more than half the window
must be slow) divided by the median of the other ranks' median compute times (> 1:
slower). A local rank with a full window, a score of at least :data:`THRESHOLD` and at least
:data:`MIN_EXCESS_S` more compute than the others is flagged once per episode: ``straggler.detected``
{rank, node, score, step_s, median_step_s, compute_s, median_compute_s, wait_s, window, action,
threshold}. The episode ends when its score falls below :data:`CLEAR`; a later episode is
reported again. Summaries older than :data:`STALE_S` (a node that is gone) are ignored.

**Exclusion** (``resiliency.on_straggler = "exclude"``): the event says ``action: "exclude"``
and the agent writes ``<job_dir>/stragglers/exclude/<node>.json``; the Slurm supervisor reads
them (:func:`excluded_nodes`) and excludes the node like one that faulted twice
(``node.excluded`` {reason: "straggler: ..."}): a checkpointless group there is replaced by a
spare when there is one, and later placements (a restart, a requeue) avoid the node. Other
backends report the action only.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections import deque
from typing import Any, Callable

from hyperpod_lab.atomicfile import write_json_atomic
from hyperpod_lab.jobdir import JobPaths

WINDOW = 16
"""Steps per rank in the score's window."""
THRESHOLD = 1.5
"""Score (compute time over the others' median) from which a rank is a straggler."""
CLEAR = 1.2
"""Score below which a flagged rank's episode ends."""
MIN_EXCESS_S = 0.005
"""Least extra compute time (s per step) over the others' median for a flag (timer noise)."""
PUBLISH_S = 1.0
"""Seconds between two summaries of a node's ranks (and two judgements)."""
STALE_S = 30 * PUBLISH_S
"""A summary older than this (s, wall clock: 30 s, thirty publications missed: a node that is gone)
is ignored."""

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def median(values) -> float:
    """Median of a non-empty sequence of numbers. Raises ValueError when empty."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def window_median(values) -> float:
    """The lower median of a rank's window (s): the ``(n - 1) // 2``-th smallest value, always an
    observed step. A rank's window median is slow only when more than half its steps are: with
    the averaged median, a rank slowed 2x whose window is half slowed would read (1 + 2) / 2 =
    1.5x, reach :data:`THRESHOLD` and be reported as a 1.5x straggler. Raises ValueError when
    empty."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    return xs[(len(xs) - 1) // 2]


def _write_json(path: str, obj: Any) -> None:
    write_json_atomic(path, obj, mode=0o600, fsync=False)  # rewritten every PUBLISH_S


def _read_json(path: str) -> Any:
    """A regular file's JSON (no link followed, no FIFO waited on). Raises OSError, ValueError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        return json.loads(f.read(1 << 20))


def score(compute_s: float, others: list[float]) -> float | None:
    """A rank's score: ``compute_s`` over the median of ``others`` (the other ranks' median
    compute times, s); None without others or when their median is not positive."""
    if not others:
        return None
    m = median(others)
    return compute_s / m if m > 0 else None


class StragglerDetector:
    """One agent's straggler detection for its local ranks (see the module doc).

    Args:
        job_dir: the job directory (shared storage).
        writer: the agent's event writer name (its summary file is ``<writer>.json``).
        node: the node's name.
        emit: ``emit(kind, **data)``.
        action: ``"report"`` or ``"exclude"`` (``resiliency.on_straggler``).
        window, threshold, publish_s: see :data:`WINDOW`, :data:`THRESHOLD`, :data:`PUBLISH_S`.
        clock: wall-clock seconds (``time.time``).
    """

    def __init__(self, job_dir: str, writer: str, node: str, emit: Callable[..., Any], *, action: str = "report",
                 window: int = WINDOW, threshold: float = THRESHOLD, publish_s: float = PUBLISH_S,
                 clock: Callable[[], float] = time.time):
        self.job_dir, self.writer, self.node, self.emit = job_dir, writer, node, emit
        self.action, self.window, self.threshold, self.publish_s, self.clock = action, window, threshold, publish_s, clock
        self.samples: dict[int, deque[tuple[int, float, float, float]]] = {}
        self.flagged: set[int] = set()
        self.reports: list[dict[str, Any]] = []
        self._last = 0.0

    def add(self, rank: int, step: int, step_s: float, compute_s: float, wait_s: float) -> None:
        """One step of local rank ``rank`` (global): its index and times (s)."""
        self.samples.setdefault(int(rank), deque(maxlen=self.window)).append(
            (int(step), float(step_s), float(compute_s), float(wait_s)))

    def summary(self) -> dict[str, dict[str, Any]]:
        """``{rank: {compute_s, step_s, wait_s, n, step}}``: lower medians (s, :func:`window_median`)
        over each local rank's window."""
        out = {}
        for rank, xs in self.samples.items():
            if xs:
                out[str(rank)] = {"compute_s": window_median(x[2] for x in xs),
                                  "step_s": window_median(x[1] for x in xs),
                                  "wait_s": window_median(x[3] for x in xs), "n": len(xs), "step": xs[-1][0]}
        return out

    def tick(self, now: float | None = None) -> list[dict[str, Any]]:
        """Every :data:`PUBLISH_S`: publish this node's summary and judge its ranks. Returns the
        ``straggler.detected`` data emitted in this call."""
        now = self.clock() if now is None else now
        if now - self._last < self.publish_s:
            return []
        self._last = now
        mine = self.summary()
        paths = JobPaths(self.job_dir)
        try:
            os.makedirs(paths.stragglers, exist_ok=True)
            _write_json(paths.straggler_summary(self.writer), {"node": self.node, "time": now, "ranks": mine})
        except OSError:
            pass  # a storage hiccup: judge with what is there
        return self.judge(mine, self.read_others(now))

    def read_others(self, now: float) -> dict[int, dict[str, Any]]:
        """Other agents' fresh summaries: ``{rank: summary}``."""
        folder = JobPaths(self.job_dir).stragglers
        try:
            names = os.listdir(folder)
        except OSError:
            return {}
        ranks: dict[int, dict[str, Any]] = {}
        for name in names:
            if not name.endswith(".json") or name == f"{self.writer}.json" or not _NAME.fullmatch(name[:-5]):
                continue
            try:
                data = _read_json(os.path.join(folder, name))
                if not isinstance(data, dict) or now - float(data.get("time", 0)) > STALE_S:
                    continue
                for rank, s in (data.get("ranks") or {}).items():
                    ranks[int(rank)] = {k: float(s[k]) for k in ("compute_s", "step_s", "wait_s", "n")}
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                continue
        return ranks

    def judge(self, mine: dict[str, dict[str, Any]], others: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
        """Flag this node's ranks against every other rank with a full window."""
        everyone = {**others, **{int(r): s for r, s in mine.items()}}
        full = {r: s for r, s in everyone.items() if s["n"] >= self.window}
        out = []
        for r_text, s in mine.items():
            rank = int(r_text)
            if s["n"] < self.window:
                continue
            rest = [v["compute_s"] for r, v in full.items() if r != rank]
            sc = score(s["compute_s"], rest)
            if sc is None:
                continue
            if rank in self.flagged:
                if sc < CLEAR:
                    self.flagged.discard(rank)  # the episode ended
                continue
            med = median(rest)
            if sc < self.threshold or s["compute_s"] - med < MIN_EXCESS_S:
                continue
            self.flagged.add(rank)
            data = {"rank": rank, "node": self.node, "score": round(sc, 3), "step_s": round(s["step_s"], 6),
                    "median_step_s": round(median([v["step_s"] for r, v in full.items() if r != rank]), 6),
                    "compute_s": round(s["compute_s"], 6), "median_compute_s": round(med, 6),
                    "wait_s": round(s["wait_s"], 6), "window": self.window, "step": s.get("step"),
                    "action": self.action, "threshold": self.threshold}
            self.emit("straggler.detected", **data)
            self.reports.append(data)
            if self.action == "exclude":
                self._exclude(data)
            out.append(data)
        return out

    def _exclude(self, data: dict[str, Any]) -> None:
        paths = JobPaths(self.job_dir)
        if not _NAME.fullmatch(self.node):
            return
        try:
            os.makedirs(paths.stragglers_exclude, exist_ok=True)
            _write_json(paths.straggler_exclusion(self.node), {**data, "time": self.clock()})
        except OSError:
            pass


def excluded_nodes(job_dir: str) -> dict[str, str]:
    """Nodes a launch agent asked to exclude as stragglers (``on_straggler = "exclude"``):
    ``{node: reason}`` from ``<job_dir>/stragglers/exclude/<node>.json`` (regular files, no links;
    unreadable ones skipped)."""
    folder = JobPaths(job_dir).stragglers_exclude
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    out = {}
    for name in sorted(names):
        node = name[:-5]
        if not name.endswith(".json") or not _NAME.fullmatch(node):
            continue
        try:
            data = _read_json(os.path.join(folder, name))
            out[node] = (f"straggler: rank {int(data['rank'])} {float(data['score']):.2f}x the other ranks' "
                         f"step compute time over {int(data['window'])} steps")
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return out
