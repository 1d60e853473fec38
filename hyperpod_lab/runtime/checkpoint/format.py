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
lists every file of the checkpoint with its size, CRC-32 and SHA-256, and is signed::

    {"step": 19, "world_size": 2, "bytes": 1234, "time": 1795395723.4, "checksum": "crc32",
     "digest": "sha256",
     "files": {".metadata": {"bytes": 1034, "checksum": "crc32:9f0c1a2b", "sha256": "<64 hex>"},
               "__0_0.distcp": {"bytes": 200, "checksum": "crc32:...", "sha256": "..."}, ...},
     "hmac": "<64 hex>"}

``hmac`` is HMAC-SHA256 under the job's checkpoint key (:mod:`hyperpod_lab.runtime.checkpoint.auth`) of
every other field of the marker (domain :data:`MARKER_DOMAIN`). A restore authenticates the
marker (:func:`authenticate_marker`) and then every file against its SHA-256 (:func:`check_file`)
*before* DCP reads anything: DCP unpickles ``.metadata`` and the byte items of the shards
(torch's load with ``weights_only=False``), so a checkpoint directory or S3 prefix others can write
would otherwise be code execution at restore. Every file gets a cryptographic hash, shards
included: a CRC-32 (or any non-cryptographic checksum) can be matched by a forged file of the
attacker's choosing, so a signed list of CRC-32s would not authenticate the shards. The CRC-32
stays as a cheap first check that names torn writes and bit rot as such. A marker without a valid
``hmac`` (unsigned, written by an older hyperpod-lab, or signed with another job's key) fails
authentication and the checkpoint is skipped like a corrupt one.

Each rank hashes the data files it wrote itself (DCP names them ``__<rank>_<n>.distcp``,
:func:`hash_rank_files`); rank 0 hashes the rest (:func:`hash_remaining`), in one read pass per
file for both digests (zlib and hashlib release the GIL). Measured here on one core: CRC-32 2.6
GB/s over memory and 2.0 GB/s from the page cache, SHA-256 1.5 GB/s (SHA-NI), BLAKE2b 0.56 GB/s.
Before a load every listed file is checked (:func:`check_file`; :func:`partition_files` splits the
files between the ranks by size).

The directories stay standard DCP checkpoints: ``torch.distributed.checkpoint.load`` reads them
without this library (the marker is one more file DCP ignores). Nothing here touches torch or
a process group: the collectives around these functions are :class:`~hyperpod_lab.runtime.checkpoint.persistent.Checkpointer`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import zlib
from typing import Any

from hyperpod_lab.atomicfile import write_json_atomic
from hyperpod_lab.runtime.checkpoint.auth import sign, verify

COMMIT_MARKER = "COMMITTED"
METADATA_FILE = ".metadata"
CHECKSUM_ALGORITHM = "crc32"
DIGEST_ALGORITHM = "sha256"
MARKER_DOMAIN = "hyperpod-lab checkpoint marker v1"
"""Domain string of the marker's HMAC (see :func:`authenticate_marker`)."""
AUTH_FAILED = "authentication failed"
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
def file_digests(path: str, sha256: bool = True) -> tuple[int, str, str | None]:
    """Size, CRC-32 and SHA-256 of a file, in one pass of 8 MiB reads (zlib and hashlib release
    the GIL while hashing). Opened with ``O_NOFOLLOW``: a link is not followed.

    Args:
        path: the file.
        sha256: compute the SHA-256 too (else None).

    Returns:
        ``(bytes, "crc32:<8 hex digits>", "<64 hex digits>" or None)``.

    Raises:
        OSError: the file cannot be read (or is a symbolic link).
    """
    crc, size = 0, 0
    sha = hashlib.sha256() if sha256 else None
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            crc = zlib.crc32(view[:n], crc)
            if sha is not None:
                sha.update(view[:n])
            size += n
    return size, f"{CHECKSUM_ALGORITHM}:{crc:08x}", sha.hexdigest() if sha is not None else None


def file_checksum(path: str) -> tuple[int, str]:
    """Size and CRC-32 of a file (:func:`file_digests` without the SHA-256).

    Returns:
        ``(bytes, "crc32:<8 hex digits>")``.

    Raises:
        OSError: the file cannot be read.
    """
    size, crc, _ = file_digests(path, sha256=False)
    return size, crc


def _entry(path: str) -> dict[str, Any]:
    size, crc, sha = file_digests(path)
    return {"bytes": size, "checksum": crc, DIGEST_ALGORITHM: sha}


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


def authenticate_marker(marker: dict[str, Any], key: bytes, step: int | None = None) -> str | None:
    """Check a parsed marker's HMAC under the job's checkpoint ``key`` and that it covers every
    file with a SHA-256 (so :func:`check_file` authenticates each file).

    Args:
        marker: :func:`parse_marker`'s result.
        key: the job's checkpoint key.
        step: when given, the step the marker must name (its directory's).

    Returns:
        None when authentic, else the reason, starting with ``"authentication failed"``.
    """
    body = {k: v for k, v in marker.items() if k != "hmac"}
    if "hmac" not in marker:
        return f"{AUTH_FAILED}: the marker is not signed (no HMAC: written by an older hyperpod-lab, or forged)"
    if not verify(key, MARKER_DOMAIN, body, marker.get("hmac")):
        return f"{AUTH_FAILED}: the marker's HMAC does not match (altered, or signed with another job's key)"
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return f"{AUTH_FAILED}: the signed marker lists no files"
    for rel, meta in files.items():
        sha = meta.get(DIGEST_ALGORITHM)
        if not (isinstance(sha, str) and len(sha) == 64):
            return f"{AUTH_FAILED}: the marker has no {DIGEST_ALGORITHM} for {rel}"
    if step is not None and marker.get("step") != step:
        return f"{AUTH_FAILED}: the marker is of step {marker.get('step')}, not of step {step}"
    return None


def check_file(step_dir: str, rel: str, meta: dict[str, Any]) -> str | None:
    """Verify one file of a checkpoint against its marker entry: size, CRC-32, and SHA-256 when
    the entry has one (authenticated markers always do).

    Args:
        step_dir: the checkpoint directory.
        rel: the file's path relative to it.
        meta: ``{"bytes": int, "checksum": "crc32:<hex>", "sha256": "<hex>"}`` from the marker.

    Returns:
        None when everything matches, else the reason (missing, truncated/torn, mismatch; a
        mismatch against a signed entry ends with "authentication failed").
    """
    path = os.path.join(step_dir, rel)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return "missing (the commit marker lists it)"
    except OSError as e:
        return f"unreadable: {e}"
    signed = meta.get(DIGEST_ALGORITHM) is not None
    if size != meta["bytes"]:
        return (f"size is {size} bytes, the commit marker says {meta['bytes']} (truncated or torn write"
                f"{', or replaced: ' + AUTH_FAILED if signed else ''})")
    algo = meta["checksum"].split(":", 1)[0]
    if algo != CHECKSUM_ALGORITHM:
        return f"unsupported checksum algorithm {algo!r}"
    want_sha = meta.get(DIGEST_ALGORITHM)
    try:
        size, checksum, sha = file_digests(path, sha256=want_sha is not None)
    except OSError as e:
        return f"unreadable: {e}"
    if size != meta["bytes"]:
        return f"size is {size} bytes, the commit marker says {meta['bytes']} (changed while reading)"
    if checksum != meta["checksum"]:
        return (f"checksum mismatch: {checksum}, the commit marker says {meta['checksum']} (corrupt or altered data"
                f"{': ' + AUTH_FAILED if want_sha else ''})")
    if want_sha is not None and sha != want_sha:
        return f"{DIGEST_ALGORITHM} mismatch: the file is not the one the marker signed ({AUTH_FAILED})"
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
    """Size and digests of the data files DCP's rank ``rank`` wrote (``__<rank>_<n>.distcp``).

    Returns:
        ``{name: {"bytes": int, "checksum": "crc32:<hex>", "sha256": "<hex>"}}`` (names relative
        to ``step_dir``).

    Raises:
        OSError: the directory or a file cannot be read.
    """
    own: dict[str, dict[str, Any]] = {}
    prefix = f"__{rank}_"
    for name in sorted(os.listdir(step_dir)):
        if name.startswith(prefix) and name.endswith(".distcp") and os.path.isfile(os.path.join(step_dir, name)):
            own[name] = _entry(os.path.join(step_dir, name))
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
            files[rel] = _entry(full)


def write_marker(step_dir: str, step: int, world_size: int, files: dict[str, dict[str, Any]], key: bytes) -> int:
    """Write ``<step_dir>/COMMITTED`` atomically (fsynced temporary file, then ``os.replace``),
    signed with ``key``: from then on the checkpoint is complete.

    Args:
        step_dir: the checkpoint directory.
        step: the 0-based step it holds.
        world_size: ranks that wrote it.
        files: every file's size and digests (:func:`hash_rank_files`, :func:`hash_remaining`).
        key: the job's checkpoint key (HMAC-SHA256).

    Returns:
        The checkpoint's size in bytes (the sum over ``files``).

    Raises:
        OSError: the marker could not be written.
    """
    nbytes = sum(f["bytes"] for f in files.values())
    marker = {"step": step, "world_size": world_size, "bytes": nbytes, "time": time.time(),
              "checksum": CHECKSUM_ALGORITHM, "digest": DIGEST_ALGORITHM, "files": files}
    marker["hmac"] = sign(key, MARKER_DOMAIN, marker)
    write_json_atomic(os.path.join(step_dir, COMMIT_MARKER), marker)
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


def short_error(exc: BaseException, limit: int = 500) -> str:
    """One line: ``Type: message``; for DCP's CheckpointException, the first failing rank's cause."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank = min(failures)
        cause = failures[rank][0] if isinstance(failures[rank], tuple) else failures[rank]
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        text = f"{type(cause).__name__} on rank {rank}: {first}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
