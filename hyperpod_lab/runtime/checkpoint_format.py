"""The persistent tier's format on shared storage, and its integrity checks.

Layout::

    <root>/step-00000019/           one DCP checkpoint (all ranks' files + .metadata)
    <root>/step-00000019/COMMITTED  commit marker (JSON, see below)
    <root>/corrupt-step-00000039-<epoch>/   a committed one that failed to verify or load, set
                                    aside by the restore (:func:`set_aside`); never deleted
                                    automatically

(``<root>`` is ``<job_dir>/checkpoints``, :attr:`hyperpod_lab.jobdir.JobPaths.checkpoints`.)

A checkpoint is *complete* only when its ``COMMITTED`` marker exists. The marker is written
(temporary file + ``os.replace``, :func:`write_marker`) only after every rank's files are written,
and lists every file of the checkpoint with its size and checksum::

    {"step": 19, "world_size": 2, "bytes": 1234, "time": 1795395723.4, "checksum": "crc32",
     "files": {".metadata": {"bytes": 1034, "checksum": "crc32:9f0c1a2b"},
               "__0_0.distcp": {"bytes": 200, "checksum": "crc32:..."}, ...}}

Each rank hashes the data files it wrote itself (DCP names them ``__<rank>_<n>.distcp``,
:func:`hash_rank_files`); rank 0 hashes the rest (:func:`hash_remaining`). The checksum is zlib's
CRC-32: measured here on one core, 2.6 GB/s over memory and 2.0 GB/s reading a file from the page
cache, against 0.56 GB/s for BLAKE2b and 1.5 GB/s for SHA-256; it guards against torn writes,
truncation and bit rot, not against tampering. Before a load every listed file is checked
(:func:`check_file`; :func:`partition_files` splits the files between the ranks by size). A marker
without a file list (written by an older hyperpod-lab) is loaded unverified.

The directories stay standard DCP checkpoints: ``torch.distributed.checkpoint.load`` reads them
without this library (the marker is one more file DCP ignores). Nothing here touches torch or
a process group: the collectives around these functions are :class:`~hyperpod_lab.runtime.checkpoint.Checkpointer`'s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import zlib
from typing import Any

from hyperpod_lab.runtime.context import write_json_atomic

COMMIT_MARKER = "COMMITTED"
METADATA_FILE = ".metadata"
CHECKSUM_ALGORITHM = "crc32"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_READ_CHUNK = 8 << 20  # bytes read per crc32 update


def step_dir_name(step: int) -> str:
    """``step-<step:08d>``, the directory of the checkpoint taken after 0-based ``step``."""
    return f"step-{step:08d}"


def list_checkpoints(root: str) -> list[tuple[int, str, bool]]:
    """Checkpoint directories under ``root``, newest first.

    Returns:
        ``[(step, path, complete), ...]`` sorted by step descending; ``complete`` is whether the
        commit marker exists. A missing ``root`` gives ``[]``.
    """
    out = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    for name in names:
        m = _STEP_DIR.match(name)
        path = os.path.join(root, name)
        if m and os.path.isdir(path):
            out.append((int(m.group(1)), path, os.path.exists(os.path.join(path, COMMIT_MARKER))))
    out.sort(reverse=True)
    return out


def dir_bytes(path: str) -> int:
    """Total size in bytes of the checkpoint's files under ``path`` (the commit marker excluded)."""
    total = 0
    for base, _dirs, files in os.walk(path):
        for f in files:
            if f == COMMIT_MARKER and base == path:
                continue
            try:
                total += os.path.getsize(os.path.join(base, f))
            except OSError:
                pass
    return total


# ---- integrity: checksums and the commit marker ---------------------------------------------
def file_checksum(path: str) -> tuple[int, str]:
    """Size and CRC-32 of a file, read in 8 MiB chunks (zlib releases the GIL while hashing).

    Returns:
        ``(bytes, "crc32:<8 hex digits>")``.

    Raises:
        OSError: the file cannot be read.
    """
    crc, size = 0, 0
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            crc = zlib.crc32(view[:n], crc)
            size += n
    return size, f"{CHECKSUM_ALGORITHM}:{crc:08x}"


def is_marker_temp(name: str) -> bool:
    """Whether ``name`` is a temporary file of a marker being written (``COMMITTED.tmp-<pid>``)."""
    return name.startswith(COMMIT_MARKER + ".tmp-")


def safe_relpath(rel: Any) -> bool:
    """Whether a marker's file name is a plain relative path inside the checkpoint directory."""
    if not isinstance(rel, str) or not rel or rel.startswith(("/", "\\")) or "\\" in rel or "\0" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def parse_marker(raw: bytes | str) -> dict[str, Any]:
    """Parse and check a commit marker.

    Returns:
        The marker dict; ``files`` (when present) maps safe relative paths to
        ``{"bytes": int, "checksum": str}``.

    Raises:
        ValueError: not JSON, not an object, or a malformed ``files`` table (the message says what).
    """
    try:
        marker = json.loads(raw)
        problem = None if isinstance(marker, dict) else "is not a JSON object"
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        problem = f"is not JSON ({e})"
    if problem is not None:
        raise ValueError(f"commit marker {problem}")
    files = marker.get("files")
    if files is None:
        return marker
    if not isinstance(files, dict) or not files:
        raise ValueError("commit marker's 'files' is not a non-empty object")
    for rel, meta in files.items():
        if not safe_relpath(rel):
            raise ValueError(f"commit marker lists an unsafe path {rel!r}")
        if (not isinstance(meta, dict) or isinstance(meta.get("bytes"), bool) or not isinstance(meta.get("bytes"), int)
                or not isinstance(meta.get("checksum"), str)):
            raise ValueError(f"commit marker entry for {rel!r} lacks bytes/checksum")
    return marker


