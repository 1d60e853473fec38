"""The memory tier: snapshots of a rank's full training state in named shared-memory files.

A snapshot is the rank's whole state (model parameters and buffers, optimizer state, data-loader
position, RNG states, ...) flattened into one preallocated byte buffer: a file under ``/dev/shm``
(a tmpfs), mapped into the process and reused. Files in ``/dev/shm`` outlive the process that
wrote them (a SIGKILLed rank's restarted process maps them again and reads them back) but not the
node (they are RAM). :mod:`hyperpod_lab.runtime.peer` copies each snapshot to another node so
that a lost node loses no snapshot; :class:`hyperpod_lab.runtime.tiered.TieredCheckpointer` puts
the tiers together.

Layout on a node (``$HYPERPOD_LAB_SHM_DIR`` overrides ``/dev/shm/hyperpod-lab``)::

    <shm_root>/<job_id>/<node>/rank-<R>/            this node's rank R: its own snapshots
    <shm_root>/<job_id>/<node>/replica-of-rank-<R>/ snapshots of rank R (on another node), held here
        slot-<i>.bin    the flattened tensors (i = 0 .. keep_last - 1), allocated once, reused
        slot-<i>.meta   pickled layout: the state's structure, dtype/shape/offset of every tensor
        slot-<i>.json   the commit record {format, step, world_size, rank, nbytes, data_checksum,
                        meta_checksum, job_id, time}

The path names the node because on the dev cluster both "nodes" run on one host and share its
``/dev/shm``; on a real cluster each node has its own and ``<node>`` is its only entry.

Commit protocol: a save first deletes the slot's commit record, then copies the tensors into the
slot, and only when every byte is in place computes the checksum (XXH3) of the data, writes the meta file
(temporary file + ``os.replace``) and finally the record (the same way). A process killed
mid-copy therefore leaves a slot without a record, which is never read; a slot whose data does
not match its record's checksum (a bit flip, a bug) is rejected when read. The ring holds
``keep_last`` slots; a save reuses the slot with the same step, else one without a record, else
the oldest, so with ``keep_last >= 2`` a save killed half-way leaves the previous snapshot intact
(with ``keep_last == 1`` it leaves none).

Slots are allocated once and reused (``ftruncate`` + ``posix_fallocate``, so a full tmpfs fails
the allocation with ENOSPC instead of killing the process with SIGBUS mid-copy, then mapped with
``MAP_POPULATE``): copying into memory already touched is 4-10x faster than into fresh pages. The
first snapshot allocates its slot (the state's size is known only then: an optimizer has no state
before its first step); the rest of the ring is allocated in the background right after it
commits. A slot grows (is re-allocated) only when the state outgrows it.

Measured here (2 busy cores, torch 2.13 CPU), examples/train_lm.py's model (1.85 M parameters)
with AdamW, 210 tensors, 22.4 MB a snapshot: ``snapshot`` blocks ~5-11 ms (about 4 ms of it the
copy, the rest taking the state apart), ~30 ms the first time (allocation); the commit (XXH3 checksum
at ~13 GB/s, meta, record) follows ~10 ms later in the background. With CUDA the slot files are
page-locked with ``cudaHostRegister`` so device-to-host copies are asynchronous
(``non_blocking=True``); they are ordered on the current CUDA stream (or on a side stream in
overlap mode) and the commit waits for them.

:class:`MemoryTier` is usable on its own, without a process group (e.g. by a benchmark)::

    tier = MemoryTier("/dev/shm/bench/rank-0", keep_last=2)
    snap = tier.snapshot(step, {"model": model, "optim": opt})  # returns when training may go on
    tier.wait()                                                 # committed (checksum + record)
    step = tier.restore({"model": model, "optim": opt})         # newest complete snapshot
    tier.close(remove=True)

What a state may hold (the same as the persistent tier): ``nn.Module`` (its ``state_dict``),
``torch.optim.Optimizer`` (its ``state_dict``), objects with ``state_dict()``/
``load_state_dict()``, and plain dicts of tensors, numbers, strings, lists (restored in place:
tensors are ``copy_``-ed into the existing ones). Tensors must be dense (strided) plain tensors;
sharded ones (DTensor, ShardedTensor) raise ``TypeError`` (the memory tier holds this rank's
state, so DDP-style replication is the supported case).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import pickle
import queue
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import xxhash

from hyperpod_lab.runtime.checkpoint import _copy_into

ENV_SHM_DIR = "HYPERPOD_LAB_SHM_DIR"
DEFAULT_SHM_ROOT = "/dev/shm/hyperpod-lab"
FORMAT = 2  # 2: XXH3 checksums (1 held zlib CRC-32s; a slot of another format is never read)
ALIGN = 64  # byte alignment of every tensor in a slot (any dtype's element size divides it)
_PAGE = mmap.PAGESIZE
_SLOT_FILE = re.compile(r"^slot-(\d+)\.(bin|meta|json)$")
_RECORD_KEYS = ("format", "step", "world_size", "rank", "nbytes", "data_checksum", "meta_checksum")
_CHECKSUM_MASK = (1 << 63) - 1

KIND_MODULE, KIND_OPTIMIZER, KIND_STATEFUL, KIND_DICT = "module", "optimizer", "stateful", "dict"


# ---- paths ------------------------------------------------------------------------------------
def shm_root() -> str:
    """``$HYPERPOD_LAB_SHM_DIR``, else ``/dev/shm/hyperpod-lab`` (no ``/dev/shm``: a temp dir)."""
    root = os.environ.get(ENV_SHM_DIR)
    if root:
        return root
    if os.path.isdir("/dev/shm"):
        return DEFAULT_SHM_ROOT
    import tempfile

    return os.path.join(tempfile.gettempdir(), "hyperpod-lab-shm")


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
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


# ---- flattening a state -----------------------------------------------------------------------
class _Ref:
    """Placeholder for the ``i``-th tensor in a pickled state skeleton."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i

    def __reduce__(self):
        return (_Ref, (self.i,))


