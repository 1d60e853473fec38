"""Files replaced whole: a reader sees the old content or all of the new one, never a part.

The one way hyperpod-lab writes a file that another process may read while it is rewritten:
job records and exit codes, checkpoint commit markers, rank files, the supervisor's placement
record, straggler summaries, restart-storm state, memory-tier slots, ``clusters.toml``, converted
notebooks. Standard library only (torch-free: the Slurm supervisor and the local backend's
wrapper use it).

How: the data goes to ``<path>.tmp-<pid>-<8 hex>`` in the same directory, created exclusively
and without following a link (``O_CREAT | O_EXCL | O_NOFOLLOW``), optionally ``fsync``-ed, then
``os.replace``-d over ``path``; rename(2) is atomic within one file system (POSIX, "rename": "If
newpath already exists, it will be atomically replaced"). A link planted at ``path`` is replaced,
never followed. On any error the temporary file is removed and ``path`` is untouched. Readers that
list a directory skip names containing ``.tmp-``
(:func:`hyperpod_lab.runtime.checkpoint.format.is_marker_temp` for the commit marker's).
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any

__all__ = ["write_atomic", "write_json_atomic"]


def write_atomic(path: str, data: bytes | str, *, mode: int | None = None, fsync: bool = True) -> None:
    """Replace ``path``'s content with ``data`` atomically.

    Args:
        path: the file (its directory must exist).
        data: bytes, or text written as UTF-8.
        mode: the new file's permission bits, exactly (e.g. ``0o600``); None: ``0o666`` less the
            process umask, as ``open(path, "w")`` would give.
        fsync: flush the data to the device before the rename (a crash right after leaves the new
            content, not an empty file); off for tmpfs and for files rewritten every second.

    Raises:
        OSError: the directory is missing or not writable, or the disk is full (``path`` keeps its
            old content; the error names ``path``, and says "no space" for ENOSPC/EDQUOT).
    """
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = f"{path}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
            if mode is not None:
                os.fchmod(fd, mode)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.errno is not None and e.filename in (None, tmp):
            # name the file the caller wrote, not our temporary name (the errno picks the subclass)
            why = "no space left on the device" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror
            raise OSError(e.errno, f"{why}: could not replace it (it keeps its old content)", path) from e
        raise


def write_json_atomic(path: str, obj: Any, *, mode: int | None = None, fsync: bool = True) -> None:
    """Write ``obj`` as JSON (keys sorted, one trailing newline) to ``path`` atomically; see
    :func:`write_atomic` for ``mode`` and ``fsync``.

    Raises:
        TypeError, ValueError: ``obj`` is not JSON-serialisable (nothing is written).
        OSError: as :func:`write_atomic`.
    """
    write_atomic(path, json.dumps(obj, sort_keys=True) + "\n", mode=mode, fsync=fsync)
