"""Event schema v1, its writer and its cursor-based reader.

Everything that happens to a job is an :class:`Event`. The schema is defined here once and
shared by the in-job runtime (which writes), the CLI, magics, widgets and server (which read);
the TypeScript types in ``src/`` mirror it.

Storage layout: each writer (a rank, a node's launch agent, the submitting client) appends JSON
lines to its own file ``<job_dir>/events/<writer>.jsonl``, so no two processes share a file.
A reader keeps a byte-offset cursor per file and only consumes complete lines, so a dropped
connection or a restarted reader resumes with no loss and no duplicates.

Cursors travel to clients as one opaque string (:func:`encode_cursor`, :func:`decode_cursor`): the
event stream's ``{file name: byte offset}`` and the log triage's ``{"R:source": byte offset}``.

This module imports only the standard library and :mod:`hyperpod_lab.errors` (the runtime and the
server both use it).
"""

from __future__ import annotations

import base64
import binascii
import errno
import heapq
import json
import os
import re
import socket
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Iterator, Protocol

from hyperpod_lab import tails as _tails
from hyperpod_lab.envexec import append_line as _append_line
from hyperpod_lab.errors import HyperPodLabError, SpecError
from hyperpod_lab.tails import CHANGES, read_span

SCHEMA_VERSION = 1
EVENTS_DIRNAME = "events"


class EventKind(str, Enum):
    """The kinds of schema v1. Data fields each kind carries are listed in ``docs/events.md``."""

    SUBMITTED = "submitted"
    STARTED = "started"
    STEP = "step"
    CHECKPOINT_SAVED = "checkpoint.saved"
    CHECKPOINT_RESTORED = "checkpoint.restored"
    CHECKPOINT_CORRUPT = "checkpoint.corrupt"
    CHECKPOINT_FAILED = "checkpoint.failed"
    FAULT_DETECTED = "fault.detected"
    RECOVERY_STARTED = "recovery.started"
    RECOVERY_COMPLETED = "recovery.completed"
    RECOVERY_FALLBACK = "recovery.fallback"
    ELASTIC_SCALED = "elastic.scaled"
    HEALTH_CHECKED = "health.checked"
    HEALTH_FAILED = "health.failed"
    NODE_EXCLUDED = "node.excluded"
    STRAGGLER_DETECTED = "straggler.detected"
    JOB_FAILED = "job.failed"
    FINISHED = "finished"


class FaultReason(str, Enum):
    """The ``fault.detected`` reasons readers tell apart (the others are free text: a torchrun
    failure's root cause, an operator's message). Mirrored in ``src/api/events.ts`` (FAULT_REASONS)."""

    HANG = "hang"
    """The launch agent's hang watchdog killed a rank that made no progress (``stalled_s``)."""
    NODE_DOWN = "node down"
    """The supervisor's report of a node the scheduler marked DOWN (``node``, ``rank``, ``slurm_state``)."""


# ---- writer names: each writer appends to its own ``events/<writer>.jsonl`` ----------------------
RANK_WRITER_PREFIX = "rank-"
"""A rank's writer is ``rank-<global rank>`` (:func:`rank_writer`)."""
AGENT_WRITER_PREFIX = "agent-"
"""A node's launch agent's writer is ``agent-<node>`` (:func:`agent_writer`)."""
HEALTH_WRITER_PREFIX = "health-"
"""A node's pre-flight health check's writer is ``health-<node>`` (:func:`health_writer`)."""
SUPERVISOR_WRITER = "supervisor"
"""The allocation's supervisor (``hyperpod_lab.node.supervisor``)."""
CLIENT_WRITER = "client"
"""The submitting side (``submitted``, and ``finished`` for a job that ended without the runtime's)."""
OPERATOR_WRITER = "operator"
"""The EKS backend's report of the HyperPod training operator's status (see ``docs/events.md``)."""


def rank_writer(rank: int) -> str:
    """``rank-R``: the writer name of global rank ``rank``."""
    return f"{RANK_WRITER_PREFIX}{int(rank)}"


def agent_writer(node: str) -> str:
    """``agent-<node>``: the writer name of ``node``'s launch agent (``node`` already a safe name)."""
    return AGENT_WRITER_PREFIX + node


def health_writer(node: str) -> str:
    """``health-<node>``: the writer name of ``node``'s pre-flight health check."""
    return HEALTH_WRITER_PREFIX + node


def writer_node(writer: str, prefixes: tuple[str, ...] = (HEALTH_WRITER_PREFIX, AGENT_WRITER_PREFIX)) -> str | None:
    """The node of a per-node writer name (``health-n1`` -> ``n1``) for the first of ``prefixes``
    it starts with, else None."""
    for prefix in prefixes:
        if writer.startswith(prefix):
            return writer[len(prefix):]
    return None