def read_marker(step_dir: str) -> dict[str, Any]:
    """Read and parse ``<step_dir>/COMMITTED``.

    Raises:
        FileNotFoundError: no marker. ValueError: as :func:`parse_marker`. OSError: unreadable.
    """
    with open(os.path.join(step_dir, COMMIT_MARKER), "rb") as f:
        return parse_marker(f.read())


def check_file(step_dir: str, rel: str, meta: dict[str, Any]) -> str | None:
    """Verify one file of a checkpoint against its marker entry.

    Args:
        step_dir: the checkpoint directory.
        rel: the file's path relative to it.
        meta: ``{"bytes": int, "checksum": "crc32:<hex>"}`` from the marker.

    Returns:
        None when size and checksum match, else the reason (missing, truncated/torn, mismatch).
    """
    path = os.path.join(step_dir, rel)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return "missing (the commit marker lists it)"
    except OSError as e:
        return f"unreadable: {e}"
    if size != meta["bytes"]:
        return f"size is {size} bytes, the commit marker says {meta['bytes']} (truncated or torn write)"
    algo = meta["checksum"].split(":", 1)[0]
    if algo != CHECKSUM_ALGORITHM:
        return f"unsupported checksum algorithm {algo!r}"
    try:
        size, checksum = file_checksum(path)
    except OSError as e:
        return f"unreadable: {e}"
    if size != meta["bytes"]:
        return f"size is {size} bytes, the commit marker says {meta['bytes']} (changed while reading)"
    if checksum != meta["checksum"]:
        return f"checksum mismatch: {checksum}, the commit marker says {meta['checksum']} (corrupt data)"
    return None


def partition_files(files: dict[str, dict[str, Any]], parts: int) -> list[list[str]]:
    """Split a marker's files into ``parts`` lists of about equal total size (greedy, largest
    first; deterministic, so every rank computes the same split)."""
    out: list[list[str]] = [[] for _ in range(parts)]
    load = [0] * parts
    for rel in sorted(files, key=lambda r: (-files[r]["bytes"], r)):
        i = min(range(parts), key=lambda k: (load[k], k))
        out[i].append(rel)
        load[i] += files[rel]["bytes"]
    return out


# ---- writing: hashing a finished save, the marker ---------------------------------------------------
def hash_rank_files(step_dir: str, rank: int) -> dict[str, dict[str, Any]]:
    """Size and checksum of the data files DCP's rank ``rank`` wrote (``__<rank>_<n>.distcp``).

    Returns:
        ``{name: {"bytes": int, "checksum": "crc32:<hex>"}}`` (names relative to ``step_dir``).

    Raises:
        OSError: the directory or a file cannot be read.
    """
    own: dict[str, dict[str, Any]] = {}
    prefix = f"__{rank}_"
    for name in sorted(os.listdir(step_dir)):
        if name.startswith(prefix) and name.endswith(".distcp") and os.path.isfile(os.path.join(step_dir, name)):
            size, checksum = file_checksum(os.path.join(step_dir, name))
            own[name] = {"bytes": size, "checksum": checksum}
    return own


def hash_remaining(step_dir: str, files: dict[str, dict[str, Any]]) -> None:
    """Add every file under ``step_dir`` that ``files`` does not list yet (``.metadata``, files no
    rank claimed) to ``files``, in place; the marker, its temporary files and ``*.tmp`` are left out.

    Raises:
        OSError: a file cannot be read.
    """
    for base, dirs, names in os.walk(step_dir):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(base, name)
            rel = os.path.relpath(full, step_dir).replace(os.sep, "/")
            if rel in files or rel == COMMIT_MARKER or is_marker_temp(rel) or rel.endswith(".tmp"):
                continue
            size, checksum = file_checksum(full)
            files[rel] = {"bytes": size, "checksum": checksum}


def write_marker(step_dir: str, step: int, world_size: int, files: dict[str, dict[str, Any]]) -> int:
    """Write ``<step_dir>/COMMITTED`` atomically (fsynced temporary file, then ``os.replace``):
    from then on the checkpoint is complete.

    Args:
        step_dir: the checkpoint directory.
        step: the 0-based step it holds.
        world_size: ranks that wrote it.
        files: every file's size and checksum (:func:`hash_rank_files`, :func:`hash_remaining`).

    Returns:
        The checkpoint's size in bytes (the sum over ``files``).

    Raises:
        OSError: the marker could not be written.
    """
    nbytes = sum(f["bytes"] for f in files.values())
    write_json_atomic(os.path.join(step_dir, COMMIT_MARKER), {
        "step": step, "world_size": world_size, "bytes": nbytes, "time": time.time(),
        "checksum": CHECKSUM_ALGORITHM, "files": files})
    return nbytes


def set_aside(step_dir: str, committed: bool) -> None:
    """Move a checkpoint that failed to verify or load out of the ``step-*`` namespace, so a
    later save of its step starts clean: a committed one is renamed
    ``corrupt-step-XXXXXXXX-<epoch seconds>`` (the evidence is kept; removed if the rename
    fails), an uncommitted one deleted."""
    if committed:
        dest = os.path.join(os.path.dirname(step_dir), f"corrupt-{os.path.basename(step_dir)}-{int(time.time())}")
        try:
            os.replace(step_dir, dest)
        except OSError:
            shutil.rmtree(step_dir, ignore_errors=True)
    else:
        shutil.rmtree(step_dir, ignore_errors=True)
