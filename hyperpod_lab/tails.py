"""Every event file's new bytes in one call: the directory's listing with sizes and, for each
file that grew past its start offset, its bytes from there (bounded), read where the files are.

Why (issue 27, item 2): over SFTP an :class:`~hyperpod_lab.events.EventReader` poll cost one
listing plus five requests per grown file (``lstat``, ``open``, ``fstat``, ``read``, ``close``):
2,305 files at 2,048 ranks took 102.8 s for the first read and 373 ms for a steady poll with
10 % of the writers grown. This program runs on the login node as **one command** over the SSH
connection already open (``python -I -S -c <this file's source>``, :func:`program_argv`, as
:mod:`hyperpod_lab.envexec` does) and stays, answering every poll of that connection: each
request is one line of JSON on its standard input (the directory is data, never a word a shell
reads), each reply a length line and JSON on its standard output with each file's bytes in
base64. So a poll costs one request and its answer however many writers the job has (a new
command per poll would cost an SSH session's start each time: 110-260 ms on the dev cluster's
sshd on this loaded machine, more than the SFTP listing it saves on a small job), and a steady
poll reads (there, from the file system) only the files that grew. Locally
(:class:`~hyperpod_lab.events.LocalFiles`) the same :func:`read_tails` runs in process.

Request (JSON object): ``dir`` (the events directory), ``starts`` (``{file name: byte offset}``:
where to read from; missing names: 0), ``wants`` (``{file name: bytes}``: a smaller budget for a
file, <= 0: no read; missing names: ``max_bytes``), ``max_bytes`` (most bytes read of one file,
extended to the end of a longer first line; null: to the end), ``suffix`` (only names ending so
are read), ``base`` (optional: the ``gen`` of an earlier reply for this directory; then
``starts`` holds only the offsets that differ from that request's, and ``drop`` the names of
that request that this one has not: as if never sent). ``starts["changes.log"]``:
the change log's offset the last reply gave (:class:`FileTailer`: then only the files named in
the log past it, and those in ``wants``, are probed). Reply: ``{"sizes": {name:
bytes}, "data": {name: base64}, "errors": {name: text}, "gen": n}``; ``sizes`` lists every
regular file whose size is not its start (symbolic links and directories left out; {} for a
missing directory), with the caveats of :class:`FileTailer`, but for ``changes.log``, whose entry is
the offset for the next request (the log's size before any file was probed) when it moved;
``{"resend": true}`` when the program
does not hold ``base`` (it keeps the last request of 64 directories): the client sends every
offset again. A file is opened with ``O_NOFOLLOW`` and read only when it still is a regular file.

The program keeps every event file it read open (:class:`FileTailer`) and remembers each
directory's last offsets (:class:`Program`), so a steady poll sends the offsets that moved and
probes only the files the job's change log names (one ``pread`` of one byte per file that did
not grow where there is no log), instead of listing and ``stat``ing every file.

Standard library only (it runs on the login node with the profile's ``python``).
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Iterable

#: exit status of the program when its request is not valid JSON of the documented shape
BAD_REQUEST = 2


def read_span(read, off: int, size: int, want: int | None) -> bytes:
    """Bytes of one file from ``off``: ``read(offset, length)`` (length None: to the end) for at
    most ``want`` bytes (None: all), extended (doubling) to the end of a first line longer than
    ``want`` while the file (``size`` bytes) has more."""
    if want is None:
        return read(off, None)
    want = max(1, int(want))
    chunk = read(off, want)
    end = chunk.rfind(b"\n")
    while end < 0 and len(chunk) >= want and off + len(chunk) < size:  # one line longer than want
        more = read(off + len(chunk), want)
        if not more:
            break
        chunk += more
        end = chunk.rfind(b"\n")
        want *= 2
    return chunk


def _pread(fd: int):
    def read(off: int, n: int | None) -> bytes:
        if n is None:
            parts = []
            while True:
                b = os.pread(fd, 1 << 20, off)
                if not b:
                    return b"".join(parts)
                parts.append(b)
                off += len(b)
        out = b""
        while len(out) < n:
            b = os.pread(fd, n - len(out), off + len(out))
            if not b:
                break
            out += b
        return out
    return read


def _listing(directory: str) -> dict[str, tuple[int, int]] | None:
    """``{name: (size in bytes, inode)}`` of the regular files of ``directory`` (links and
    directories left out); None when the directory is missing."""
    out: dict[str, tuple[int, int]] = {}
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        out[e.name] = (e.stat(follow_symlinks=False).st_size, e.inode())
                except OSError:
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return None
    return out


def _read_grown(directory: str, sizes: dict[str, int], starts: dict[str, int], wants: dict[str, int],
                max_bytes: int | None, suffix: str) -> tuple[dict[str, bytes], dict[str, str]]:
    """The bytes of each ``*suffix`` file of ``sizes`` past its start (opened and closed here)."""
    data: dict[str, bytes] = {}
    errors: dict[str, str] = {}
    for name in sorted(sizes):
        start = int(starts.get(name, 0))
        want = wants.get(name, max_bytes)
        if not name.endswith(suffix) or sizes[name] <= start or (want is not None and want <= 0):
            continue
        try:
            fd = _open_regular(os.path.join(directory, name))
        except OSError as e:
            errors[name] = f"{type(e).__name__}: {e.strerror or e}"
            continue
        try:
            size = max(sizes[name], os.fstat(fd).st_size)
            data[name] = read_span(_pread(fd), start, size, want)
        except OSError as e:
            errors[name] = f"{type(e).__name__}: {e.strerror or e}"
        finally:
            os.close(fd)
    return data, errors


def _open_regular(path: str) -> int:
    """A read-only descriptor of ``path``, never through a link. Raises OSError (ELOOP for a
    link; "not a regular file" for anything else that is not one)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file: not read")
    except OSError:
        os.close(fd)
        raise
    return fd