def stopped_ranks(data: dict) -> list[int]:
    """The ranks a node's agent stopped because a ``fault.detected`` event's rank failed (its
    ``data["stopped_ranks"]``, :meth:`hyperpod_lab.node.launch.AgentEvents.worker_failed`), in
    their order: the whole numbers >= 0 of that list, anything else in it passed over; [] when
    there is none. What the fold, log triage and the CLI all read of it."""
    listed = data.get("stopped_ranks")
    if not isinstance(listed, list):
        return []
    out = []
    for r in listed:
        if isinstance(r, float) and r.is_integer():
            r = int(r)
        if isinstance(r, int) and not isinstance(r, bool) and r >= 0:
            out.append(r)
    return out


class EventSchemaError(ValueError):
    """A line is not a schema-v1 event (malformed JSON, newer version, unknown kind)."""


@dataclass(frozen=True)
class Event:
    """One thing that happened to a job.

    Attributes:
        kind: an :class:`EventKind` value, e.g. ``"checkpoint.saved"``.
        job_id: hyperpod-lab job id.
        time: wall-clock time, seconds since the epoch (float).
        writer: name of the writing process's file, e.g. ``"rank-0"``, ``"agent-n1"``.
        seq: 0-based position in that writer's file (with ``writer``, a unique key).
        data: kind-specific fields (step, loss, tier, bytes, rank, node, downtime_s, ...).
        v: schema version (1).
    """

    kind: str
    job_id: str
    time: float
    writer: str
    seq: int
    data: dict[str, Any] = field(default_factory=dict)
    v: int = SCHEMA_VERSION

    @property
    def key(self) -> tuple[str, int]:
        return (self.writer, self.seq)

    def to_json(self) -> str:
        return json.dumps({"v": self.v, "kind": self.kind, "job_id": self.job_id, "time": self.time,
                           "writer": self.writer, "seq": self.seq, "data": self.data},
                          separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, line: str | bytes) -> "Event":
        """Parse one line. Raises EventSchemaError for anything but a v1 event."""
        try:
            # what json.loads does, without its per-call overhead
            if isinstance(line, (bytes, bytearray)):
                line = line.decode(json.detect_encoding(line), "surrogatepass")
            elif line.startswith("\ufeff"):
                raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", line, 0)
            d = _loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise EventSchemaError(f"not a JSON event line: {e}") from None
        if not isinstance(d, dict):
            raise EventSchemaError("an event line must be a JSON object")
        if d.get("v") != SCHEMA_VERSION:
            raise EventSchemaError(f"event schema version {d.get('v')!r} is not {SCHEMA_VERSION}; upgrade hyperpod-lab")
        try:
            kind = d["kind"]
            kind = _KINDS.get(kind) if isinstance(kind, str) else None
            if kind is None:
                kind = EventKind(d["kind"]).value  # raises ValueError naming the kind
            job_id, t, writer, seq = str(d["job_id"]), float(d["time"]), str(d["writer"]), int(d["seq"])
            data = d.get("data")
            if type(data) is not dict:  # (a parsed object is this event's own: no copy of it)
                data = dict(data or {})
        except (KeyError, ValueError, TypeError) as e:
            raise EventSchemaError(f"bad event fields: {e}") from None
        # what the frozen dataclass's __init__ does (object.__setattr__ per field, in field order:
        # the instances share their dicts' keys), without its call: a long job parses millions
        ev = _new_event(cls)
        _set(ev, "kind", kind)
        _set(ev, "job_id", job_id)
        _set(ev, "time", t)
        _set(ev, "writer", writer)
        _set(ev, "seq", seq)
        _set(ev, "data", data)
        _set(ev, "v", SCHEMA_VERSION)
        return ev

    def describe(self) -> str:
        """One human line, as the CLI prints it."""
        t = time.strftime("%H:%M:%S", time.localtime(self.time))
        items = " ".join(f"{k}={_fmt(v)}" for k, v in sorted(self.data.items()))
        return f"{t} {self.kind:<20} {self.writer:<10} {items}".rstrip()


_DECODER = json.JSONDecoder()
_SCAN = _DECODER.scan_once


def _loads(s: str) -> Any:
    """``json.loads(s)``, cheaper for the usual event line (one JSON value, no white space around
    it): the decoder's scanner called directly. Anything else (white space, extra data, an
    error) goes through ``JSONDecoder.decode``, so the result or the error is json.loads's."""
    try:
        d, end = _SCAN(s, 0)
        if end == len(s):
            return d
    except (StopIteration, json.JSONDecodeError):
        pass
    return _DECODER.decode(s)


_KINDS = {k.value: k.value for k in EventKind}
_new_event = object.__new__
_set = object.__setattr__


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def events_dir(job_dir: str) -> str:
    return os.path.join(job_dir, EVENTS_DIRNAME)


_WRITER_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


