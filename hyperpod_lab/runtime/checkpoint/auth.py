"""The job's checkpoint key and the HMACs that authenticate checkpoints with it.

A checksum is not a MAC: whoever can write a checkpoint can recompute it. Every checkpoint the
runtime reads back is therefore authenticated with HMAC-SHA256 under a per-job key before any
byte of it is deserialised (issue 13, findings 1 and 2): the memory tier's slot records
(:mod:`.slots`), the snapshots peers replicate (:mod:`.peer`), and the commit marker of every
persistent and S3 checkpoint (:mod:`.checkpoint_format`), each of which lists cryptographic
hashes of what it covers.

The key is ``JobPaths(job_dir).checkpoint_key`` (:data:`hyperpod_lab.jobdir.CHECKPOINT_KEY_BYTES`
random bytes, mode 0600), written by the submitter when it stages the job. A job started without
a scheduler (``python train.py``, torchrun by hand, tests) has none: rank 0 creates it
(``O_CREAT | O_EXCL | O_NOFOLLOW``, 0600, :func:`create_key`) before the other ranks read it
(:func:`hyperpod_lab.runtime.context.init` orders that with a collective). A key file that is not
a regular file of that size, owned by us, readable by us only, is refused (:class:`KeyFileError`).

What is signed is canonical JSON (sorted keys, no spaces) prefixed by a domain string, so a
signature of one kind of object never verifies as another.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from typing import Any

from hyperpod_lab.jobdir import CHECKPOINT_KEY_BYTES

__all__ = ["KeyFileError", "create_key", "read_key", "load_or_create_key", "process_key", "sign", "verify",
           "sha256_hex"]

_PROCESS_KEY = secrets.token_bytes(CHECKPOINT_KEY_BYTES)
_HEX64 = re.compile(r"[0-9a-f]{64}")


class KeyFileError(PermissionError):
    """The checkpoint key file is unusable: not ours, not 0600, a link, or of the wrong size."""


def process_key() -> bytes:
    """A random key of this process: what a :class:`~.memory_tier.MemoryTier` used on its own,
    without a job, signs with (its snapshots are then readable by this process only)."""
    return _PROCESS_KEY


def create_key(path: str) -> bool:
    """Create the key file with fresh random bytes unless it exists.

    Opened with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600, so an existing file or link is
    never written through.

    Returns:
        True if this call created it, False if it existed already.

    Raises:
        OSError: it cannot be created (e.g. the job directory is missing or read-only).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    try:
        os.write(fd, secrets.token_bytes(CHECKPOINT_KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def read_key(path: str) -> bytes:
    """Read and check the key file.

    Returns:
        The key, :data:`~hyperpod_lab.jobdir.CHECKPOINT_KEY_BYTES` bytes.

    Raises:
        FileNotFoundError: there is none.
        KeyFileError: it is a link or not a regular file, not owned by this process's effective
            uid, readable or writable by group/others, or not exactly that many bytes.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise KeyFileError(f"checkpoint key {path} cannot be opened ({e}); it must be a regular file, not a link: "
                           f"remove it to have a new one created") from e
    try:
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = "is not a regular file"
        elif st.st_uid != os.geteuid():
            problem = f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
        elif stat.S_IMODE(st.st_mode) & 0o077:
            problem = f"has mode {stat.S_IMODE(st.st_mode):04o}, not 0600"
        elif st.st_size != CHECKPOINT_KEY_BYTES:
            problem = f"is {st.st_size} bytes, not {CHECKPOINT_KEY_BYTES}"
        if problem:
            raise KeyFileError(f"checkpoint key {path} {problem}: refusing it (remove it to have a new one created; "
                               f"checkpoints signed with the old key can then no longer be restored)")
        data = os.read(fd, CHECKPOINT_KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != CHECKPOINT_KEY_BYTES:
        raise KeyFileError(f"checkpoint key {path} changed while being read")
    return data


def load_or_create_key(path: str) -> bytes:
    """:func:`create_key` if missing, then :func:`read_key`. Only for a process that is alone
    in its job (or rank 0 before the others read): otherwise two ranks could race.

    Raises:
        KeyFileError, OSError: as :func:`read_key` and :func:`create_key`.
    """
    create_key(path)
    return read_key(path)


def _message(domain: str, obj: Any) -> bytes:
    return domain.encode() + b"\n" + json.dumps(obj, sort_keys=True, separators=(",", ":"),
                                                allow_nan=False).encode()


def sign(key: bytes, domain: str, obj: Any) -> str:
    """HMAC-SHA256 (hex, 64 characters) of ``obj``'s canonical JSON under ``key``, for ``domain``.

    Raises:
        TypeError, ValueError: ``obj`` is not JSON-serialisable (or holds a non-finite float).
    """
    return hmac.new(key, _message(domain, obj), hashlib.sha256).hexdigest()


def verify(key: bytes, domain: str, obj: Any, tag: Any) -> bool:
    """Whether ``tag`` is :func:`sign` of ``obj`` (constant-time comparison).

    Never raises: False for a tag that is not 64 lowercase hex digits (a non-ASCII one included,
    which :func:`hmac.compare_digest` would refuse with TypeError) and for an ``obj`` that cannot
    be signed (not JSON-serialisable, a non-finite float, nested too deep, an integer too long
    to print)."""
    if not isinstance(tag, str) or not _HEX64.fullmatch(tag):
        return False
    try:
        want = sign(key, domain, obj)
    except (TypeError, ValueError, RecursionError):
        return False
    return hmac.compare_digest(want.encode("ascii"), tag.encode("ascii"))


def sha256_hex(data: bytes | memoryview) -> str:
    """SHA-256 of ``data``, hex."""
    return hashlib.sha256(data).hexdigest()