def read_tails(directory: str, starts: dict[str, int], wants: dict[str, int] | None = None,
               max_bytes: int | None = None, suffix: str = ".jsonl"
               ) -> tuple[dict[str, int], dict[str, bytes], dict[str, str]]:
    """This machine's files: ``(sizes, data, errors)`` as the module docstring's reply (data as
    bytes). ``sizes``: every regular file of ``directory`` whose size (bytes) is not its start
    offset (so an idle poll's reply is empty whatever the number of files); ``data``: the bytes read of
    each file named ``*suffix`` whose size is past its start; ``errors``: a file that could not
    be read (replaced by a link, vanished) and why. Never raises for one file. Stateless: it
    lists and ``stat``s every file (a :class:`FileTailer` does not, poll after poll)."""
    before = _changes_size(directory)
    listing = _listing(directory)
    if listing is None:
        return {}, {}, {}
    return _read_listed(directory, listing, starts, wants or {}, max_bytes, suffix, before)


def _read_listed(directory: str, listing: dict, starts: dict[str, int], wants: dict[str, int],
                 max_bytes: int | None, suffix: str, changes: int | None
                 ) -> tuple[dict[str, int], dict[str, bytes], dict[str, str]]:
    """:func:`read_tails`'s reply from a fresh ``listing`` (:func:`_listing`): only what changed
    comes back (a file at its start offset is left out: the caller knows it). ``changes``: the
    change log's size taken before the listing (what the reply gives as its offset: every event
    appended after it is named in the log past it), None when there is none."""
    sizes = {k: v[0] for k, v in listing.items() if v[0] != starts.get(k, 0)}
    sizes.pop(CHANGES, None)
    if changes is not None and changes != starts.get(CHANGES):
        sizes[CHANGES] = changes
    data, errors = _read_grown(directory, sizes, starts, wants, max_bytes, suffix)
    return sizes, data, errors


def _changes_size(directory: str) -> int | None:
    """The size (bytes) of ``directory``'s change log, None when it has none (or not a regular file)."""
    try:
        st = os.lstat(os.path.join(directory, CHANGES))
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


#: a :class:`FileTailer` lists a directory again (and ``stat``s every file) at least this often,
#: seconds, even when the directory's mtime says no file was created or removed
RELIST_S = 10.0
#: a directory whose mtime is this recent (ns) is listed again at the next poll (a file created in
#: the same timestamp tick as the last change would not change the mtime)
_SETTLE_NS = 100_000_000
_PROBE = PROBE_BYTES = 1 << 16  #: bytes a FileTailer's fast poll asks of each file (at most max_bytes)
#: the job's change log in its events directory: each writer appends its file's name and a newline
#: after each event it appends (:class:`hyperpod_lab.events.EventWriter`), so a poll learns which
#: files grew from one file instead of probing every file (see :class:`FileTailer`)
CHANGES = "changes.log"
#: most bytes of the change log one fast poll reads (about 4,000 events); more since the client's
#: offset, and the poll probes every file instead (cheaper than reading the log by then)
CHANGES_MAX = 1 << 16