class FileAccess(Protocol):
    """What event readers and writers need of storage: local files (:class:`LocalFiles`), or
    SFTP to a cluster's login node (``schedulers.remote.SSHRemote``, which has these methods)."""

    def listdir(self, path: str) -> list[str]: ...  # names; [] if the directory is missing

    def list_files(self, path: str) -> dict[str, int]: ...  # regular files (no links, no dirs) -> size, bytes

    def read_from(self, path: str, offset: int = 0, length: int | None = None) -> bytes: ...  # at most
    # ``length`` bytes from offset (None: to EOF); FileNotFoundError

    def append_bytes(self, path: str, data: bytes) -> None: ...  # one append of ``data``, created if missing

    def makedirs(self, path: str) -> None: ...  # like ``mkdir -p``

    def create_new(self, path: str) -> bool: ...  # create an empty file (0600) unless it exists; True if created

    # optional: ``read_tails(directory, starts, wants, max_bytes)``, every grown file's bytes in
    # one call (:func:`read_tails`); without it a reader lists and reads file by file


def read_tails(files: FileAccess, directory: str, starts: dict[str, int], wants: dict[str, int] | None = None,
               max_bytes: int | None = None) -> tuple[dict[str, int], dict[str, bytes], dict[str, str]]:
    """``(sizes, data, errors)`` of ``directory``'s event files (:func:`hyperpod_lab.tails.read_tails`):
    the size (bytes) of every regular file, or at least of every one whose size is not its
    offset in ``starts`` (a file left out is as ``starts`` says), and the bytes of each ``*.jsonl`` file past its offset in
    ``starts`` (0 when missing), at most ``wants[name]`` (else ``max_bytes``; None: to the end)
    extended to the end of a longer first line; ``errors``: files not readable, and why.

    In one call where ``files`` has ``read_tails`` (local files; over SSH one remote command:
    :meth:`hyperpod_lab.schedulers.remote.SSHRemote.read_tails`), else one ``list_files`` and
    one ``read_from`` per grown file. Raises OSError or ClusterUnreachable for the listing."""
    rt = getattr(files, "read_tails", None)
    if rt is not None:
        return rt(directory, starts, wants, max_bytes)
    wants = wants or {}
    sizes = files.list_files(directory)
    data: dict[str, bytes] = {}
    errors: dict[str, str] = {}
    for name, size in sorted(sizes.items()):
        start, want = starts.get(name, 0), wants.get(name, max_bytes)
        if not name.endswith(".jsonl") or size <= start or (want is not None and want <= 0):
            continue
        path = f"{directory}/{name}"
        try:
            data[name] = read_span(lambda o, n: files.read_from(path, o, n), start, size, want)
        except OSError as e:
            errors[name] = str(e)
    return sizes, data, errors


_MADE = threading.Lock()  # LocalFiles' tailers are made under it


def _close_all(tailers: list) -> None:
    for t in list(tailers):
        t.close()