@dataclass
class Captured:
    """A state taken apart for copying: the tensors, where they go, and everything else pickled.

    Attributes:
        tensors: the state's tensors, in layout order (references to the live tensors, not copies).
        deferrable: per tensor, whether overlap mode may copy it after ``snapshot`` returned
            (parameters and optimizer ``state`` tensors: only the optimizer step changes them).
        offsets: byte offset of each tensor in the slot (multiples of :data:`ALIGN`).
        nbytes: bytes the slot must hold.
        meta: the pickled skeleton {format, kinds, tree, layout, nbytes}; non-tensor values are
            pickled here, i.e. captured when :func:`capture` runs.
    """

    tensors: list[torch.Tensor]
    deferrable: list[bool]
    offsets: list[int]
    nbytes: int
    meta: bytes
    layout: tuple = ()


def _state_kinds(state: dict[str, Any]) -> dict[str, str]:
    if not isinstance(state, dict) or not state:
        raise TypeError("state must be a non-empty dict such as {'model': model, 'optim': optimizer}")
    kinds = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise TypeError(f"state keys must be strings, got {key!r}")
        if isinstance(value, torch.nn.Module):
            kinds[key] = KIND_MODULE
        elif isinstance(value, torch.optim.Optimizer):
            kinds[key] = KIND_OPTIMIZER
        elif callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None)):
            kinds[key] = KIND_STATEFUL
        elif isinstance(value, dict):
            kinds[key] = KIND_DICT
        else:
            raise TypeError(f"state[{key!r}] is a {type(value).__name__}; give an nn.Module, an Optimizer, "
                            f"an object with state_dict()/load_state_dict(), or a dict of tensors/numbers")
    return kinds


def check_state(state: dict[str, Any]) -> dict[str, str]:
    """Validate a state dict's shape; returns ``{key: kind}``.

    Raises:
        TypeError: ``state`` is empty, not a dict, or holds an unsupported value.
    """
    return _state_kinds(state)


