"""The memory tier's storage: snapshot slots in named shared-memory files on a node.

Layout on a node (``$HYPERPOD_LAB_SHM_DIR`` overrides ``/dev/shm/hyperpod-lab``)::

    <shm_root>/<job_id>/<node>/rank-<R>/            this node's rank R: its own snapshots
    <shm_root>/<job_id>/<node>/replica-of-rank-<R>/ snapshots of rank R (on another node), held here
        slot-<i>.bin    the flattened tensors (i = 0 .. keep_last - 1), allocated once, reused
        slot-<i>.meta   the layout as JSON (:func:`hyperpod_lab.runtime.state.capture`): the
                        state's structure, dtype/shape/offset of every tensor (a DTensor's local
                        shard, with its placements, global shape and mesh) (never pickle)
        slot-<i>.json   the commit record {format, step, world_size, rank, nbytes, data_checksum,
                        meta_sha256, job_id, time, hmac[, replica]}

Every directory from the shared-memory root down is private (0700, ours, not a link: see
:mod:`hyperpod_lab.private_dir`), and every record is signed: ``hmac`` is HMAC-SHA256
under the job's checkpoint key (:mod:`hyperpod_lab.runtime.checkpoint.auth`) of the record's fields
:data:`SIGNED_FIELDS`, which include the SHA-256 of the meta file and the XXH3-64 of the data. A
record whose HMAC does not verify is treated as absent, so neither its meta nor its data is read.
Why XXH3 (not a cryptographic hash) is enough for the data: the data is never deserialised, only
reinterpreted as tensors of the dtypes, shapes and offsets the signed meta fixes, so a forged
data file could at worst change tensor values, and only someone who can write into our private
0700 directory can replace it: our own uid or root, who can already do anything as us. XXH3
there guards against torn writes and bit flips at 13 GB/s; SHA-256 of the data would cost
~8x more time on the snapshot's commit path.

The path names the node because on the dev cluster both "nodes" run on one host and share its
``/dev/shm``; on a real cluster each node has its own and ``<node>`` is its only entry.

A slot is *complete* only when its commit record exists, matches its format and its HMAC, and
its meta file matches the record's SHA-256 (:meth:`SlotRing.complete`); its data is checked against the
record's XXH3 checksum before it is read (:meth:`Slot.verify`). A writer invalidates the slot
(deletes the record) before it copies into it and commits (meta, then record, each atomically)
after every byte is in place, so a writer killed mid-copy leaves a slot that is never read.

Slots are allocated once and reused (``ftruncate`` + ``posix_fallocate``, so a full tmpfs fails
the allocation with ENOSPC instead of killing the process with SIGBUS mid-copy; a failed
reservation is rolled back, never leaving a sparse file a later mapping would fault on, and a
file found sparse is reserved before it is written: :func:`reserve`; then mapped with
``MAP_POPULATE``): copying into memory already touched is 4-10x faster than into fresh pages. A
slot grows (is re-allocated) only when the state outgrows it. With CUDA the slot files can be
page-locked with ``cudaHostRegister`` so device-to-host copies are asynchronous.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
import shutil
from typing import TYPE_CHECKING, Any

import torch
import xxhash

from hyperpod_lab.atomicfile import write_atomic
from hyperpod_lab.jobdir import ENV_SHM_DIR, shm_root
from hyperpod_lab.private_dir import ensure_private_dir
from hyperpod_lab.runtime.checkpoint.auth import process_key, sha256_hex, sign, verify
from hyperpod_lab.runtime.state import FORMAT, tensor_view

if TYPE_CHECKING:  # pragma: no cover
    from hyperpod_lab.runtime.state import Captured

_PAGE = mmap.PAGESIZE
_SLOT_FILE = re.compile(r"^slot-(\d+)\.(bin|meta|json)$")
SIGNED_FIELDS = ("format", "step", "world_size", "rank", "nbytes", "data_checksum", "meta_sha256", "job_id")
"""The fields of a slot record its ``hmac`` covers."""
RECORD_DOMAIN = "hyperpod-lab memory slot record v3"
_RECORD_KEYS = SIGNED_FIELDS + ("hmac",)
_CHECKSUM_MASK = (1 << 63) - 1


# ---- paths ------------------------------------------------------------------------------------
def private_tree(directory: str) -> str:
    """Where the private tree of a slot directory starts: :func:`shm_root` when ``directory``
    lies under it, else ``directory`` itself."""
    root = os.path.abspath(shm_root())
    d = os.path.abspath(directory)
    return root if d.startswith(root.rstrip(os.sep) + os.sep) else d


def signed_part(record: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``record`` its HMAC covers (:data:`SIGNED_FIELDS`).

    Raises:
        KeyError: one is missing.
    """
    return {k: record[k] for k in SIGNED_FIELDS}


