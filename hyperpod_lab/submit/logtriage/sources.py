"""Where a rank's log bytes come from: each attempt's ``stdout.log``/``stderr.log`` and the job's
own log, read by byte range through the scheduler (:class:`RankLogs`)."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

from hyperpod_lab.errors import HyperPodLabError
from hyperpod_lab.schedulers.base import LogChunk, read_log_range
from hyperpod_lab.submit.logtriage.parse import ATTEMPT


# ---------------------------------------------------------------------------- sources
@dataclass
class Source:
    """One log file of a rank.

    Attributes:
        rank: the global rank.
        name: its path relative to the job directory (``logs/torchrun/.../attempt_0/1/stderr.log``),
            or ``log`` for the backend's own rank log (read through ``Scheduler.log_range``).
        attempt: torchrun's attempt (restart) number, None for ``log``.
        stream: ``stdout``, ``stderr`` or ``log``.
        path: absolute path on the cluster's storage (None for ``log``).
        size: bytes, from the directory listing (None where unknown).
    """

    rank: int
    name: str
    attempt: int | None
    stream: str
    path: str | None
    size: int | None = None

    @property
    def key(self) -> str:
        return f"{self.rank}:{self.name}"

    def to_dict(self) -> dict:
        return {"rank": self.rank, "name": self.name, "attempt": self.attempt, "stream": self.stream,
                "size": self.size}


class RankLogs:
    """The ranks' log sources of one job, read by byte range through its scheduler.

    Args:
        scheduler: the job's :class:`~hyperpod_lab.schedulers.base.Scheduler`.
        rec: the job's :class:`~hyperpod_lab.submit.jobs.JobRecord`.

    Counts what it reads in :attr:`bytes_read` (bytes, all reads together).
    """

    def __init__(self, scheduler, rec):
        self.sched, self.rec = scheduler, rec
        self.job_dir = rec.job_dir.rstrip("/")
        self.bytes_read = 0
        self._info: dict[int, dict | None] = {}
        self._runs: dict[str, list[str]] = {}  # torchrun run folder -> its listing
        self._sources: dict[int, list[Source]] = {}

    def ranks(self) -> list[int]:
        """Ranks that have started (have ``ranks/rank-R.json``), ascending."""
        try:
            return self.sched._known_ranks(self.rec)
        except Exception:  # a backend without rank files
            return []

    def info(self, rank: int) -> dict | None:
        """The rank's ``ranks/rank-R.json`` (None when absent)."""
        if rank not in self._info:
            try:
                self._info[rank] = self.sched.rank_info(self.rec, rank)
            except HyperPodLabError:
                self._info[rank] = None
        return self._info[rank]

    def node(self, rank: int) -> str | None:
        info = self.info(rank) or {}
        return info.get("node") or info.get("host")

    def inside(self, path: str) -> bool:
        return posixpath.normpath(path).startswith(self.job_dir + "/")

    def sources(self, rank: int) -> list[Source]:
        """The rank's sources, oldest attempt first, ``stdout`` before ``stderr`` in each; one
        ``log`` source where the rank's log file is not in torchrun's layout or unknown. Listed
        once per :class:`RankLogs` (one request)."""
        if rank not in self._sources:
            self._sources[rank] = self._list_sources(rank)
        return self._sources[rank]

    def _list_sources(self, rank: int) -> list[Source]:
        info = self.info(rank) or {}
        log_file = info.get("log_file")
        remote = getattr(self.sched, "remote", None)
        if (isinstance(log_file, str) and self.inside(log_file) and remote is not None
                and posixpath.basename(log_file) == "stdout.log"):
            slot = posixpath.dirname(posixpath.normpath(log_file))
            local, run = posixpath.basename(slot), posixpath.dirname(posixpath.dirname(slot))
            if ATTEMPT.match(posixpath.basename(posixpath.dirname(slot))) and local.isdigit():
                try:
                    if run not in self._runs:  # ranks of one node share it: one listing per request
                        self._runs[run] = remote.listdir(run)
                    attempts = sorted((int(m.group(1)), d) for d in self._runs[run] if (m := ATTEMPT.match(d)))
                    out = []
                    for k, d in attempts:
                        folder = posixpath.join(run, d, local)
                        files = remote.list_files(folder)
                        for stream in ("stdout", "stderr"):
                            if f"{stream}.log" in files:
                                path = posixpath.join(folder, f"{stream}.log")
                                out.append(Source(rank, posixpath.relpath(path, self.job_dir), k, stream, path,
                                                  files[f"{stream}.log"]))
                    if out:
                        return out
                except (OSError, HyperPodLabError):
                    pass
        return [Source(rank, "log", None, "log", None, None)]

    def read(self, src: Source, offset: int | None, length: int) -> LogChunk:
        """At most ``length`` bytes of ``src`` from ``offset`` (None: its tail): one bounded read."""
        if src.path is None:
            chunk = self.sched.log_range(self.rec, src.rank, offset, length)
        else:
            try:
                chunk = read_log_range(self.sched.remote, src.path, offset, length)
            except FileNotFoundError:
                chunk = LogChunk("", 0, 0, 0)
        self.bytes_read += chunk.end - chunk.offset
        if chunk.size is not None:
            src.size = chunk.size
        return chunk

    def read_job_log(self, offset: int | None, length: int) -> LogChunk:
        """At most ``length`` bytes of the whole job's log (the launcher's or Slurm's output,
        where torchelastic prints its ``ChildFailedError`` report) from ``offset`` (None: its tail)."""
        chunk = self.sched.log_range(self.rec, None, offset, length)
        self.bytes_read += chunk.end - chunk.offset
        return chunk

    def error_time(self, src: Source) -> float | None:
        """The failure time torchrun recorded for ``src``'s worker and attempt (``error.json``
        next to the log: ``message.extraInfo.timestamp``, seconds since the epoch), or None.
        Reads at most 64 KiB."""
        if src.path is None:
            return None
        path = posixpath.join(posixpath.dirname(src.path), "error.json")
        try:
            data = read_log_range(self.sched.remote, path, 0, 64 << 10)
        except (OSError, HyperPodLabError):
            return None
        self.bytes_read += data.end - data.offset
        try:
            doc = json.loads(data.text)
            ts = doc["message"]["extraInfo"]["timestamp"]
            return float(ts)
        except (ValueError, KeyError, TypeError):
            return None


# ---------------------------------------------------------------------------- views
def raw_bytes(chunk: LogChunk) -> bytes:
    return chunk.raw if chunk.raw is not None else chunk.text.encode()