def _strip(obj: Any, tensors: list[torch.Tensor], deferrable: list[bool],
           defer: Callable[[torch.Tensor, tuple], bool], path: tuple) -> Any:
    """``obj`` with each tensor replaced by a :class:`_Ref`; the tensors appended to ``tensors``."""
    if isinstance(obj, torch.Tensor):
        if type(obj) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(f"the memory tier holds plain tensors; {'/'.join(map(str, path))} is a "
                            f"{type(obj).__name__} (sharded state is not supported yet)")
        if obj.layout != torch.strided or obj.is_quantized or obj.device.type == "meta":
            raise TypeError(f"the memory tier holds dense tensors; {'/'.join(map(str, path))} is "
                            f"{obj.layout}/{obj.device.type}")
        tensors.append(obj)  # copied under no_grad: no need to detach
        deferrable.append(bool(defer(obj, path)))
        return _Ref(len(tensors) - 1)
    if isinstance(obj, dict):
        try:
            out = type(obj)()
        except TypeError:
            out = {}
        for k, v in obj.items():
            out[k] = _strip(v, tensors, deferrable, defer, path + (k,))
        meta = getattr(obj, "_metadata", None)  # nn.Module.state_dict() versions (load_state_dict uses them)
        if meta is not None:
            try:
                out._metadata = meta
            except AttributeError:
                pass
        return out
    if isinstance(obj, list):
        return [_strip(v, tensors, deferrable, defer, path + (i,)) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        items = [_strip(v, tensors, deferrable, defer, path + (i,)) for i, v in enumerate(obj)]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj


def capture(state: dict[str, Any]) -> Captured:
    """Take ``state`` apart: its tensors (not copied) and a pickled skeleton of everything else.

    Args:
        state: ``{name: nn.Module | Optimizer | Stateful | dict}``.

    Returns:
        A :class:`Captured`.

    Raises:
        TypeError: an unsupported value (see the module docstring), or a non-tensor value pickle
            cannot serialise.
    """
    kinds = _state_kinds(state)
    tensors: list[torch.Tensor] = []
    deferrable: list[bool] = []
    tree: dict[str, Any] = {}
    for key, value in state.items():
        kind = kinds[key]
        if kind == KIND_MODULE:
            params = {p.data_ptr() for p in value.parameters() if p.numel()}
            sd = value.state_dict()
            tree[key] = _strip(sd, tensors, deferrable, lambda t, _p, s=params: t.data_ptr() in s, (key,))
        elif kind == KIND_OPTIMIZER:
            # only the optimizer step changes its per-parameter state; param_groups may hold tensors
            # an LR scheduler changes between steps: copied at once
            tree[key] = _strip(value.state_dict(), tensors, deferrable,
                               lambda _t, p: len(p) > 1 and p[1] == "state", (key,))
        elif kind == KIND_STATEFUL:
            tree[key] = _strip(value.state_dict(), tensors, deferrable, lambda _t, _p: False, (key,))
        else:
            tree[key] = _strip(value, tensors, deferrable, lambda _t, _p: False, (key,))
    offsets, layout, pos = [], [], 0
    for t in tensors:
        offsets.append(pos)
        layout.append((pos, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
        pos = _round_up(pos + t.numel() * t.element_size(), ALIGN)
    try:
        meta = pickle.dumps({"format": FORMAT, "kinds": kinds, "tree": tree, "layout": layout, "nbytes": pos},
                            protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TypeError(f"the state holds a value that cannot be pickled: {type(e).__name__}: {e}") from e
    return Captured(tensors, deferrable, offsets, pos, meta, tuple(layout))


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a snapshot layout")
    return dt


def tensor_view(buf: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor of ``dtype``/``shape`` stored at byte ``offset`` of the uint8 buffer ``buf``."""
    nb = math.prod(shape) * dtype.itemsize
    return buf[offset:offset + nb].view(dtype).view(shape)


def load_meta(meta: bytes) -> dict[str, Any]:
    """Unpickle a slot's meta file (written by this module; never feed it untrusted bytes)."""
    out = pickle.loads(meta)
    if not isinstance(out, dict) or out.get("format") != FORMAT:
        raise ValueError("not a hyperpod-lab memory-tier layout (format mismatch)")
    return out


def unflatten(meta: dict[str, Any], buf: torch.Tensor) -> dict[str, Any]:
    """Rebuild the state tree from a slot: every tensor a fresh CPU copy (the slot is reused later).

    Args:
        meta: :func:`load_meta` of the slot's meta file.
        buf: the slot's data, a CPU uint8 tensor of at least ``meta["nbytes"]`` bytes.

    Returns:
        ``{name: state_dict or dict}``, the structure :func:`capture` saw.
    """
    if buf.numel() < meta["nbytes"]:
        raise ValueError(f"slot holds {buf.numel()} bytes, the layout needs {meta['nbytes']}")
    tensors = [tensor_view(buf, off, _dtype(dt), tuple(shape)).clone() for off, dt, shape in meta["layout"]]

    def fill(obj: Any) -> Any:
        if isinstance(obj, _Ref):
            return tensors[obj.i]
        if isinstance(obj, dict):
            for k in list(obj):
                obj[k] = fill(obj[k])
            return obj
        if isinstance(obj, list):
            return [fill(v) for v in obj]
        if isinstance(obj, tuple):
            items = [fill(v) for v in obj]
            return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
        return obj

    return {k: fill(v) for k, v in meta["tree"].items()}


def compatible(meta: dict[str, Any], state: dict[str, Any]) -> str | None:
    """None when a snapshot with ``meta`` can be loaded into ``state``, else the reason."""
    kinds = _state_kinds(state)
    if kinds != meta.get("kinds"):
        return f"the snapshot holds {meta.get('kinds')}, the state is {kinds}"
    return None


def apply(state: dict[str, Any], tree: dict[str, Any]) -> None:
    """Load a tree from :func:`unflatten` into the live ``state`` (modules, optimizers, ... in place).

    Raises:
        ValueError: the tree does not have the state's keys and kinds.
        RuntimeError: ``load_state_dict`` rejected it (e.g. the model changed shape).
    """
    kinds = _state_kinds(state)
    if set(tree) != set(kinds):
        raise ValueError(f"the snapshot holds {sorted(tree)}, the state has {sorted(kinds)}")
    for key, value in state.items():
        kind = kinds[key]
        if kind == KIND_DICT:
            _copy_into(value, tree[key])
        else:
            value.load_state_dict(tree[key])


def _copy_leaf(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool) -> None:
    """Copy one tensor into its place in a slot (the one place every snapshot byte goes through)."""
    dst.copy_(src, non_blocking=non_blocking)


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

    def __init__(self, directory: str, index: int, pin: bool = False):
        self.directory, self.index, self.want_pin = directory, index, pin
        base = os.path.join(directory, f"slot-{index}")
        self.data_path, self.meta_path, self.record_path = base + ".bin", base + ".meta", base + ".json"
        self._mm: mmap.mmap | None = None
        self.buf: torch.Tensor | None = None
        self._views: tuple[tuple, list[torch.Tensor]] | None = None  # (layout, views into buf)
        self.capacity = 0
        self.pinned = False

    # mapping
    def _map(self, size: int, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(self.data_path, flags, 0o600)
        try:
            if create:
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)
                size = os.fstat(fd).st_size
                os.posix_fallocate(fd, 0, size)
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
        """Allocate/grow the data file to hold ``nbytes`` (page-rounded; never shrinks).

        Raises:
            OSError: ENOSPC when the tmpfs cannot hold it.
        """
        if self.buf is None:
            self.open()
        if self.buf is not None and self.capacity >= nbytes:
            return
        self.unmap()
        self._map(max(_PAGE, _round_up(nbytes, _PAGE)), create=True)

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

    # records
    def read_record(self) -> dict[str, Any] | None:
        """The commit record if present and well-formed, else None (no data is checked)."""
        try:
            with open(self.record_path, "rb") as f:
                rec = json.loads(f.read())
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict) or any(k not in rec for k in _RECORD_KEYS) or rec["format"] != FORMAT:
            return None
        return rec

    def read_meta(self, record: dict[str, Any]) -> bytes | None:
        """The meta file's bytes if they match the record's checksum, else None."""
        try:
            with open(self.meta_path, "rb") as f:
                meta = f.read()
        except OSError:
            return None
        return meta if checksum(meta) == record["meta_checksum"] else None

    def invalidate(self) -> None:
        """Delete the commit record: from now on the slot is torn until :meth:`commit`."""
        try:
            os.remove(self.record_path)
        except FileNotFoundError:
            pass

    def commit(self, meta: bytes, record: dict[str, Any]) -> None:
        """Write the meta file, then the record (each atomically): the slot becomes complete."""
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
        directory: e.g. ``<shm_root>/<job>/<node>/rank-3``; created unless ``create=False``.
        keep_last: slots in the ring (>= 1). Slot files of higher indices (a previous run with a
            larger ``keep_last``) are deleted.
        pin: page-lock the slots for CUDA when allocated.
    """

    def __init__(self, directory: str, keep_last: int, *, pin: bool = False, create: bool = True):
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be a whole number >= 1, got {keep_last!r}")
        self.directory = directory
        if create:
            os.makedirs(directory, exist_ok=True)
        self.slots = [Slot(directory, i, pin) for i in range(keep_last)]
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


# ---- the tier ---------------------------------------------------------------------------------
@dataclass
class Snapshot:
    """One snapshot in flight or done.

    Attributes:
        step: the step it holds. nbytes: bytes of data. slot: where it goes.
        blocked_s: seconds :meth:`MemoryTier.snapshot` blocked its caller (waiting for the previous
            snapshot, allocating, copying what is copied synchronously).
        hook_wait_s: seconds the training loop waited in :meth:`MemoryTier.wait_copy` (overlap mode).
        total_s: seconds from the call to the commit (None until committed).
        record: the commit record once committed. error: the exception if it failed.
        meta: the pickled layout.
    """

    step: int
    nbytes: int
    slot: Slot
    meta: bytes
    t0: float
    blocked_s: float = 0.0
    hook_wait_s: float = 0.0
    total_s: float | None = None
    record: dict[str, Any] | None = None
    error: BaseException | None = None
    copied: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    cuda_events: list[Any] = field(default_factory=list)
    side_event: Any = None
    _hook_start: float | None = None
    copy_end: float | None = None


class _Worker:
    """One daemon thread running jobs in order (daemon: a wedged collective in it must not keep a
    failing process alive at exit).

    It holds no reference to a job once the job ran, and :meth:`stop` joins it: a daemon thread
    that drops the last reference to a process group while the interpreter shuts down aborts
    the process (the group's destructor releases the GIL, re-taking it during finalisation ends
    the thread with a forced unwind through C++: "terminate called without an active exception").
    """

    def __init__(self, name: str):
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> None:
        self._q.put(fn)

    def _run(self) -> None:
        while True:
            fn = self._q.get()
            if fn is None:
                return
            try:
                fn()
            finally:
                fn = None  # noqa: F841 - drop the job (and what it references) now

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish the queued jobs, then end the thread; wait up to ``timeout`` seconds for it."""
        self._q.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)


class MemoryTier:
    """A rank's snapshots in a ring of ``keep_last`` shared-memory slots (see the module docstring).

    Usable without a process group. One snapshot is in flight at a time: :meth:`snapshot` first
    waits for the previous one to commit.

    Args:
        directory: the ring's directory, e.g. ``<shm_root>/<job_id>/<node>/rank-<R>``.
        keep_last: slots (complete snapshots kept); shared memory used is about
            ``keep_last`` x the state's size in bytes.
        rank, world_size, job_id: stamped into each commit record (a restore of another world
            size ignores the snapshot).
        pin_memory: page-lock the slots for CUDA; default: whether CUDA is available.

    Raises:
        ValueError: ``keep_last`` < 1.
        OSError: ``directory`` cannot be created.
    """

    def __init__(self, directory: str, keep_last: int = 2, *, rank: int = 0, world_size: int = 1,
                 job_id: str = "", pin_memory: bool | None = None):
        self.ring = SlotRing(directory, keep_last,
                             pin=torch.cuda.is_available() if pin_memory is None else bool(pin_memory))
        self.directory, self.keep_last = directory, keep_last
        self.rank, self.world_size, self.job_id = rank, world_size, job_id
        self._worker: _Worker | None = None
        self._pending: Snapshot | None = None
        self._side_stream = None
        self.last: Snapshot | None = None  # the newest snapshot started

    # ---- saving -------------------------------------------------------------------------------
    def snapshot(self, step: int, state: dict[str, Any], *, overlap: bool = False,
                 on_done: Callable[[Snapshot], None] | None = None) -> Snapshot:
        """Start a snapshot of ``state`` as the state after 0-based ``step``.

        Waits for the previous snapshot, allocates the slot on first use, then copies. Without
        overlap it returns when every byte is copied (CPU tensors) or enqueued on the current
        CUDA stream (CUDA tensors); with ``overlap=True`` it copies module buffers and other
        state at once and leaves parameters and optimizer ``state`` tensors to a background
        thread (CPU) or a side CUDA stream: the caller must call :meth:`wait_copy` before they
        change (``TieredCheckpointer`` does it in an optimizer step pre-hook). The checksum, the meta
        file and the commit record are written in the background, then ``on_done(snapshot)``
        runs there (also on failure, with ``snapshot.error`` set).

        Args:
            step: 0-based step just completed.
            state: ``{name: nn.Module | Optimizer | Stateful | dict}``.
            overlap: defer parameter/optimizer-state copies as described.
            on_done: called in the background thread when the snapshot committed or failed.

        Returns:
            The :class:`Snapshot` (``blocked_s`` set).

        Raises:
            TypeError: unsupported state (nothing was written).
            OSError: the slot could not be allocated (e.g. ENOSPC).
            RuntimeError: the previous snapshot failed (raised here; this one is not started).
        """
        t0 = time.monotonic()
        self.wait()
        cap = capture(state)
        slot = self.ring.begin(int(step), cap.nbytes)
        snap = Snapshot(step=int(step), nbytes=cap.nbytes, slot=slot, meta=cap.meta, t0=t0)
        views = slot.views(cap)
        later_cpu: list[int] = []
        cuda_now, cuda_later = [], []
        with torch.no_grad():
            for i, t in enumerate(cap.tensors):
                if overlap and cap.deferrable[i]:
                    (cuda_later if t.is_cuda else later_cpu).append(i)
                    continue
                if t.is_cuda:
                    cuda_now.append(i)
                _copy_leaf(views[i], t, non_blocking=t.is_cuda and slot.pinned)
            if cuda_now:
                ev = torch.cuda.Event()
                ev.record()
                snap.cuda_events.append(ev)
            if cuda_later:
                if self._side_stream is None:
                    self._side_stream = torch.cuda.Stream()
                side = self._side_stream
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for i in cuda_later:
                        t = cap.tensors[i]
                        _copy_leaf(views[i], t, non_blocking=slot.pinned)
                        t.record_stream(side)
                    ev = torch.cuda.Event()
                    ev.record(side)
                snap.side_event = ev
                snap.cuda_events.append(ev)
        snap.blocked_s = time.monotonic() - t0
        self._pending = self.last = snap
        if self._worker is None:
            self._worker = _Worker(f"hyperpod-memory-tier-{self.rank}")
        pairs = [(views[i], cap.tensors[i]) for i in later_cpu]
        if not later_cpu:
            snap.copy_end = time.monotonic()
            snap.copied.set()
        self._worker.submit(lambda: self._finish(snap, pairs, on_done))
        return snap

    def _finish(self, snap: Snapshot, pairs: list[tuple[torch.Tensor, torch.Tensor]],
                on_done: Callable[[Snapshot], None] | None) -> None:
        """Background: deferred CPU copies, wait for CUDA copies, checksum, meta, record, on_done."""
        try:
            try:
                with torch.no_grad():
                    for dst, src in pairs:
                        _copy_leaf(dst, src, non_blocking=False)
            finally:
                if not snap.copied.is_set():
                    snap.copy_end = time.monotonic()
                    snap.copied.set()
            for ev in snap.cuda_events:
                ev.synchronize()
            data = snap.slot.data(snap.nbytes)
            record = {"format": FORMAT, "step": snap.step, "world_size": self.world_size, "rank": self.rank,
                      "nbytes": snap.nbytes, "data_checksum": checksum(data), "meta_checksum": checksum(snap.meta),
                      "job_id": self.job_id, "time": time.time()}
            snap.slot.commit(snap.meta, record)
            snap.record = record
            snap.total_s = time.monotonic() - snap.t0
            for other in self.ring.slots:  # allocate the rest of the ring now, off the training path
                if other is not snap.slot and other.capacity < snap.nbytes:
                    try:
                        other.ensure(snap.nbytes)
                    except OSError:
                        break  # the next snapshot into it will report it
            hs = snap._hook_start
            if hs is not None and snap.copy_end is not None and hs < snap.copy_end:
                snap.hook_wait_s = snap.copy_end - hs
        except BaseException as e:  # noqa: BLE001 - reported through snap.error
            snap.error = e
        finally:
            if on_done is not None:
                try:
                    on_done(snap)
                except BaseException as e:  # noqa: BLE001
                    if snap.error is None:
                        snap.error = e
            snap.done.set()

    def wait_copy(self) -> None:
        """Block until the pending snapshot's copies finished (its source tensors may change
        afterwards). With CUDA, makes the current stream wait for the side-stream copies instead
        of blocking the host. Cheap when nothing is pending."""
        snap = self._pending
        if snap is None:
            return
        if not snap.copied.is_set():
            snap._hook_start = time.monotonic()
            snap.copied.wait()
        if snap.side_event is not None:
            torch.cuda.current_stream().wait_event(snap.side_event)
            snap.side_event = None

    def wait(self) -> Snapshot | None:
        """Block until the pending snapshot committed (and its ``on_done`` ran).

        Returns:
            That snapshot, or None when none was pending.

        Raises:
            RuntimeError: it failed (the cause is chained).
        """
        snap, self._pending = self._pending, None
        if snap is None:
            return None
        snap.done.wait()
        if snap.error is not None:
            raise RuntimeError(f"memory snapshot of step {snap.step} failed: "
                               f"{type(snap.error).__name__}: {snap.error}") from snap.error
        return snap

    # ---- reading ------------------------------------------------------------------------------
    def complete_steps(self) -> list[int]:
        """Steps of the complete snapshots of this rank and world size, newest first."""
        return [r["step"] for _s, r, _m in self.ring.complete() if r["world_size"] == self.world_size]

    def read(self, step: int | None = None) -> tuple[int, dict[str, Any]]:
        """The newest complete snapshot (or the one of ``step``) as a tree of fresh CPU tensors.

        Returns:
            ``(step, {name: state_dict or dict})``.

        Raises:
            LookupError: no complete, checksum-valid snapshot (of that step).
        """
        self.wait()
        for slot, rec, meta in self.ring.complete():
            if rec["world_size"] != self.world_size or (step is not None and rec["step"] != step):
                continue
            if slot.verify(rec) is not None:
                continue
            return rec["step"], unflatten(load_meta(meta), slot.data(rec["nbytes"]))
        raise LookupError(f"no complete memory snapshot{'' if step is None else f' of step {step}'} "
                          f"in {self.directory}")

    def restore(self, state: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest complete snapshot (or that of ``step``) into ``state``, in place.

        Returns:
            The snapshot's step, or None when there is none (``state`` untouched).
        """
        try:
            got, tree = self.read(step)
        except LookupError:
            return None
        apply(state, tree)
        return got

    @property
    def memory_bytes(self) -> int:
        """Bytes of shared memory this ring occupies (``keep_last`` slots once all are used)."""
        return self.ring.memory_bytes

    def close(self, remove: bool = False, timeout: float = 30.0) -> None:
        """Stop the background thread and unmap the slots; ``remove=True`` also deletes them.

        The thread finishes the pending snapshot first; this waits for it up to ``timeout``
        seconds (it may be stuck on a dead peer), then goes on. Call :meth:`wait` first to see
        the pending snapshot's outcome."""
        if self._worker is not None:
            self._worker.stop(timeout)
            self._worker = None
        self._pending = None
        if remove:
            self.ring.remove()
        else:
            self.ring.close()