def sign_record(key: bytes, record: dict[str, Any]) -> str:
    """HMAC-SHA256 (hex) of a slot record's :data:`SIGNED_FIELDS` under ``key``."""
    return sign(key, RECORD_DOMAIN, signed_part(record))


def record_authentic(key: bytes, record: dict[str, Any], tag: Any = None) -> bool:
    """Whether ``tag`` (default ``record["hmac"]``) is the HMAC of ``record``'s signed fields."""
    try:
        part = signed_part(record)
    except KeyError:
        return False
    return verify(key, RECORD_DOMAIN, part, record.get("hmac") if tag is None else tag)


def own_dirname(rank: int) -> str:
    """``rank-<R>``: the directory of rank R's own snapshots on its node."""
    return f"rank-{int(rank)}"


def replica_dirname(rank: int) -> str:
    """``replica-of-rank-<R>``: the directory of rank R's snapshots held on another node."""
    return f"replica-of-rank-{int(rank)}"


_DIRNAME = re.compile(r"^(rank|replica-of-rank)-(\d+)$")


def parse_dirname(name: str) -> tuple[str, int] | None:
    """``("own", R)`` for ``rank-R``, ``("replica", R)`` for ``replica-of-rank-R``, else None."""
    m = _DIRNAME.match(name)
    if not m:
        return None
    return ("own" if m.group(1) == "rank" else "replica", int(m.group(2)))


# ---- checksums and small files ----------------------------------------------------------------
def checksum(data: torch.Tensor | bytes | memoryview) -> int:
    """XXH3-64 (the ``xxhash`` package) of a contiguous CPU uint8 tensor or bytes, its top bit
    cleared so it fits an int64 header field: 0 <= value < 2**63. Releases the GIL. Measured here
    (one core): 13 GB/s, where zlib's CRC-32 ran 2.8 GB/s and, on 2 cores, its background pass
    over a 1 GB snapshot slowed the training thread enough to double a checkpoint's added time
    (benchmarks/checkpoint_stall.py)."""
    if isinstance(data, torch.Tensor):
        if data.numel() == 0:
            return 0
        data = data.numpy()
    return xxhash.xxh3_64_intdigest(data) & _CHECKSUM_MASK


def _write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one (tmpfs: no fsync)."""
    write_atomic(path, data, fsync=False)


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


# ---- space ------------------------------------------------------------------------------------
def _fully_allocated(path: str, size: int) -> bool:
    """Whether every byte of ``path``'s first ``size`` bytes has space on the file system (its
    allocated blocks cover them: no hole a write would have to allocate)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return st.st_size >= size and st.st_blocks * 512 >= size