class LocalFiles:
    """FileAccess over this machine's file system.

    Attributes:
        bytes_read: bytes returned by :meth:`read_from` so far (class-wide: every instance adds to
            it), for tests and benchmarks that check a read stayed bounded.
    """

    bytes_read = 0

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def list_files(self, path: str) -> dict[str, int]:
        """Regular files in ``path`` (symbolic links and directories left out) and their sizes,
        bytes; {} if the directory is missing."""
        try:
            with os.scandir(path) as it:
                return {e.name: e.stat(follow_symlinks=False).st_size for e in it if e.is_file(follow_symlinks=False)}
        except FileNotFoundError:
            return {}

    def read_from(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """At most ``length`` bytes from ``offset`` (None: to the end). Raises FileNotFoundError;
        OSError for a symbolic link (never followed: it could point out of the job directory)."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with open(fd, "rb") as f:
            f.seek(offset)
            data = f.read() if length is None else f.read(max(0, length))
        LocalFiles.bytes_read += len(data)
        return data

    def read_tails(self, directory: str, starts: dict[str, int], wants: dict[str, int] | None = None,
                   max_bytes: int | None = None) -> tuple[dict[str, int], dict[str, bytes], dict[str, str]]:
        """Every grown event file's bytes past ``starts`` in one call (:func:`read_tails`),
        through a :class:`hyperpod_lab.tails.FileTailer` of this instance and thread (made on
        first use; it keeps the files open between polls: see there for what a poll then costs,
        and what it sees late). :meth:`close` (or the instance's end) closes them."""
        sizes, data, errors = self._tailer().read_tails(directory, starts, wants, max_bytes)
        LocalFiles.bytes_read += sum(len(b) for b in data.values())
        return sizes, data, errors

    def _tailer(self) -> "_tails.FileTailer":
        """This thread's tailer (one per thread: a poll never waits for another thread's read)."""
        mine = self.__dict__.get("_per_thread")
        if mine is None:
            with _MADE:
                mine = self.__dict__.get("_per_thread")
                if mine is None:
                    mine = self._per_thread = threading.local()
                    made = self._tailers = []
                    weakref.finalize(self, _close_all, made)
        tailer = getattr(mine, "tailer", None)
        if tailer is None:
            tailer = mine.tailer = _tails.FileTailer()
            with _MADE:
                self._tailers.append(tailer)
        return tailer

    def close(self) -> None:
        """Close the event files kept open by :meth:`read_tails` (it may be used again)."""
        _close_all(self.__dict__.get("_tailers", []))

    def append_bytes(self, path: str, data: bytes) -> None:
        """Append all of ``data`` on an ``O_APPEND`` descriptor (``write()`` again after a short
        write), then ``fsync``; all or nothing.

        Raises:
            OSError: a write or the fsync failed (ENOSPC: the file system is full; the message
                names ``path``). The file is first cut back to its length before the call, so no
                part of ``data`` is left in it (only one process appends to an event file).
        """
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            start = os.fstat(fd).st_size
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError as e:
                try:
                    os.ftruncate(fd, start)
                except OSError:
                    pass
                raise OSError(e.errno, f"{os.strerror(e.errno)} (appending {len(data)} bytes, "
                              f"{len(data) - len(view)} of them written, then cut back)", path) from None
        finally:
            os.close(fd)

    def append_hint(self, path: str, data: bytes) -> None:
        """One ``write()`` of ``data`` (a line under ``PIPE_BUF`` bytes) on an ``O_APPEND``
        descriptor, no ``fsync``: the job's change log (:data:`hyperpod_lab.tails.CHANGES`), a
        hint that costs a reader latency when lost, never an event. Created 0600; never through
        a link. Raises OSError."""
        _append_line(path, data)  # (as the login node's submit appends the client's event)

    def makedirs(self, path: str) -> None:
        """``mkdir -p``; what it creates is private to the user (0700)."""
        os.makedirs(path, mode=0o700, exist_ok=True)

    def create_new(self, path: str) -> bool:
        """Create an empty file (0600) with ``O_EXCL``: True for the one caller that created it."""
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return True
        except FileExistsError:
            return False


class EventWriter:
    """Appends events of one writer to ``<job_dir>/events/<writer>.jsonl``.

    Each event is one append of one complete line (locally: ``write()`` on an ``O_APPEND``
    descriptor, repeated after a short write, followed by ``fsync``), so a SIGKILL loses at most
    the event being written. A restarted writer continues the sequence numbers of its file, after
    terminating a torn last line its predecessor left. After each event it names its file in the
    job's change log (``events/changes.log``, :data:`hyperpod_lab.tails.CHANGES`; one more small
    append, not ``fsync``ed, its failure ignored), so a reader's steady poll probes only the files
    that grew (:class:`hyperpod_lab.tails.FileTailer`; docs/events.md).

    A failed append (a full file system: ENOSPC) loses that event only: locally the file is cut
    back to its last complete line; where that is not possible (a remote file, a failed cut) the
    next event starts with a newline, which ends the torn line (readers skip it as malformed, and
    it counts as a line for the sequence numbers). Each run of failures is reported once on
    stderr (``hyperpod-lab: could not write ... no space ...``, naming the file) and its end once
    (how many events were lost). Events written before the failure are never touched.

    Args:
        job_dir: the job's directory on shared storage, as ``files`` sees it.
        writer: file name stem, ``[A-Za-z0-9_.-]``, unique per process (``rank-3``, ``agent-n1``).
        job_id: hyperpod-lab job id stamped on every event.
        clock: seconds since the epoch (tests inject one).
        files: the storage (default: local files); the same :class:`FileAccess` an
            :class:`EventReader` of the job reads through (e.g. the cluster's SFTP ``Remote``).
        raise_errors: whether :meth:`emit` raises when the append fails (the default: a caller
            that must know, like the client writing ``finished``); False: it reports on stderr
            and returns (the training runtime's writer: an event is never worth a training run).

    Attributes:
        lost: events whose append failed so far (this process).

    Raises:
        ValueError: a writer name outside ``[A-Za-z0-9_.-]{1,100}``.
    """

    def __init__(self, job_dir: str, writer: str, job_id: str, clock=time.time, files: "FileAccess | None" = None,
                 *, raise_errors: bool = True):
        if not _WRITER_RE.match(writer):
            raise ValueError(f"writer name {writer!r} must match {_WRITER_RE.pattern}")
        self.files = files or LocalFiles()
        self.dir = events_dir(job_dir)
        self.path = f"{self.dir}/{writer}.jsonl"
        # the name between newlines: a torn name before it (NFS) never swallows it
        self._changes, self._name_line = f"{self.dir}/{CHANGES}", f"\n{writer}.jsonl\n".encode()
        self.files.makedirs(self.dir)
        self.writer, self.job_id, self._clock = writer, job_id, clock
        self.raise_errors = bool(raise_errors)
        self.lost = 0
        self._failing = 0  # events lost since the last one written
        # a torn last line (a writer killed mid-write) is ended by the first emit's newline
        self._seq, self._torn = _count_complete_lines(self.files, self.path)

    def emit(self, kind: EventKind | str, **data: Any) -> Event:
        """Write one event and return it.

        Raises:
            ValueError: a kind outside schema v1.
            OSError: (only with ``raise_errors``) the append failed, e.g. ENOSPC; the message
                names the file, says "no space" for a full file system, and the fix. The file
                still ends in a complete line or is ended by the next event's newline.
        """
        kind = EventKind(kind).value
        prefix = b""
        if self._torn:
            try:
                prefix = b"\n" if _ends_torn(self.files, self.dir, self.path) else b""
            except OSError:
                prefix = b"\n"  # unknown: a blank line costs nothing (readers skip it)
        ev = Event(kind=kind, job_id=self.job_id, time=self._clock(), writer=self.writer,
                   seq=self._seq + (1 if prefix else 0), data=data)
        try:
            self.files.append_bytes(self.path, prefix + (ev.to_json() + "\n").encode())
        except OSError as e:
            self._torn = True
            self.lost += 1
            self._failing += 1
            msg = (f"could not write a '{kind}' event to {self.path}: {_why(e)}; the event is lost, the events "
                   f"before it are intact and later ones are written once the append succeeds again; free space "
                   f"on the job's storage")
            if self._failing == 1:
                print(f"hyperpod-lab: {msg}", file=sys.stderr, flush=True)
            if self.raise_errors:
                raise OSError(e.errno, msg) from e
            return ev
        if self._failing:
            print(f"hyperpod-lab: events are written to {self.path} again; {self._failing} event(s) "
                  f"before this '{kind}' were lost", file=sys.stderr, flush=True)
            self._failing = 0
        self._torn = False
        self._seq = ev.seq + 1
        self._ring()
        return ev

    def _ring(self) -> None:
        """Name this writer's file in the job's change log (after the event is in it): what lets a
        reader's steady poll probe only the files that grew (:class:`hyperpod_lab.tails.FileTailer`).
        A failure is not reported: a reader then sees the event at its next listing."""
        try:
            append = getattr(self.files, "append_hint", None) or self.files.append_bytes
            append(self._changes, self._name_line)
        except (OSError, HyperPodLabError):  # (a remote's ClusterUnreachable)
            pass


def _why(e: OSError) -> str:
    """``no space left on the device (ENOSPC)`` for a full file system, else the error."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device ({errno.errorcode[e.errno]}: {e})"
    return f"{type(e).__name__}: {e}"


def _ends_torn(files: "FileAccess", directory: str, path: str) -> bool:
    """Whether the file ``path`` in ``directory`` ends in a partial line (its last byte is not a
    newline). Raises OSError."""
    size = files.list_files(directory).get(path.rsplit("/", 1)[-1], 0)
    return size > 0 and files.read_from(path, size - 1, 1) != b"\n"


def _count_complete_lines(files: "FileAccess", path: str) -> tuple[int, bool]:
    """(newlines in ``path``, whether it ends in a partial line); (0, False) when missing."""
    try:
        data = files.read_from(path, 0)
    except FileNotFoundError:
        return 0, False
    return data.count(b"\n"), bool(data) and not data.endswith(b"\n")


class EventReader:
    """Streams a job's events from every writer file, with a cursor, without loss or duplicates.

    ``poll()`` returns the events that appeared since the last poll, ordered by time. The cursor
    (``{file name: byte offset of the first unread byte}``) only advances past complete lines;
    save it (``cursor``) and pass it back to resume elsewhere.

    Args:
        job_dir: the job's directory on shared storage, as ``files`` sees it.
        files: a FileAccess (default: local files).
        cursor: a cursor from an earlier reader, or None to start at the beginning.
    """

    def __init__(self, job_dir: str, files: FileAccess | None = None, cursor: dict[str, int] | None = None):
        self.dir = events_dir(job_dir)
        self.files = files or LocalFiles()
        self.cursor: dict[str, int] = dict(cursor or {})
        self.skipped: list[tuple[str, str]] = []  # (file, reason) of malformed lines
        self.more = False
        # file -> (cursor, offset just past the last line read, [(event, file, end)]): what the
        # last poll_located held back of it (see there)
        self._held: dict[str, tuple[int, int, list[tuple[Event, str, int]]]] = {}
        # the change log's offset the last reply gave (hyperpod_lab.tails.FileTailer), the cursor
        # that poll left (a cursor changed from outside drops the offset: every file is probed),
        # and the files with bytes not taken yet -> how many (probed at the next poll, log or not)
        self._changes: int | None = None
        self._left: dict[str, int] | None = None
        self._behind: dict[str, int] = {}

    def poll(self, max_bytes: int | None = None) -> list[Event]:
        """The events that appeared since the last poll, ordered by time; advances the cursor.
        ``max_bytes``: as in :meth:`poll_located`."""
        return [ev for ev, _, _ in self.poll_located(max_bytes)]

    def poll_located(self, max_bytes: int | None = None) -> list[tuple[Event, str, int]]:
        """Like :meth:`poll`, with each event's file name and the byte offset just past its line.

        The order is by time, and within one file always by position (a merge of the files), so
        a cursor advanced event by event (``cursor[file] = offset``) never skips an event.

        Args:
            max_bytes: read at most this many bytes of each file from its cursor (more only when
                one line is longer: then up to the end of that line); None reads to the end. When a
                file has more than was read, :attr:`more` is True after the call and events later
                than the last one read of such a file are held back (the cursor stays before
                them), so a page never returns an event before an earlier one still unread.

        The events held back stay parsed in this reader (at most one page of each file): the
        next call with the same cursor returns them from memory and reads only the bytes after
        them, up to ``max_bytes`` from the cursor, so a long job read page by page through one
        reader reads and parses each line once. A cursor changed from outside (or a file that
        shrank) drops what was held back of that file: it is read again.

        Where ``files`` reads through a :class:`hyperpod_lab.tails.FileTailer` (local files, the
        login node's program), a steady poll probes only the files the job's change log names
        since the last poll and those this reader has not read to their end (see there).
        """
        located = self._poll_located(max_bytes)
        self._left = dict(self.cursor)
        return located

    def _poll_located(self, max_bytes: int | None) -> list[tuple[Event, str, int]]:
        per_file: list[list[tuple[Event, str, int]]] = []
        starts: list[int] = []  # each page's start offset (the cursor before this poll)
        read_to: list[int] = []  # each file's offset just past the last line read (held back or not)
        truncated_at: list[float] = []  # time of the last event read of each file with more to read
        held, self._held = self._held, {}
        self.more = False
        # what to read of each file: from its cursor, or (a page held back of it) after the held
        # events, up to max_bytes from the cursor; all files in one call (read_tails)
        read_at: dict[str, int] = dict(self.cursor)
        wants: dict[str, int] = {}
        for name, kept in list(held.items()):
            if kept[0] != self.cursor.get(name, 0):
                del held[name]  # the cursor moved: read again
                continue
            read_at[name] = kept[1]
            if max_bytes is not None:
                wants[name] = kept[0] + max(1, int(max_bytes)) - kept[1]
        behind, self._behind = self._behind, {}
        if self._changes is not None and self._left == self.cursor:
            read_at[CHANGES] = self._changes
            for name, left in behind.items():  # probed whatever the log says
                wants.setdefault(name, int(max_bytes) if max_bytes is not None else max(_tails.PROBE_BYTES, left))
        sizes, chunks, errors = read_tails(self.files, self.dir, read_at, wants, max_bytes)
        self._changes = sizes.get(CHANGES, read_at.get(CHANGES))
        for name, why in errors.items():
            self.skipped.append((name, f"not readable as an event file: {why}"))
        # a file left out of ``sizes`` is at its start: one with events held back is still read
        for name in sorted(set(sizes) | set(held)):
            size = sizes.get(name, read_at.get(name, 0))
            # regular files only: a directory or a link named x.jsonl (which could point out of
            # the job directory) is not an event file
            off = self.cursor.get(name, 0)
            if not name.endswith(".jsonl") or size <= off or name in errors:
                continue  # nothing new: no read
            kept = held.get(name)
            path = f"{self.dir}/{name}"
            try:
                if kept is not None and size < kept[1]:  # not the file read: read it again
                    kept = None
                    chunk = read_span(lambda o, n: self.files.read_from(path, o, n), off, size, max_bytes)
                else:
                    chunk = chunks.get(name, b"")
                if kept is None:
                    located, pos = [], off
                else:  # the events held back last time, then what follows them in this page
                    located, pos = list(kept[2]), kept[1]
                end = chunk.rfind(b"\n")
            except OSError as e:  # replaced by a link since the listing, or vanished
                self.skipped.append((name, f"not readable as an event file: {e}"))
                continue
            if end < 0 and not located:
                self._behind[name] = size - off  # a torn line: its end is read at the next poll
                continue
            if end >= 0:
                _parse_into(chunk[: end + 1], name, pos, located, self.skipped)  # malformed lines: skipped
                pos += end + 1
            per_file.append(located)
            starts.append(off)
            read_to.append(pos)
            self.cursor[name] = pos
            if pos < size:
                self._behind[name] = size - pos
                self.more = True
                if located:
                    truncated_at.append(located[-1][0].time)
        if not truncated_at:
            return _merged(per_file)
        # a page: each file up to its first event after the earliest cut, so the next page
        # continues in time order (a file is in position order: the rest of it waits)
        cut = min(truncated_at)
        pages = []
        for located, start, stop in zip(per_file, starts, read_to):
            i = next((i for i, x in enumerate(located) if x[0].time > cut), len(located))
            if i < len(located):
                name = located[i][1]
                self.cursor[name] = located[i - 1][2] if i > 0 else start
                self._held[name] = (self.cursor[name], stop, located[i:])
            pages.append(located[:i])
        if not any(pages):  # times out of order inside a file: still make progress
            j = [k for k, located in enumerate(per_file) if located and located[-1][0].time == cut][0]
            pages[j] = per_file[j]
            self.cursor[per_file[j][-1][1]] = per_file[j][-1][2]
            self._held.pop(per_file[j][-1][1], None)
        return _merged(pages)

    def follow(self, interval_s: float = 0.5, until: Iterable[str] = (EventKind.FINISHED.value,),
               timeout_s: float | None = None, stop=None) -> Iterator[Event]:
        """Yield events as they arrive until one of kind in ``until`` is seen, ``stop()`` is
        true, or ``timeout_s`` seconds pass (then TimeoutError). Polls every ``interval_s`` s."""
        until = set(until)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            done = False
            for ev in self.poll():
                yield ev
                if ev.kind in until:
                    done = True
            if done or (stop is not None and stop()):
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no '{'|'.join(sorted(until))}' event within {timeout_s} s")
            time.sleep(interval_s)


def _time_order(x: tuple) -> tuple[float, str, int]:
    return x[0].time, x[0].writer, x[0].seq


def _merged(runs: list[list[tuple]]) -> list[tuple]:
    """``heapq.merge(*runs)`` by (time, writer, seq): the located events of ``runs`` (each a
    file's, in position order) in time order, ties in run order, and each file's in position
    order even where its times go back (a writer's clock stepped back). When every run is in
    time order (the usual case) that is one stable sort of their concatenation, which timsort
    does in C (8 us for a steady poll's 25 one-event runs against heapq's 56 here)."""
    if all(len(run) < 2 or _in_time_order(run) for run in runs):
        out = [x for run in runs for x in run]
        out.sort(key=_time_order)
        return out
    return list(heapq.merge(*runs, key=_time_order))


def _in_time_order(run: list[tuple]) -> bool:
    keys = [_time_order(x) for x in run]
    return all(a <= b for a, b in zip(keys, keys[1:]))


#: how much of rank 0's event file :func:`incident_events` reads by default (its newest bytes)
INCIDENT_TAIL_BYTES = 256 << 10


def incident_events(job_dir: str, files: FileAccess | None = None,
                    rank0_tail_bytes: int | None = INCIDENT_TAIL_BYTES) -> list[Event]:
    """What a rank reads to date (or count) the job's failure incidents without reading every
    rank's file (issue 27: rank 0's first step after a restart folded all events of all ranks to
    date the incident, 50 s at 2,048 ranks, inside the recovery).

    Returns the events, in time order, of every writer that is not a rank (launch agents, health
    checks, the supervisor, the client, the operator: their files grow with nodes and incidents,
    not with ranks or steps) and of rank 0 (the steps; in restart mode its ``recovery.completed``
    closes an incident), of rank 0 only its newest ``rank0_tail_bytes`` (None: all). With a tail,
    the other writers' events older than the tail's first event are left out too, so that an
    incident closed before the tail does not look open. Other ranks' files (their checkpoints and,
    in a checkpointless job, their in-process faults and recoveries) are not read. Unreadable or
    malformed lines are skipped. Raises nothing for a missing directory (``[]``)."""
    files = files or LocalFiles()
    d = events_dir(job_dir)
    sizes = files.list_files(d)
    rank0 = rank_writer(0) + ".jsonl"
    out: list[Event] = []
    since = None
    if rank0 in sizes:
        size = sizes[rank0]
        start = 0 if rank0_tail_bytes is None else max(0, size - int(rank0_tail_bytes))
        try:
            chunk = _whole_lines_from(files.read_from(f"{d}/{rank0}", start), start)
        except OSError:
            chunk = b""
        out += _parse_lines(chunk)
        if start > 0 and out:
            since = min(ev.time for ev in out)
    for name in sorted(sizes):
        if not name.endswith(".jsonl") or name.startswith(RANK_WRITER_PREFIX):
            continue
        try:
            evs = _parse_lines(files.read_from(f"{d}/{name}", 0))
        except OSError:
            continue
        out += evs if since is None else [ev for ev in evs if ev.time >= since]
    out.sort(key=lambda e: (e.time, e.writer, e.seq))
    return out


def _parse_into(lines: bytes, name: str, pos: int, located: list, skipped: list) -> None:
    """Append ``(event, name, offset just past its line)`` for each complete line of ``lines``
    (read from byte offset ``pos`` of file ``name``; a last line with no newline is left out) to
    ``located``, and ``(name, why)`` for each malformed line to ``skipped``. Blank lines are
    passed over."""
    if lines.isascii() and b"\x00" not in lines:
        # one decode for the page (offsets in characters are then offsets in bytes)
        text: str | bytes = lines.decode("ascii")
        nl: str | bytes = "\n"
    else:
        text, nl = lines, b"\n"
    for line in text.split(nl)[:-1]:
        pos += len(line) + 1
        if not line.strip(" \t\n\r\x0b\x0c"):  # ASCII white space, as bytes.strip() takes it
            continue
        try:
            located.append((Event.from_json(line), name, pos))
        except EventSchemaError as e:
            skipped.append((name, str(e)))


#: how much of the end of each event file :func:`last_events_include` reads, bytes
FINAL_TAIL_BYTES = 4096


def tail_events(job_dir: str, tail_bytes: int, files: FileAccess | None = None, prefix: str = "",
                needle: bytes | None = None) -> Iterator[Event]:
    """The events in the last ``tail_bytes`` bytes of each event file of ``job_dir`` whose name
    starts with ``prefix`` (a partial first line dropped), file by file: one listing and one read
    of at most ``tail_bytes`` a file, whatever the job's age. ``needle``: skip a file whose tail
    does not contain these bytes, unparsed. A missing directory yields nothing; unreadable files
    and malformed lines are skipped."""
    files = files or LocalFiles()
    d = events_dir(job_dir)
    for name, size in sorted(files.list_files(d).items()):
        if not name.endswith(".jsonl") or not name.startswith(prefix) or size <= 0:
            continue
        start = max(0, size - tail_bytes)
        try:
            chunk = files.read_from(f"{d}/{name}", start, size - start)
        except OSError:
            continue
        if needle is None or needle in chunk:
            yield from _parse_lines(_whole_lines_from(chunk, start))


def _whole_lines_from(chunk: bytes, start: int) -> bytes:
    """``chunk`` (a file's bytes from offset ``start``) without its first line when ``start`` > 0:
    a read that began inside a line."""
    if start <= 0:
        return chunk
    return chunk[chunk.find(b"\n") + 1:] if b"\n" in chunk else b""


def last_events_include(job_dir: str, kind: str, files: FileAccess | None = None,
                        tail_bytes: int = FINAL_TAIL_BYTES) -> bool:
    """Whether the newest events of some writer (the last ``tail_bytes`` bytes of its event file,
    :func:`tail_events`) include one of ``kind``: for an event that is the last its writer
    writes, e.g. ``finished`` (the leader emits it once every checkpoint committed, then tears
    down; the client's is its last). What a hot spare looks at every second and every joining
    rank at its start, where reading the whole job (issue 27: 246,365 events at 2,048 ranks)
    grew with the ranks and the job's age."""
    needle = b'"kind":' + json.dumps(kind).encode()  # Event.to_json's compact, sorted form
    return any(ev.kind == kind for ev in tail_events(job_dir, tail_bytes, files, needle=needle))


def _parse_lines(data: bytes) -> list[Event]:
    """The events of ``data``'s complete lines (malformed ones skipped)."""
    located: list = []
    _parse_into(data, "", 0, located, [])
    return [ev for ev, _, _ in located]


def default_writer_name(prefix: str) -> str:
    """``prefix-hostname`` made safe for a writer name."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:60]
    return f"{prefix}-{host}"


# ---- cursors as clients see them ----------------------------------------------------------------
EVENT_CURSOR_KEY = re.compile(r"[A-Za-z0-9_.-]+\.jsonl")
"""A key of an event cursor: an event file's name (its value: the byte offset read up to)."""
EVENT_CURSOR_ERROR = "is not a cursor this server issued; omit it to start from the first event"


def encode_cursor(cursor: dict[str, int]) -> str:
    """The opaque cursor clients see: base64url (unpadded) of the JSON ``{key: byte offset}``
    (keys sorted); an :class:`EventReader`'s ``{file name: offset}``, or a log triage cursor."""
    raw = json.dumps(cursor, sort_keys=True, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str | None, *, field: str = "cursor", key: "re.Pattern[str]" = EVENT_CURSOR_KEY,
                  error: str = EVENT_CURSOR_ERROR, max_chars: int | None = None,
                  max_offset: int | None = None) -> dict[str, int]:
    """Inverse of :func:`encode_cursor`; ``None``/``""`` is the start (``{}``).

    Args:
        field: the SpecError's field. key: what every key must match whole (default: an event
            file's name). error: the SpecError's message. max_chars: longest ``text`` accepted.
            max_offset: every offset must be below it (default: any offset >= 0).

    Raises:
        SpecError: (``field``, ``error``) not base64url JSON, not an object of ``key`` -> int >= 0.
    """
    if not text:
        return {}
    if max_chars is not None and len(text) > max_chars:
        raise SpecError(field, error)
    try:
        cur = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError):
        raise SpecError(field, error) from None
    if not isinstance(cur, dict) or not all(
            isinstance(k, str) and key.fullmatch(k) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            and (max_offset is None or v < max_offset) for k, v in cur.items()):
        raise SpecError(field, error)
    return cur
