"""Cursors of bounded size whatever the rank count: short tokens for big cursors, kept here.

An event cursor is ``{file name: byte offset}``, one entry per writer file (issue 27, item 1):
at 2,048 ranks its old form (:func:`hyperpod_lab.events.encode_cursor`, base64 JSON) was 78 KB,
over tornado's 64 KiB limit on a request's headers, so REST events and the WebSocket stream with
a cursor got "connection closed", and every event message carried 78 KB of cursor.

Why a server-side store and not a compact encoding: any encoding of one offset per file grows
with the files (varints and a re-derived sorted writer list still come to ~9 KB at 2,048 ranks
and ~70 KB at 16,384), and would still be sent with every WebSocket event. A token names a
cursor the server keeps; its size is fixed (at most :data:`TOKEN_MAX_CHARS` characters):

* ``c1.<id>``: a *root*, the whole cursor, kept in ``<directory>/<id>.json`` (written once,
  atomically, with the job id it belongs to). REST replies (:meth:`CursorStore.issue`); its id
  is a hash of the job and the cursor, so the same cursor is one file.
* ``c1.<id>.<n>``: a *chain*: root ``<id>`` advanced by the first ``n`` deliveries of one
  subscriber (``(file, offset)`` each, :meth:`CursorChain.advance`, O(1) per event), appended
  to ``<directory>/<id>.log`` in batches (at most :data:`FLUSH_EVERY` deliveries or
  :data:`FLUSH_S` seconds behind). A chain starts again from a new root after
  ``max(CHAIN_MIN, files)`` deliveries, so resolving a token applies at most that many.

Small cursors (at most :data:`INLINE_FILES` files, at most :data:`INLINE_MAX_CHARS` characters
encoded: jobs up to ~30 ranks) stay in the old, stateless form, as do all cursors clients hold
from before; both forms are accepted everywhere (:meth:`CursorStore.resolve`).

What a token costs: after a crash of the server, a chain token may name deliveries not yet
written (at most the last :data:`FLUSH_S` s): it then resolves to the last written one, so the
client gets those events again, never fewer. A token of another server, another job, or one
removed (the store keeps the newest :data:`MAX_FILES` roots) is a SpecError that says to omit
the cursor.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import threading
import time
from collections import OrderedDict

from hyperpod_lab.atomicfile import write_atomic
from hyperpod_lab.errors import SpecError
from hyperpod_lab.events import EVENT_CURSOR_ERROR, EVENT_CURSOR_KEY, decode_cursor, encode_cursor

TOKEN_PREFIX = "c1."
#: longest token: ``c1.`` + a 22-character id + ``.`` + ``n`` in base 36
TOKEN_MAX_CHARS = 40
INLINE_FILES = 32
INLINE_MAX_CHARS = 2048
CHAIN_MIN = 1024
FLUSH_EVERY = 256
FLUSH_S = 0.5
MAX_FILES = 20000
MEMORY_ROOTS = 64

_TOKEN_RE = re.compile(r"c1\.([A-Za-z0-9_-]{16,22})(?:\.([0-9a-z]{1,12}))?")


class CursorStore:
    """Roots and chains of cursors (see the module docstring).

    Args:
        directory: where roots and chain logs are kept (created 0700); None: in memory only
            (a restarted server then refuses its old tokens).

    Attributes:
        roots_written: roots written so far (tests, benchmarks).
    """

    def __init__(self, directory: str | None = None):
        self.dir = directory
        if directory:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        self._lock = threading.Lock()
        self._mem: OrderedDict[str, tuple[str, dict[str, int], list]] = OrderedDict()  # id -> (job, root, deliveries)
        self.roots_written = 0

    # ---- issuing -----------------------------------------------------------------------
    def issue(self, job_id: str, cursor: dict[str, int]) -> str:
        """The cursor a client gets for ``cursor`` of job ``job_id``: the old form when small,
        else a root token ``c1.<id>`` (at most :data:`TOKEN_MAX_CHARS` characters)."""
        if len(cursor) <= INLINE_FILES:
            text = encode_cursor(cursor)
            if len(text) <= INLINE_MAX_CHARS:
                return text
        raw = json.dumps({"job": job_id, "cursor": cursor}, sort_keys=True, separators=(",", ":")).encode()
        rid = hashlib.sha256(raw).hexdigest()[:22]
        self._keep(rid, job_id, dict(cursor), [], raw)
        return TOKEN_PREFIX + rid

    def chain(self, job_id: str) -> "CursorChain":
        """A subscriber's chain of tokens (one per event delivered; see :class:`CursorChain`)."""
        return CursorChain(self, job_id)

    def _keep(self, rid: str, job_id: str, root: dict[str, int], deliveries: list, raw: bytes | None = None) -> None:
        with self._lock:
            self._mem[rid] = (job_id, root, deliveries)
            self._mem.move_to_end(rid)
            while len(self._mem) > MEMORY_ROOTS:
                self._mem.popitem(last=False)
        if self.dir is None:
            return
        path = os.path.join(self.dir, rid + ".json")
        if not os.path.exists(path):
            if raw is None:
                raw = json.dumps({"job": job_id, "cursor": root}, sort_keys=True, separators=(",", ":")).encode()
            write_atomic(path, raw, mode=0o600, fsync=False)
            self.roots_written += 1
            if self.roots_written % 1000 == 0:
                self._prune()

    def forget(self, rid: str) -> None:
        """Drop root ``rid`` from memory (kept on disk: :meth:`resolve` reads it again)."""
        with self._lock:
            self._mem.pop(rid, None)

    def _append(self, rid: str, items: list[tuple[str, int]]) -> None:
        if self.dir is None or not items:
            return
        fd = os.open(os.path.join(self.dir, rid + ".log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with open(fd, "a", encoding="ascii") as f:
            f.write("".join(f"{name} {end}\n" for name, end in items))

    def _prune(self) -> None:
        """Keep the newest :data:`MAX_FILES` roots (and their logs)."""
        try:
            with os.scandir(self.dir) as it:
                roots = [(e.stat().st_mtime, e.name[:-5]) for e in it if e.name.endswith(".json")]
        except OSError:
            return
        for _, rid in sorted(roots)[:max(0, len(roots) - MAX_FILES)]:
            for ext in (".json", ".log"):
                try:
                    os.unlink(os.path.join(self.dir, rid + ext))
                except OSError:
                    pass

    # ---- resolving ---------------------------------------------------------------------
    def resolve(self, job_id: str, text: str | None, *, field: str = "cursor", decode=None) -> dict[str, int]:
        """The cursor ``text`` names: a token of this store, or the old form read by ``decode``
        (default :func:`hyperpod_lab.events.decode_cursor`); None/"" is ``{}``.

        Raises:
            SpecError: (``field``) not a cursor, a token of another job, or one this store does
                not hold (another server's, or removed); the message says to omit it.
        """
        if not text or not text.startswith(TOKEN_PREFIX):
            return decode(text) if decode is not None else decode_cursor(text, field=field)
        m = _TOKEN_RE.fullmatch(text)
        if m is None:
            raise SpecError(field, EVENT_CURSOR_ERROR)
        rid, n = m.group(1), int(m.group(2), 36) if m.group(2) else 0
        entry = self._load(rid)
        if entry is None:
            raise SpecError(field, "names a cursor this server no longer holds (or another server's); omit it to "
                                   "start from the first event")
        job, root, deliveries = entry
        if job != job_id:
            raise SpecError(field, f"is a cursor of another job; {EVENT_CURSOR_ERROR}")
        cur = dict(root)
        for name, end in deliveries[:n]:
            cur[name] = end
        return cur

    def _load(self, rid: str) -> tuple[str, dict[str, int], list] | None:
        with self._lock:
            entry = self._mem.get(rid)
            if entry is not None:
                self._mem.move_to_end(rid)
                return entry
        if self.dir is None:
            return None
        try:
            with open(os.path.join(self.dir, rid + ".json"), "rb") as f:
                d = json.loads(f.read())
            job, root = str(d["job"]), {str(k): int(v) for k, v in d["cursor"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        deliveries: list[tuple[str, int]] = []
        try:
            with open(os.path.join(self.dir, rid + ".log"), encoding="ascii", errors="replace") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and EVENT_CURSOR_KEY.fullmatch(parts[0]) and parts[1].isdigit():
                        deliveries.append((parts[0], int(parts[1])))
        except OSError:
            pass
        with self._lock:
            self._mem[rid] = (job, root, deliveries)
        return job, root, deliveries


class CursorChain:
    """One subscriber's cursors, one per event it is sent: :meth:`advance` after each delivery
    (O(1): the old form for a small cursor; else the chain's root and how many deliveries
    follow it). Not thread-safe (one subscriber, on the IOLoop)."""

    def __init__(self, store: CursorStore, job_id: str):
        self.store, self.job_id = store, job_id
        self.rid: str | None = None
        self.deliveries: list[tuple[str, int]] = []
        self.limit = CHAIN_MIN
        self._unflushed = 0
        self._flushed_at = time.monotonic()

    def reset(self) -> None:
        """The subscriber's cursor changed other than by :meth:`advance`: the next token starts a
        new root."""
        self._retire()
        self.rid = None

    def _retire(self) -> None:
        """Write the current root's deliveries and, with a directory, drop the root from memory:
        the chain moves on, and a client naming one of its tokens has it read again from disk
        (else one replay of a 2,048-rank job filled the store's :data:`MEMORY_ROOTS` with roots
        of ~2,051 files and ~2,051 deliveries each, ~30 MB of the server's RSS; issue 27)."""
        self.flush()
        if self.rid is not None and self.store.dir is not None:
            self.store.forget(self.rid)

    def advance(self, cursor: dict[str, int], name: str, end: int) -> str:
        """The token of ``cursor``, which is the previous one with ``cursor[name] = end``."""
        if len(cursor) <= INLINE_FILES:
            self.rid = None
            return encode_cursor(cursor)
        if self.rid is None or len(self.deliveries) >= self.limit:
            self._retire()
            self.rid = secrets.token_urlsafe(16)[:22]
            self.deliveries = []
            self.limit = max(CHAIN_MIN, len(cursor))
            self.store._keep(self.rid, self.job_id, dict(cursor), self.deliveries)
            return TOKEN_PREFIX + self.rid
        self.deliveries.append((name, end))
        self._unflushed += 1
        if self._unflushed >= FLUSH_EVERY or time.monotonic() - self._flushed_at > FLUSH_S:
            self.flush()
        return f"{TOKEN_PREFIX}{self.rid}.{_base36(len(self.deliveries))}"

    def flush(self) -> None:
        """Write the deliveries not yet written (the subscriber ends, the chain starts again)."""
        if self.rid is not None and self._unflushed:
            self.store._append(self.rid, self.deliveries[len(self.deliveries) - self._unflushed:])
        self._unflushed = 0
        self._flushed_at = time.monotonic()


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out