def reserve(fd: int, size: int, path: str) -> int:
    """Make the file ``fd`` (at ``path``) hold at least ``size`` bytes, all of them allocated on
    its file system (``ftruncate`` + ``posix_fallocate``), before anyone maps it; returns its size,
    bytes.

    Writing into a mapped page the file system has no room for kills the process with SIGBUS
    (exit 135 under a launcher, which reads as a node fault); an ``OSError`` here lets the caller
    report it and go on. On failure the file is rolled back: to its old size when that was fully
    allocated (a committed snapshot in it stays readable), else to 0 bytes, so no sparse file is
    left for a later mapping to fault on.

    Raises:
        OSError: errno ENOSPC (also for EFBIG/EDQUOT), the message naming ``path``, the bytes
            needed and free, and the fix (free shared memory on the node, fewer slots, or a larger
            tmpfs in ``$HYPERPOD_LAB_SHM_DIR``); other errors of the calls as they are.
    """
    st = os.fstat(fd)
    old = st.st_size
    old_ok = st.st_blocks * 512 >= old
    size = max(size, old)
    try:
        if old < size:
            os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        try:
            os.ftruncate(fd, old if old_ok else 0)
        except OSError:
            pass
        if e.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise
        try:
            sv = os.fstatvfs(fd)
            free = f"{sv.f_bavail * sv.f_frsize} bytes are free"
        except OSError:
            free = "free space unknown"
        raise OSError(errno.ENOSPC,
                      f"no space for a {size}-byte memory snapshot slot on its file system ({free}; "
                      f"{os.strerror(e.errno)}): this snapshot was not taken; free shared memory on this node (/dev/shm), lower checkpoint.keep_last, "
                      f"or point ${ENV_SHM_DIR} at a larger tmpfs", path) from None
    return size


# ---- slots ------------------------------------------------------------------------------------
def _pin(ptr: int, size: int) -> bool:
    try:
        return int(torch.cuda.cudart().cudaHostRegister(ptr, size, 1)) == 0  # 1: cudaHostRegisterPortable
    except Exception:
        return False


def _unpin(ptr: int) -> None:
    try:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except Exception:
        pass


