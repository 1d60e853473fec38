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
authentication and the checkpoint is skipped like a corrupt one. So is a marker that is
malformed in any way: :func:`parse_marker` is the one place its bytes are parsed and checked
(at most :data:`MAX_MARKER_BYTES`, UTF-8, nesting at most :data:`MAX_MARKER_DEPTH` deep, no
NaN/Infinity or duplicate keys, every field of its type) and raises only :class:`MarkerError`;
:func:`authenticate_marker` never raises. Rank 0 reads the markers for every rank, so no marker
can make it fail while the others wait in the broadcast.

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

import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import time
import zlib
from typing import Any

from hyperpod_lab.atomicfile import write_json_atomic
from hyperpod_lab.errors import CheckpointStateMismatch
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


class MarkerError(ValueError):
    """A commit marker that is not a well-formed one (:func:`parse_marker` says why): the
    checkpoint is treated as corrupt, like one whose HMAC does not match."""


MAX_MARKER_BYTES = 16 << 20
"""Largest commit marker read, bytes (16 MiB: about 90,000 listed files at ~180 bytes each).
A bigger ``COMMITTED`` is not read at all: the checkpoint is corrupt."""
MAX_MARKER_DEPTH = 8
"""Deepest nesting of JSON arrays/objects accepted in a marker (a real one has 3: the marker,
``files``, an entry). Checked before parsing, so deep JSON never reaches the recursive parser."""
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CRC32 = re.compile(CHECKSUM_ALGORITHM + r":[0-9a-f]{8}")
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*+"', re.S)
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def _json_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` in ``text``, brackets inside JSON strings not counted
    (linear, no recursion)."""
    depth = deepest = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub("", text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise MarkerError(f"commit marker has the key {k!r} twice (hand-edited or forged)")
        out[k] = v
    return out


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise MarkerError(f"commit marker holds the non-finite number {text[:40]!r}")
    return value


def _not_a_number(name: str) -> Any:
    raise MarkerError(f"commit marker holds {name}, which is not JSON")


def _is_int(v: Any, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def _check_fields(marker: dict[str, Any]) -> None:
    """Type and range of every field :func:`write_marker` writes, when present (an older
    marker may lack some; :func:`authenticate_marker` requires what a signed one must have)."""
    for name, least in (("step", 0), ("world_size", 1), ("bytes", 0)):
        if name in marker and not _is_int(marker[name], least):
            raise MarkerError(f"commit marker's {name!r} is {marker[name]!r:.60}, not an integer >= {least}")
    if "time" in marker and (isinstance(marker["time"], bool) or not isinstance(marker["time"], (int, float))):
        raise MarkerError(f"commit marker's 'time' is {marker['time']!r:.60}, not a number")
    for name in ("checksum", "digest"):
        if name in marker and not isinstance(marker[name], str):
            raise MarkerError(f"commit marker's {name!r} is {marker[name]!r:.60}, not a string")
    if "hmac" in marker and not (isinstance(marker["hmac"], str) and _HEX64.fullmatch(marker["hmac"])):
        raise MarkerError(f"{AUTH_FAILED}: the marker's 'hmac' is not 64 lowercase hex digits (altered or forged)")
    files = marker.get("files")
    if files is None and "files" not in marker:
        return
    if not isinstance(files, dict) or not files:
        raise MarkerError("commit marker's 'files' is not a non-empty object")
    for rel, meta in files.items():
        if not safe_relpath(rel) or len(rel) > 4096:
            raise MarkerError(f"commit marker lists an unsafe path {rel!r:.200}")
        if not isinstance(meta, dict) or not _is_int(meta.get("bytes"), 0) or not isinstance(meta.get("checksum"), str):
            raise MarkerError(f"commit marker entry for {rel!r} lacks bytes/checksum")
        if not _CRC32.fullmatch(meta["checksum"]):
            raise MarkerError(f"commit marker entry for {rel!r} has the checksum {meta['checksum']!r:.60}, "
                              f"not '{CHECKSUM_ALGORITHM}:' and 8 hex digits")
        sha = meta.get(DIGEST_ALGORITHM)
        if sha is not None and not (isinstance(sha, str) and _HEX64.fullmatch(sha)):
            raise MarkerError(f"commit marker entry for {rel!r} has a {DIGEST_ALGORITHM} that is not 64 hex digits")


def parse_marker(raw: bytes | bytearray | memoryview | str) -> dict[str, Any]:
    """Parse and validate a commit marker: the one place a marker's bytes become a dict.

    Accepts only: at most :data:`MAX_MARKER_BYTES`, UTF-8, JSON nested at most
    :data:`MAX_MARKER_DEPTH` deep (checked before parsing), an object, no duplicate keys, no
    NaN/Infinity or overflowing numbers, and every field of the format (see the module docstring)
    of its type when present: ``step``/``bytes`` integers >= 0, ``world_size`` >= 1, ``time`` a
    number, ``checksum``/``digest`` strings, ``hmac`` 64 lowercase hex digits, ``files`` a
    non-empty object mapping safe relative paths to ``{"bytes": int >= 0, "checksum":
    "crc32:<8 hex>", "sha256": <64 hex> (optional: older markers)}``.

    Returns:
        The marker dict.

    Raises:
        MarkerError (a ValueError): anything else; the message says what. Nothing else is raised,
            whatever the input (the restore then skips the checkpoint as corrupt).
    """
    try:
        if isinstance(raw, str):
            if len(raw) > MAX_MARKER_BYTES:
                raise MarkerError(f"commit marker is over {MAX_MARKER_BYTES} bytes")
            text = raw
        elif isinstance(raw, (bytes, bytearray, memoryview)):
            if len(raw) > MAX_MARKER_BYTES:
                raise MarkerError(f"commit marker is {len(raw)} bytes, over the limit of {MAX_MARKER_BYTES}")
            try:
                text = bytes(raw).decode("utf-8")
            except UnicodeDecodeError as e:
                raise MarkerError(f"commit marker is not UTF-8 ({e})") from None
        else:
            raise MarkerError(f"commit marker is a {type(raw).__name__}, not bytes")
        depth = _json_depth(text)
        if depth > MAX_MARKER_DEPTH:
            raise MarkerError(f"commit marker nests JSON {depth} deep, more than {MAX_MARKER_DEPTH}")
        try:
            marker = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_not_a_number,
                                parse_float=_finite)
        except MarkerError:
            raise
        except ValueError as e:  # JSONDecodeError, and int() over its digit limit
            raise MarkerError(f"commit marker is not JSON ({str(e)[:200]})") from None
        if not isinstance(marker, dict):
            raise MarkerError(f"commit marker is not a JSON object (a {type(marker).__name__})")
        _check_fields(marker)
        return marker
    except MarkerError:
        raise
    except Exception as e:  # the backstop: whatever slipped through is a malformed marker too
        raise MarkerError(f"commit marker cannot be parsed ({type(e).__name__}: {str(e)[:200]})") from None


def read_marker(step_dir: str) -> dict[str, Any]:
    """Read and parse ``<step_dir>/COMMITTED`` (:func:`parse_marker`): opened without following
    a link and without blocking on a FIFO; it must be a regular file of at most
    :data:`MAX_MARKER_BYTES`.

    Raises:
        FileNotFoundError: no marker. MarkerError (a ValueError): as :func:`parse_marker`, or not
        a regular file, or too big. OSError: unreadable.
    """
    path = os.path.join(step_dir, COMMIT_MARKER)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise MarkerError("commit marker is a symbolic link, not a file (planted?)") from None
        raise
    with open(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MarkerError("commit marker is not a regular file")
        if st.st_size > MAX_MARKER_BYTES:
            raise MarkerError(f"commit marker is {st.st_size} bytes, over the limit of {MAX_MARKER_BYTES}")
        raw = f.read(MAX_MARKER_BYTES + 1)
    return parse_marker(raw)


def authenticate_marker(marker: dict[str, Any], key: bytes, step: int | None = None) -> str | None:
    """Check a parsed marker's HMAC under the job's checkpoint ``key`` and that it covers every
    file with a SHA-256 (so :func:`check_file` authenticates each file).

    Args:
        marker: :func:`parse_marker`'s result.
        key: the job's checkpoint key.
        step: when given, the step the marker must name (its directory's).

    Returns:
        None when authentic, else the reason, starting with ``"authentication failed"``. Never
        raises: a marker that makes the check itself fail is not authentic either.
    """
    try:
        return _authenticate(marker, key, step)
    except Exception as e:  # the backstop: parse_marker's checks make this unreachable
        return f"{AUTH_FAILED}: the marker could not be checked ({type(e).__name__}: {str(e)[:200]})"


def _authenticate(marker: dict[str, Any], key: bytes, step: int | None) -> str | None:
    if not isinstance(marker, dict):
        return f"{AUTH_FAILED}: the marker is not a JSON object"
    body = {k: v for k, v in marker.items() if k != "hmac"}
    if "hmac" not in marker:
        return f"{AUTH_FAILED}: the marker is not signed (no HMAC: written by an older hyperpod-lab, or forged)"
    if not verify(key, MARKER_DOMAIN, body, marker.get("hmac")):
        return f"{AUTH_FAILED}: the marker's HMAC does not match (altered, or signed with another job's key)"
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return f"{AUTH_FAILED}: the signed marker lists no files"
    for rel, meta in files.items():
        sha = meta.get(DIGEST_ALGORITHM) if isinstance(meta, dict) else None
        if not (isinstance(sha, str) and len(sha) == 64):
            return f"{AUTH_FAILED}: the marker has no {DIGEST_ALGORITHM} for {rel}"
    if step is not None and (not _is_int(marker.get("step"), 0) or marker.get("step") != step):
        return f"{AUTH_FAILED}: the marker is of step {marker.get('step')!r:.40}, not of step {step}"
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


def state_mismatch(step: int, path: str, error: str) -> CheckpointStateMismatch:
    """The error for an intact checkpoint (authenticated, verified) whose load into the training
    state failed (:meth:`Checkpointer.load_dir`'s reason ``error``), naming ``step``, ``path``
    and the fixes."""
    return CheckpointStateMismatch(
        f"the checkpoint of step {step} at {path} is intact (its commit marker and every file verified) but "
        f"does not fit this job's training state: {error}. Nothing was changed and no older step was loaded in "
        f"its place. Restore it with the state it was saved with (the same keys and shapes in the dict given to "
        f"the checkpointer, the same model code, a data loader saved by this version), or, to start from an "
        f"older step or from scratch on purpose, move {path} and the newer step directories out of the job's "
        f"checkpoints folder")