class FileTailer:
    """:func:`read_tails`, poll after poll, at a cost set by the files that grew rather than by
    how many files there are (issue 27 item 2: 2,051 event files at 2,048 ranks).

    It keeps each ``*suffix`` file of a directory open and, while the directory's mtime (which
    changes when a file is created, removed or renamed in it) is what it was at the last listing
    and that listing is under ``relist_s`` old, reads nothing but one ``pread`` of one byte per
    file at its start offset (a file with no new byte costs that call and no path lookup), then
    ``fstat`` and the bytes of each file that grew. Otherwise it lists the directory and
    ``stat``s every file as :func:`read_tails` does, opens the new files and closes those
    removed or replaced (another inode under the name). Measured on this machine: 0.37 us a file
    for the ``pread`` loop against 2.7 us for a listing with ``stat`` (2,051 files: 0.77 ms
    against 5.6 ms).

    **The change log** (:data:`CHANGES`, issue 27 item 2). Every
    :class:`~hyperpod_lab.events.EventWriter` appends its file's name to ``changes.log`` after
    each event. A client that passes the log offset of its last reply (``starts["changes.log"]``,
    which every reply gives in ``sizes`` when it moved) gets a fast poll that reads the log past
    that offset and probes only the files named there and the files in ``wants`` (the client's
    files with bytes it has not taken yet: a page cut short, a torn last line), so a steady poll
    costs what changed, not what exists: at 2,048 ranks 25 probes instead of 515, and on a
    shared file system (Lustre: a glimpse of the file's size from its OST a probe) that is the
    difference between one round trip and hundreds. Why it sees every append: the writer names
    its file after the append is complete, and the offset a reply gives is the log's end taken
    before any file is probed, so an append a probe missed is named past it. The log is a hint:
    a name lost (a writer killed between its event and its name; on NFS, whose ``O_APPEND`` is
    not atomic across clients, two names written over each other) delays that event to the
    next listing (``relist_s``), never loses it. A file that a listing finds grown while the
    log named it nowhere since the last listing (a writer that does not name its file: an older
    runtime on the cluster than the client's) is probed by every fast poll from then on
    (:meth:`_judge_silent`). Without an offset, with no log (a job written before it) or more
    than :data:`CHANGES_MAX` bytes behind, every open file is probed.

    What a fast poll does not see until the next listing (at most ``relist_s`` seconds): a file
    that shrank below its start offset (event files only grow; a writer cuts a failed append
    back to its last complete line, never below it), except a file named in ``wants`` (a reader
    reading past a page it holds back: ``fstat`` tells), and a change to a file not named
    ``*suffix``. On a file system whose directory mtime lags behind a creation on another host
    (NFS attribute caching), a new file is seen at the next listing too; on Lustre, local file
    systems and tmpfs at once (a directory changed less than 0.1 s before a listing is listed
    again at the next poll: a file created in the same timestamp tick leaves its mtime as it was).

    Holds at most ``max_fds`` descriptors (default: a quarter of ``RLIMIT_NOFILE``'s soft limit);
    files beyond that are ``stat``ed by path each poll. Thread-safe (one lock per tailer: the
    descriptors are shared). :meth:`close` closes them.
    """

    def __init__(self, max_fds: int | None = None, relist_s: float = RELIST_S, max_dirs: int = 256):
        self.max_fds = _fd_budget() if max_fds is None else max(0, int(max_fds))
        self.relist_s = float(relist_s)
        self.max_dirs = max(1, int(max_dirs))
        self.listings = 0  #: full listings so far (for tests and benchmarks)
        #: files the last fast poll probed (None after a listing), for tests and benchmarks
        self.probed: int | None = None
        # directory -> {"mtime": ns, "at": monotonic s, "suffix": str, "names": {suffix file: inode},
        #               "fds": {name: descriptor}}
        self._dirs: dict[str, dict] = {}
        self._open = 0
        self._lock = threading.Lock()

    def read_tails(self, directory: str, starts: dict[str, int], wants: dict[str, int] | None = None,
                   max_bytes: int | None = None, suffix: str = ".jsonl"
                   ) -> tuple[dict[str, int], dict[str, bytes], dict[str, str]]:
        """As :func:`read_tails` (the same reply for the same files), with the caveats above."""
        wants = wants or {}
        with self._lock:
            try:
                mtime = os.stat(directory).st_mtime_ns
            except (FileNotFoundError, NotADirectoryError):
                self._forget(directory)
                return {}, {}, {}
            d = self._dirs.get(directory)
            now = time.monotonic()
            if d is None or d["mtime"] != mtime or d["suffix"] != suffix or now - d["at"] >= self.relist_s:
                return self._relist(directory, mtime, now, starts, wants, max_bytes, suffix)
            self._dirs[directory] = self._dirs.pop(directory)  # most recently used last
            sizes: dict[str, int] = {}
            data: dict[str, bytes] = {}
            errors: dict[str, str] = {}
            by_path: dict[str, int] = {}
            fds = d["fds"]
            # which files grew: the change log's names past the client's offset, and the files the
            # client is behind in (``wants``); else (no log, no offset, too far behind) every file
            rung, changes = self._rung(d["log"], starts.get(CHANGES))
            if changes is not None and changes != starts.get(CHANGES):
                sizes[CHANGES] = changes
            silent = d["silent"]
            if rung is not None:
                silent.difference_update(rung)  # (it names its file after all)
            check = None if rung is None else rung.union(wants, silent)
            names = d["names"]
            if check is None:  # opened on the first fast poll (a one-off read opens nothing)
                closed = [n for n in names if n not in fds] if len(fds) < len(names) else ()
            else:  # (with the log: when a file is named in it)
                closed = [n for n in check if n not in fds and n in names]
            for name in closed:
                if self._open_fd(directory, name, names[name], fds) is None:
                    try:  # over the descriptor budget, or not openable: by path
                        st = os.lstat(os.path.join(directory, name))
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode) and st.st_size != starts.get(name, 0):
                        by_path[name] = st.st_size
            # the one loop over files: a read at each start offset (as cheap for 64 KiB as for
            # one byte when nothing is there), which is the whole of a grown file's new bytes
            # when it ends before what was asked
            probe = _PROBE if max_bytes is None else max(1, min(_PROBE, max_bytes))
            pread, at = os.pread, starts.get
            probed = fds.items() if check is None else [(name, fds[name]) for name in check if name in fds]
            self.probed = len(probed) + len(by_path)
            grown = [(name, fd, b) for name, fd in probed if (b := pread(fd, probe, at(name, 0)))]
            for name, fd, b in grown:
                start, want = starts.get(name, 0), wants.get(name, max_bytes)
                try:
                    if len(b) < probe and (want is None or 0 < len(b) <= want):
                        sizes[name], data[name] = start + len(b), b
                        continue
                    sizes[name] = size = os.fstat(fd).st_size
                    if want is None or want > 0:
                        data[name] = read_span(_pread(fd), start, size, want)
                except OSError as e:
                    errors[name] = f"{type(e).__name__}: {e.strerror or e}"
            for name in wants:  # a file read past a page held back (few): one that shrank is said
                fd = fds.get(name)
                if fd is not None and name not in sizes:
                    size = os.fstat(fd).st_size
                    if size < starts.get(name, 0):
                        sizes[name] = size
            more, more_errors = _read_grown(directory, by_path, starts, wants, max_bytes, suffix)
            sizes.update(by_path)
            data.update(more)
            errors.update(more_errors)
            return sizes, data, errors

    @staticmethod
    def _rung(log: int | None, offset: int | None) -> tuple[set[str] | None, int | None]:
        """``(names, offset)``: the file names the change log (descriptor ``log``) holds past
        ``offset`` (its whole lines) and the offset past them; ``(None, size now)`` when there is
        no offset or it is not within :data:`CHANGES_MAX` bytes of the log's end (then every file
        is probed); ``(None, None)`` without a log."""
        if log is None:
            return None, None
        try:
            end = os.fstat(log).st_size
            if offset is None or not 0 <= offset <= end or end - offset > CHANGES_MAX:
                return None, end
            chunk = os.pread(log, end - offset, offset) if end > offset else b""
        except OSError:
            return None, None
        cut = chunk.rfind(b"\n") + 1
        return set(chunk[:cut].decode("ascii", "replace").split("\n")), offset + cut

    def _open_fd(self, directory: str, name: str, inode: int, fds: dict[str, int]) -> int | None:
        """A descriptor of ``name`` kept in ``fds`` when the budget allows and it still is the
        regular file listed (``inode``), else None."""
        if self._open >= self.max_fds:
            return None
        try:
            fd = _open_regular(os.path.join(directory, name))
        except OSError:
            return None
        if os.fstat(fd).st_ino != inode:
            os.close(fd)
            return None
        fds[name] = fd
        self._open += 1
        return fd

    def _relist(self, directory, mtime, now, starts, wants, max_bytes, suffix):
        self.listings += 1
        self.probed = None
        changes = _changes_size(directory)  # before the listing: the offset the reply gives
        listing = _listing(directory)
        if listing is None:
            self._forget(directory)
            return {}, {}, {}
        d = self._dirs.pop(directory, None) or {"fds": {}, "names": {}, "log": None, "silent": set(),
                                                "listed": None, "log_at": None}
        fds = d["fds"]
        if d["log"] is not None:  # opened again: the log may be another file under its name
            os.close(d["log"])
            self._open -= 1
            d["log"] = None
        if changes is not None and self._open < self.max_fds:
            try:
                d["log"] = _open_regular(os.path.join(directory, CHANGES))
                self._open += 1
            except OSError:
                pass
        names = {n: v[1] for n, v in listing.items() if n.endswith(suffix)}
        self._judge_silent(d, listing, suffix, changes)
        for name in list(fds):  # removed, or another file under the name
            if names.get(name) != d["names"].get(name):
                os.close(fds.pop(name))
                self._open -= 1
        while len(self._dirs) >= self.max_dirs:  # the least recently used directory goes
            self._forget(next(iter(self._dirs)))
        # a directory changed within the file system's timestamp granularity (ext4: a clock tick)
        # could change again with the same mtime: not trusted until a listing after that tick
        if time.time_ns() - mtime < _SETTLE_NS:
            now = float("-inf")
        self._dirs[directory] = {"mtime": mtime, "at": now, "suffix": suffix, "fds": fds, "names": names,
                                 "log": d["log"], "silent": d["silent"], "listed": d["listed"],
                                 "log_at": d["log_at"]}
        return _read_listed(directory, listing, starts, wants, max_bytes, suffix, changes)

    @staticmethod
    def _judge_silent(d: dict, listing: dict, suffix: str, changes: int | None) -> None:
        """At a listing: the files that grew since the last listing while the change log did not
        name them join ``d["silent"]`` (a writer that does not name its file: a runtime older than
        the log on the cluster, or names lost on NFS), which every fast poll probes whatever the
        log says (a name in the log takes its file out again). Judged only where the log between
        the two listings is at most 1 MiB; ``d["listed"]`` and ``d["log_at"]`` then move on."""
        before, log_at, log = d["listed"], d["log_at"], d["log"]
        if before is not None and log_at is not None and log is not None and changes is not None:
            try:
                end = os.fstat(log).st_size  # to its end now: names written since the listing too
                chunk = os.pread(log, end - log_at, log_at) if 0 <= log_at <= end and end - log_at <= 1 << 20 else None
            except OSError:
                chunk = None
            if chunk is not None:
                named = set(chunk.decode("ascii", "replace").split("\n"))
                d["silent"].difference_update(named)
                d["silent"].update(n for n, (size, _) in listing.items()
                                   if n.endswith(suffix) and size > before.get(n, size) and n not in named)
        d["listed"] = {n: v[0] for n, v in listing.items() if n.endswith(suffix)}
        d["log_at"] = changes

    def _forget(self, directory: str) -> None:
        d = self._dirs.pop(directory, None) or {}
        for fd in [*d.get("fds", {}).values(), *([d["log"]] if d.get("log") is not None else [])]:
            os.close(fd)
            self._open -= 1

    def close(self) -> None:
        """Close every descriptor (the tailer can be used again: it lists afresh)."""
        with self._lock:
            for directory in list(self._dirs):
                self._forget(directory)