class Slot:
    """One snapshot slot: ``slot-<i>.bin`` (data, mapped), ``.meta`` and ``.json`` (commit record).

    Attributes:
        index: i. capacity: bytes mapped (0 until allocated or opened).
        buf: the mapping as a CPU uint8 tensor of ``capacity`` bytes, or None.
        pinned: whether ``buf`` is page-locked for CUDA.
    """

    def __init__(self, directory: str, index: int, pin: bool = False, key: bytes | None = None):
        self.directory, self.index, self.want_pin = directory, index, pin
        self.key = key if key is not None else process_key()
        base = os.path.join(directory, f"slot-{index}")
        self.data_path, self.meta_path, self.record_path = base + ".bin", base + ".meta", base + ".json"
        self._mm: mmap.mmap | None = None
        self.buf: torch.Tensor | None = None
        self._views: tuple[tuple, list[torch.Tensor]] | None = None  # (layout, views into buf)
        self.capacity = 0
        self.pinned = False
        self._reserved = False  # every byte of the mapped file is known to be allocated

    # mapping
    def _map(self, size: int, create: bool) -> None:
        """Map the data file; ``create``: make it hold at least ``size`` bytes, every one of them
        reserved (:func:`reserve`) before it is mapped."""
        flags = os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
        fd = os.open(self.data_path, flags, 0o600)
        try:
            if create:
                size = reserve(fd, size, self.data_path)
            else:
                size = os.fstat(fd).st_size
            if size == 0:
                return
            self._mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.buf = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.capacity = size
        if self.want_pin and torch.cuda.is_available():
            self.pinned = _pin(self.buf.data_ptr(), size)

    def open(self) -> bool:
        """Map an existing data file (to read it). Returns whether there is one."""
        if self.buf is not None:
            return True
        if not os.path.exists(self.data_path):
            return False
        self._map(0, create=False)
        return self.buf is not None

    def ensure(self, nbytes: int) -> None:
        """Allocate/grow the data file to hold ``nbytes`` (page-rounded; never shrinks), every
        byte of it reserved on the file system before anything is copied into it.

        A data file found sparse (left by a process killed between growing it and reserving its
        space, or by a version that did not roll a failed reservation back) is reserved now: a
        write into an unreserved page of a full tmpfs is a SIGBUS that kills the process.

        Raises:
            OSError: ENOSPC when the file system cannot hold it (:func:`reserve`: the message
                says how much was needed, how much is free and what to do; the file keeps the
                size and data it had, or is emptied when that was unreserved).
        """
        if self.buf is None:
            self.open()
        if self.buf is not None and self.capacity >= nbytes:
            if self._reserved:
                return
            if _fully_allocated(self.data_path, self.capacity):
                self._reserved = True
                return
        self.unmap()
        self._map(max(_PAGE, _round_up(nbytes, _PAGE)), create=True)  # (never below the file's size)
        self._reserved = True

    def unmap(self) -> None:
        if self.pinned and self.buf is not None:
            _unpin(self.buf.data_ptr())
        self.pinned = False
        self._views = None
        # Never mmap.close() here: torch.frombuffer tensors do not hold a buffer export, so closing
        # would leave live views (a background copy, a tensor being read) dangling. The tensors
        # hold a reference to the mmap object; the mapping goes when the last view does.
        self.buf = None
        self._mm = None
        self.capacity = 0
        self._reserved = False

    # records
    def read_record(self) -> dict[str, Any] | None:
        """The commit record if present, well-formed, of this :data:`FORMAT` and authentic (its
        HMAC verifies under the slot's key), else None (no data is checked)."""
        try:
            fd = os.open(self.record_path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                rec = json.loads(f.read(1 << 16))
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(rec, dict) or any(k not in rec for k in _RECORD_KEYS) or rec["format"] != FORMAT:
            return None
        if not all(isinstance(rec[k], int) and not isinstance(rec[k], bool)
                   for k in ("step", "world_size", "rank", "nbytes", "data_checksum")):
            return None
        if not record_authentic(self.key, rec):
            return None
        return rec

    def read_meta(self, record: dict[str, Any]) -> bytes | None:
        """The meta file's bytes if they match the (authenticated) record's SHA-256, else None."""
        try:
            fd = os.open(self.meta_path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                meta = f.read()
        except OSError:
            return None
        return meta if sha256_hex(meta) == record["meta_sha256"] else None

    def invalidate(self) -> None:
        """Delete the commit record: from now on the slot is torn until :meth:`commit`."""
        try:
            os.remove(self.record_path)
        except FileNotFoundError:
            pass

    def commit(self, meta: bytes, record: dict[str, Any]) -> None:
        """Write the meta file, then the record (each atomically): the slot becomes complete.

        ``record`` must carry its ``hmac`` (:func:`sign_record`)."""
        _write_atomic(self.meta_path, meta)
        _write_atomic(self.record_path, json.dumps(record, sort_keys=True).encode() + b"\n")

    def data(self, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` of the mapping (mapping the file if needed)."""
        if self.buf is None and not self.open():
            raise FileNotFoundError(self.data_path)
        if self.capacity < nbytes:
            raise ValueError(f"{self.data_path} holds {self.capacity} bytes, the record says {nbytes}")
        return self.buf[:nbytes]

    def views(self, cap: "Captured") -> list[torch.Tensor]:
        """Where each of ``cap``'s tensors goes in this slot (cached while the layout is the same:
        building ~200 views costs more than copying a few MB)."""
        if self._views is not None and self._views[0] == cap.layout:
            return self._views[1]
        views = [tensor_view(self.buf, off, t.dtype, tuple(t.shape)) for t, off in zip(cap.tensors, cap.offsets)]
        self._views = (cap.layout, views)
        return views

    def verify(self, record: dict[str, Any]) -> str | None:
        """None when the data matches the record's checksum, else why not."""
        try:
            got = checksum(self.data(int(record["nbytes"])))
        except (OSError, ValueError) as e:
            return f"{type(e).__name__}: {e}"
        if got != record["data_checksum"]:
            return f"data checksum {got:016x} != recorded {record['data_checksum']:016x}"
        return None

    def file_bytes(self) -> int:
        try:
            return os.path.getsize(self.data_path)
        except OSError:
            return 0


class SlotRing:
    """``keep_last`` slots in one directory, reused round-robin by age.

    Args:
        directory: e.g. ``<shm_root>/<job>/<node>/rank-3``; unless ``create=False``, it and every
            directory from :func:`private_tree` down to it are created 0700 and verified
            private (:func:`~hyperpod_lab.private_dir.ensure_private_dir`).
        keep_last: slots in the ring (>= 1). Slot files of higher indices (a previous run with a
            larger ``keep_last``) are deleted.
        pin: page-lock the slots for CUDA when allocated.
        key: the key the records are signed and verified with (the job's checkpoint key);
            default: :func:`~hyperpod_lab.runtime.checkpoint.auth.process_key` (this process only).

    Raises:
        ValueError: ``keep_last`` < 1.
        hyperpod_lab.private_dir.PrivateDirError: a directory of the tree is not private
            (another owner, writable by others, a symbolic link).
        OSError: the directory cannot be created.
    """

    def __init__(self, directory: str, keep_last: int, *, pin: bool = False, create: bool = True,
                 key: bytes | None = None):
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be a whole number >= 1, got {keep_last!r}")
        self.directory = directory
        self.key = key if key is not None else process_key()
        if create:
            ensure_private_dir(directory, top=private_tree(directory), env=ENV_SHM_DIR)
        self.slots = [Slot(directory, i, pin, self.key) for i in range(keep_last)]
        for name in os.listdir(directory) if os.path.isdir(directory) else []:
            m = _SLOT_FILE.match(name)
            if m and int(m.group(1)) >= keep_last:
                try:
                    os.remove(os.path.join(directory, name))
                except OSError:
                    pass

    def complete(self) -> list[tuple[Slot, dict[str, Any], bytes]]:
        """Slots with a valid record and meta, newest step first: ``[(slot, record, meta), ...]``.
        Data checksums are not checked here (:meth:`Slot.verify` does)."""
        out = []
        for slot in self.slots:
            rec = slot.read_record()
            if rec is None:
                continue
            meta = slot.read_meta(rec)
            if meta is None or slot.file_bytes() < rec["nbytes"]:
                continue
            out.append((slot, rec, meta))
        out.sort(key=lambda x: x[1]["step"], reverse=True)
        return out

    def choose(self, step: int) -> Slot:
        """The slot a save of ``step`` overwrites: one holding ``step``, else one without a
        record, else the one with the oldest step."""
        recs = [(s, s.read_record()) for s in self.slots]
        for s, r in recs:
            if r is not None and r["step"] == step:
                return s
        for s, r in recs:
            if r is None:
                return s
        return min(recs, key=lambda x: x[1]["step"])[0]

    def begin(self, step: int, nbytes: int) -> Slot:
        """Pick the slot for ``step``, invalidate it, make it hold ``nbytes``; returns it."""
        slot = self.choose(step)
        slot.invalidate()
        slot.ensure(nbytes)
        return slot

    def invalidate_from(self, step: int, world_size: int | None = None) -> None:
        """Invalidate slots holding a step >= ``step`` (or another world size than ``world_size``)."""
        for slot in self.slots:
            rec = slot.read_record()
            if rec is not None and (rec["step"] >= step or (world_size is not None and rec["world_size"] != world_size)):
                slot.invalidate()

    @property
    def memory_bytes(self) -> int:
        """Bytes of shared memory the ring's data files occupy."""
        return sum(s.file_bytes() for s in self.slots)

    def close(self) -> None:
        """Unmap every slot (the files stay)."""
        for s in self.slots:
            s.unmap()

    def remove(self) -> None:
        """Unmap and delete the directory with its files."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
