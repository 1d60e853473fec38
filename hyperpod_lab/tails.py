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
are read). Reply: ``{"sizes": {name: bytes}, "data": {name: base64}, "errors": {name: text}}``;
``sizes`` lists every regular file whose size is not its start (symbolic links and directories
left out; {} for a missing directory). A file is opened with ``O_NOFOLLOW`` and read only when it still is a regular file.

Standard library only (it runs on the login node with the profile's ``python``).
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys

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


def read_tails(directory: str, starts: dict[str, int], wants: dict[str, int] | None = None,
               max_bytes: int | None = None, suffix: str = ".jsonl"
               ) -> tuple[dict[str, int], dict[str, bytes], dict[str, str]]:
    """This machine's files: ``(sizes, data, errors)`` as the module docstring's reply (data as
    bytes). ``sizes``: every regular file of ``directory`` whose size (bytes) is not its start
    offset (so an idle poll's reply is empty whatever the number of files); ``data``: the bytes read of
    each file named ``*suffix`` whose size is past its start; ``errors``: a file that could not
    be read (replaced by a link, vanished) and why. Never raises for one file."""
    wants = wants or {}
    sizes: dict[str, int] = {}
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        sizes[e.name] = e.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return {}, {}, {}
    # only what changed comes back: a file at its start offset is left out (the caller knows it)
    sizes = {k: v for k, v in sizes.items() if v != starts.get(k, 0)}
    data: dict[str, bytes] = {}
    errors: dict[str, str] = {}
    for name in sorted(sizes):
        start = int(starts.get(name, 0))
        want = wants.get(name, max_bytes)
        if not name.endswith(suffix) or sizes[name] <= start or (want is not None and want <= 0):
            continue
        try:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as e:
            errors[name] = f"{type(e).__name__}: {e.strerror or e}"
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                errors[name] = "not a regular file: not read"
                continue
            size = max(sizes[name], st.st_size)
            data[name] = read_span(_pread(fd), start, size, want)
        except OSError as e:
            errors[name] = f"{type(e).__name__}: {e.strerror or e}"
        finally:
            os.close(fd)
    return sizes, data, errors


def request(directory: str, starts: dict[str, int], wants: dict[str, int] | None = None,
            max_bytes: int | None = None, suffix: str = ".jsonl") -> bytes:
    """The program's standard input for these arguments (see :func:`read_tails`)."""
    return json.dumps({"dir": directory, "starts": starts, "wants": wants or {}, "max_bytes": max_bytes,
                       "suffix": suffix}, separators=(",", ":")).encode() + b"\n"


def parse_reply(text: str | bytes) -> tuple[dict[str, int], dict[str, bytes], dict[str, str]]:
    """``(sizes, data, errors)`` from one reply's JSON. Raises ValueError for anything else (a
    login node's shell banner, a truncated reply)."""
    try:
        d = json.loads(text)
        sizes = {str(k): int(v) for k, v in d["sizes"].items()}
        data = {str(k): base64.b64decode(v, validate=True) for k, v in d["data"].items()}
        errors = {str(k): str(v) for k, v in d.get("errors", {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a read_tails reply ({type(e).__name__}: {e}): {text[:200]!r}") from None
    return sizes, data, errors


def program_argv(python: str) -> list[str]:
    """``python -I -S -c <this file's source>``: the argv that runs :func:`main` on a login node
    (its request on standard input), by :func:`hyperpod_lab.envexec.source_argv` (``-m
    hyperpod_lab.tails``, which needs the package there, when the source cannot be read)."""
    from hyperpod_lab.envexec import source_argv  # here, not above: the login node runs this file alone

    return source_argv(python, __file__, "hyperpod_lab.tails")


def reply(req: dict) -> bytes:
    """The reply to one request (a dict as :func:`request` makes), JSON. Raises ValueError,
    KeyError, TypeError for a request of another shape."""
    directory, starts = str(req["dir"]), {str(k): int(v) for k, v in dict(req.get("starts") or {}).items()}
    wants = {str(k): int(v) for k, v in dict(req.get("wants") or {}).items()}
    max_bytes = req.get("max_bytes")
    max_bytes = None if max_bytes is None else int(max_bytes)
    sizes, data, errors = read_tails(directory, starts, wants, max_bytes, str(req.get("suffix", ".jsonl")))
    out = {"sizes": sizes, "data": {k: base64.b64encode(v).decode("ascii") for k, v in data.items()},
           "errors": errors}
    return json.dumps(out, separators=(",", ":")).encode()


def main() -> int:
    """Answer requests until standard input ends: each request one line of JSON, each reply
    ``<length in bytes>\\n`` then that many bytes of JSON (so one process serves every poll of
    a connection: one round trip each, no new session)."""
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            body = reply(json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            sys.stderr.write(f"tails: bad request: {type(e).__name__}: {e}\n")
            return BAD_REQUEST
        out.write(b"%d\n" % len(body) + body)
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