def _fd_budget() -> int:
    try:
        import resource
    except ImportError:  # (not POSIX)
        return 0
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 4096 if soft == resource.RLIM_INFINITY else max(0, soft // 4)


def request(directory: str, starts: dict[str, int], wants: dict[str, int] | None = None,
            max_bytes: int | None = None, suffix: str = ".jsonl", base: int | None = None,
            drop: Iterable[str] = ()) -> bytes:
    """The program's standard input for these arguments (see :func:`read_tails`). With ``base``
    (the ``gen`` of the program's last reply for ``directory``), ``starts`` holds only the offsets
    that differ from that request's and ``drop`` the names of that request this one has not (then
    as if never sent: an event file read from 0; no change log offset: every file probed)."""
    req = {"dir": directory, "starts": starts, "wants": wants or {}, "max_bytes": max_bytes, "suffix": suffix}
    if base is not None:
        req["base"] = int(base)
        if drop:
            req["drop"] = sorted(drop)
    return json.dumps(req, separators=(",", ":")).encode() + b"\n"


def parse_reply(text: str | bytes
                ) -> tuple[dict[str, int], dict[str, bytes], dict[str, str], int | None, int | None] | None:
    """``(sizes, data, errors, gen, probed)`` from one reply's JSON (``gen``: what the next
    request's ``base`` names, None if the reply has none; ``probed``: the files the program's
    fast poll probed, None after a listing); None for the program's "send every offset
    again" (a ``base`` it does not hold). Raises ValueError for anything else (a login node's
    shell banner, a truncated reply)."""
    try:
        d = json.loads(text)
        if d.get("resend") is True:
            return None
        sizes = {str(k): int(v) for k, v in d["sizes"].items()}
        data = {str(k): base64.b64decode(v, validate=True) for k, v in d["data"].items()}
        errors = {str(k): str(v) for k, v in d.get("errors", {}).items()}
        gen, probed = d.get("gen"), d.get("probed")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a read_tails reply ({type(e).__name__}: {e}): {text[:200]!r}") from None
    whole = lambda n: n if isinstance(n, int) and not isinstance(n, bool) else None  # noqa: E731
    return sizes, data, errors, whole(gen), whole(probed)


def program_argv(python: str) -> list[str]:
    """``python -I -S -c <this file's source>``: the argv that runs :func:`main` on a login node
    (its request on standard input), by :func:`hyperpod_lab.envexec.source_argv` (``-m
    hyperpod_lab.tails``, which needs the package there, when the source cannot be read)."""
    from hyperpod_lab.envexec import source_argv  # here, not above: the login node runs this file alone

    return source_argv(python, __file__, "hyperpod_lab.tails")


class Program:
    """What the program keeps between the requests of one connection: a :class:`FileTailer` (open
    event files) and, per directory, the offsets of its last request and their ``gen``, so that a
    request may send only the offsets that changed (``base``): a steady poll of 2,048 writers
    whose cursor moved for 205 of them sends 205 offsets, not 2,051 (44 KB)."""

    def __init__(self, max_dirs: int = 64):
        self.tailer = FileTailer(max_fds=_raise_fd_limit(), max_dirs=max_dirs)
        self.max_dirs = max_dirs
        self._last: dict[str, tuple[int, dict[str, int]]] = {}  # directory -> (gen, offsets)
        self._gen = 0

    def reply(self, req: dict) -> bytes:
        """The reply to one request (a dict as :func:`request` makes), JSON. Raises ValueError,
        KeyError, TypeError for a request of another shape."""
        directory = str(req["dir"])
        starts = {str(k): int(v) for k, v in dict(req.get("starts") or {}).items()}
        base = req.get("base")
        if base is not None:
            last = self._last.get(directory)
            if last is None or last[0] != int(base):
                return b'{"resend":true}'
            starts = {**last[1], **starts}
            for name in req.get("drop") or ():
                starts.pop(str(name), None)
        wants = {str(k): int(v) for k, v in dict(req.get("wants") or {}).items()}
        max_bytes = req.get("max_bytes")
        max_bytes = None if max_bytes is None else int(max_bytes)
        sizes, data, errors = self.tailer.read_tails(directory, starts, wants, max_bytes,
                                                     str(req.get("suffix", ".jsonl")))
        self._gen += 1
        self._last.pop(directory, None)
        while len(self._last) >= self.max_dirs:
            self._last.pop(next(iter(self._last)))
        self._last[directory] = (self._gen, starts)
        out = {"sizes": sizes, "data": {k: base64.b64encode(v).decode("ascii") for k, v in data.items()},
               "errors": errors, "gen": self._gen, "probed": self.tailer.probed}
        return json.dumps(out, separators=(",", ":")).encode()


def _raise_fd_limit(want: int = 65536) -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` towards ``want`` (the program's own limit, on
    the login node); the descriptors a :class:`FileTailer` may hold: all but 64 of it."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        return max(0, min(soft, want) - 64)
    except (ImportError, ValueError, OSError):
        return 0


def main() -> int:
    """Answer requests until standard input ends: each request one line of JSON, each reply
    ``<length in bytes>\\n`` then that many bytes of JSON (so one process serves every poll of
    a connection: one round trip each, no new session)."""
    out = sys.stdout.buffer
    program = Program()
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            body = program.reply(json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            sys.stderr.write(f"tails: bad request: {type(e).__name__}: {e}\n")
            return BAD_REQUEST
        out.write(b"%d\n" % len(body) + body)
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
