"""The data path of a training script: token windows read through a per-node cache, in a global
sample order whose position is part of the checkpointed state.

Four pieces, each usable alone (``docs/data.md`` has a runnable example)::

    cache = hp.NodeCache(ctx)                                   # <shm_root>/<job_id>/<node>/data/
    local = cache.fetch("/fsx/corpus.u16").path                 # copied once per node, then reused
    loader = hp.token_loader(ctx, local, seq_len=1024, batch_size=8, dtype="uint16", num_workers=2)
    ckpt = hp.TieredCheckpointer(ctx, {"model": model, "optim": opt, "data": loader})
    start = ckpt.restore()                                      # the loader's position comes back too
    batches = iter(loader)
    for step in range(start, total_steps):
        batch = next(batches)                                   # {"id": (B,), "x": (B, T), "y": (B, T)}
        ...
        ckpt.maybe_save(step)

:class:`TokenWindows`
    A token file (flat array of one integer dtype, e.g. ``uint16`` token ids, no header) read
    with ``numpy.memmap``: sample ``i`` is the ``seq_len + 1`` tokens starting at token
    ``start + i * seq_len`` (fixed, non-overlapping inputs; the last token of a window is the
    first of the next), split into inputs ``x`` and targets ``y`` (shifted by one). The sample
    id is that ``i``.

:class:`GlobalOrderSampler`
    The order in which the job sees the samples is *global*: epoch ``e`` is
    ``torch.randperm(dataset_size)`` seeded with ``seed + e`` (the same order as
    :class:`~hyperpod_lab.runtime.checkpointless.elastic.ElasticBatches`, whose ``positions``
    it uses), and the epochs follow each other. A step consumes the next ``batch_size x
    world_size`` positions; data-parallel rank ``r`` of ``W`` takes positions ``r, r + W, ...``
    of that slice. Its state is the job's position in that sequence (the same on every rank),
    so a checkpoint taken by any rank restores every rank, and changing the number of ranks
    changes how the sequence is cut into steps, not the sequence.

:func:`token_loader`
    The two above behind torchdata's ``StatefulDataLoader`` (``num_workers`` processes read
    the windows; the main process draws the order). The loader is a ``Stateful``: put it in the
    state of a :class:`~hyperpod_lab.runtime.checkpoint.tiered.TieredCheckpointer` or
    :class:`~hyperpod_lab.runtime.checkpoint.persistent.Checkpointer`, and its state (the
    sampler's position as of the last batch handed out, not the ones its workers prefetched,
    and the workers' states) is saved and restored with the model. The state has one structure
    whatever ``num_workers`` (``{"num_workers", "torchdata": JSON text}``), so DCP restores it
    into a loader with another worker count, which then takes the sampler's position only.

:class:`NodeCache`
    The token file copied once per node from shared storage into ``/dev/shm`` (``<shm_root>/
    <job_id>/<node>/data/``, private like the memory tier's tree), then memory-mapped from there.
    A rank restarted on the node finds the copy and reads nothing from shared storage (only a
    ``stat`` of the source). The copy is written to a temporary file and renamed into place; its
    record (source path, size, mtime, XXH3-64 of the bytes copied) is written after it. Before
    reuse the copy's size and checksum are checked against the record and the source's size and
    mtime against the source's ``stat``; a truncated or corrupt copy, or a changed source, is
    copied again (the report says why). Local ranks serialise on a lock file, so one copies and
    the others find the copy. Each fetch reports ``hit``/``miss``, bytes read from shared storage
    and seconds (a line in the rank's log when a job context is given). A normal end of the job
    (``ctx.finish``) removes the node's copies; a failing process keeps them for its restart.

Checkpointless jobs (``--recovery checkpointless``): the global batch plan and the data cursor
are :class:`~hyperpod_lab.runtime.checkpointless.elastic.ElasticBatches`' and the
:class:`~hyperpod_lab.runtime.checkpointless.ft.Checkpointless` progress (replicated, healed
from a peer and checkpointed with the model). The cursor stays the one source of truth: take
``plan.micro_batches`` (sample ids of the same global order) and read them with
:meth:`TokenWindows.batch`; :func:`token_loader` refuses a checkpointless context, since a
second position (the sampler's) could disagree with the healed cursor.

Upstream: ``torchdata.stateful_dataloader.StatefulDataLoader`` (torchdata 0.11,
https://github.com/pytorch/data/tree/main/torchdata/stateful_dataloader), ``numpy.memmap``.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import torch
import xxhash
from torch.utils.data import Dataset, Sampler

from hyperpod_lab.atomicfile import write_json_atomic
from hyperpod_lab.jobdir import ENV_SHM_DIR, safe_name, shm_root
from hyperpod_lab.private_dir import ensure_private_dir
from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches

if TYPE_CHECKING:  # pragma: no cover
    from torchdata.stateful_dataloader import StatefulDataLoader

    from hyperpod_lab.runtime.context import JobContext

__all__ = ["TokenWindows", "GlobalOrderSampler", "token_loader", "NodeCache", "CacheReport", "node_cache_dir",
           "CACHE_DIRNAME"]

CACHE_DIRNAME = "data"
"""The cache's directory under the node's shared-memory directory ``<shm_root>/<job_id>/<node>/``."""
_COPY_CHUNK = 8 << 20  # bytes per read from shared storage
_RECORD_VERSION = 1


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


# ---- the dataset --------------------------------------------------------------------------------
class TokenWindows(Dataset):
    """Fixed-length windows of a memory-mapped token file; sample id ``i`` -> tokens
    ``[start + i * seq_len, start + i * seq_len + seq_len]`` (``seq_len + 1`` tokens).

    Args:
        path: the token file: a flat array of ``dtype`` (no header), e.g. a node-local copy
            from :meth:`NodeCache.fetch`.
        seq_len: tokens per input window (> 0).
        dtype: the file's element type (``uint8`` bytes, ``uint16``/``int32``/... token ids).
        start, end: the token range to cut windows from (``end`` exclusive, default the whole
            file): e.g. ``end=split`` for a training split whose held-out part follows.

    Items are ``{"id": int, "x": int64 tensor (seq_len,), "y": int64 tensor (seq_len,)}``, ``y``
    being ``x`` shifted by one token; the default collate stacks them to ``(B,)``, ``(B, T)``.
    The memmap is opened lazily in each process that reads (DataLoader workers included) and is
    not pickled with the dataset.

    Raises:
        ValueError: ``seq_len`` not positive; the file's size is not a multiple of the dtype's;
            the range is out of the file or shorter than one window.
        FileNotFoundError: no file at ``path``.
    """

    def __init__(self, path: str | os.PathLike, seq_len: int, *, dtype: Any = np.uint8, start: int = 0,
                 end: int | None = None):
        self.path = os.fspath(path)
        self.seq_len = _positive("seq_len", seq_len)
        self.dtype = np.dtype(dtype)
        size = os.path.getsize(self.path)
        if size % self.dtype.itemsize:
            raise ValueError(f"{self.path} is {size} bytes, not a whole number of {self.dtype} tokens "
                             f"({self.dtype.itemsize} bytes each): is dtype right?")
        n_tokens = size // self.dtype.itemsize
        end = n_tokens if end is None else int(end)
        if not 0 <= int(start) < end <= n_tokens:
            raise ValueError(f"token range [{start}, {end}) is not inside {self.path} ({n_tokens} tokens)")
        self.start, self.end = int(start), end
        self.n = (self.end - self.start - 1) // self.seq_len
        if self.n < 1:
            raise ValueError(f"token range [{start}, {end}) of {self.path} is shorter than one window of "
                             f"{self.seq_len} + 1 tokens")
        self._tokens: np.memmap | None = None

    @property
    def tokens(self) -> np.memmap:
        """The whole file as a read-only ``numpy.memmap`` of ``dtype`` (opened on first use)."""
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._tokens

    def __len__(self) -> int:
        return self.n

    def window(self, i: int) -> np.ndarray:
        """The ``seq_len + 1`` tokens of sample ``i`` as an int64 array.

        Raises:
            IndexError: ``i`` is not in ``[0, len(self))``.
        """
        i = int(i)
        if not 0 <= i < self.n:
            raise IndexError(f"sample id {i} is not in [0, {self.n})")
        a = self.start + i * self.seq_len
        return np.asarray(self.tokens[a:a + self.seq_len + 1]).astype(np.int64)

    def __getitem__(self, i: int) -> dict[str, Any]:
        t = torch.from_numpy(self.window(i))
        return {"id": int(i), "x": t[:-1], "y": t[1:]}

    def batch(self, ids: Sequence[int]) -> dict[str, torch.Tensor]:
        """Samples ``ids`` stacked like the default collate: ``{"id": (B,), "x": (B, T), "y": (B, T)}``
        int64 (for ``ElasticBatches``' ``plan.micro_batches`` in a checkpointless job)."""
        t = torch.from_numpy(np.stack([self.window(i) for i in ids]))
        return {"id": torch.tensor([int(i) for i in ids], dtype=torch.int64), "x": t[:, :-1], "y": t[:, 1:]}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tokens"] = None  # pickling a memmap would copy the whole file
        return state


# ---- the global order -----------------------------------------------------------------------------
class GlobalOrderSampler(Sampler[int]):
    """This rank's share of a global sample order that does not depend on the number of ranks.

    The sequence: epoch ``e`` is ``torch.randperm(dataset_size)`` seeded with ``seed + e``
    (``ElasticBatches.positions``), epochs one after the other, endless. Each step (``batch_size``
    samples per rank) consumes the next ``batch_size x world_size`` positions of the sequence;
    rank ``r`` takes the ``r``-th, ``(r + W)``-th, ... of them (the interleaving ``ElasticBatches``
    uses for replicas).

    Args:
        dataset_size: samples in the dataset (> 0).
        batch_size: samples per step on each rank (> 0).
        rank, world_size: this rank among the data-parallel ranks.
        seed: seed of the order.

    State (:meth:`state_dict`): ``position`` (samples of the sequence the job consumed before the
    current step: equal on every rank), ``offset`` (samples of the current step this rank has
    taken: 0 between steps), and ``dataset_size``, ``seed``, ``batch_size``, ``world_size``.
    Restoring it on another number of ranks continues the same sequence (between steps).

    Raises:
        ValueError: a size is not a positive integer, or ``rank`` is not in ``[0, world_size)``.
    """

    def __init__(self, dataset_size: int, batch_size: int, *, rank: int = 0, world_size: int = 1, seed: int = 0):
        self.dataset_size = _positive("dataset_size", dataset_size)
        self.batch_size = _positive("batch_size", batch_size)
        self.world_size = _positive("world_size", world_size)
        if not 0 <= int(rank) < self.world_size:
            raise ValueError(f"rank {rank} is not in [0, {self.world_size})")
        self.rank, self.seed = int(rank), int(seed)
        self._order = ElasticBatches(self.dataset_size, 1, 1, seed=self.seed)
        self.position = 0
        self.offset = 0
        self._mine: tuple[int, list[int]] | None = None

    @property
    def global_batch(self) -> int:
        """Positions of the sequence one step consumes: ``batch_size x world_size``."""
        return self.batch_size * self.world_size

    @property
    def epoch(self) -> int:
        """The epoch of the next step's first sample."""
        return self.position // self.dataset_size

    def order(self, position: int, count: int) -> list[int]:
        """Sample ids at positions ``[position, position + count)`` of the global sequence."""
        return self._order.positions(int(position), int(count))

    def share(self, position: int) -> list[int]:
        """This rank's ``batch_size`` sample ids of the step that starts at ``position``."""
        if self._mine is None or self._mine[0] != position:
            self._mine = (position, self.order(position, self.global_batch)[self.rank::self.world_size])
        return self._mine[1]

    def __iter__(self) -> Iterator[int]:
        # The state moves before each id is handed out, so a state_dict() taken after the
        # consumer got the id already counts it (torchdata snapshots it with the batch).
        while True:
            mine = self.share(self.position)
            i = mine[self.offset]
            if self.offset + 1 == len(mine):
                self.position += self.global_batch
                self.offset = 0
            else:
                self.offset += 1
            yield i

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "offset": self.offset, "dataset_size": self.dataset_size,
                "seed": self.seed, "batch_size": self.batch_size, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position (of this rank or any other, of any world size).

        Raises:
            ValueError: the state is of another dataset size or seed (another order), or was
                taken in the middle of a step and the batch size or world size changed.
        """
        try:
            position, offset = int(state["position"]), int(state["offset"])
            size, seed = int(state["dataset_size"]), int(state["seed"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a GlobalOrderSampler state: {state!r}") from e
        if (size, seed) != (self.dataset_size, self.seed):
            raise ValueError(f"the saved data position is in the order of {size} samples with seed {seed}; this "
                             f"sampler has {self.dataset_size} samples and seed {self.seed}. Use the same token "
                             f"file, seq_len and seed as the run that saved it, or start without its state")
        if offset and (int(state.get("batch_size", -1)), int(state.get("world_size", -1))) != (
                self.batch_size, self.world_size):
            raise ValueError(f"the saved data position is {offset} samples into a step of batch size "
                             f"{state.get('batch_size')} x {state.get('world_size')} ranks; it can only resume with "
                             f"the same batch and world size (save between steps to change them)")
        if position < 0 or not 0 <= offset < self.batch_size:
            raise ValueError(f"invalid data position {position} / offset {offset}")
        self.position, self.offset = position, offset
        self._mine = None


def token_loader(ctx: "JobContext | None", path: str | os.PathLike, seq_len: int, batch_size: int, *,
                 dtype: Any = np.uint8, start: int = 0, end: int | None = None, seed: int = 0,
                 num_workers: int = 0, rank: int | None = None, world_size: int | None = None,
                 **loader_kwargs: Any) -> "StatefulDataLoader":
    """A ``StatefulDataLoader`` over :class:`TokenWindows` in :class:`GlobalOrderSampler`'s order.

    Args:
        ctx: the job context (``rank``/``world_size`` from it), or None (one rank unless given).
        path: the token file (a node-local copy from :meth:`NodeCache.fetch`, or any path).
        seq_len, dtype, start, end: as :class:`TokenWindows`.
        batch_size: samples per batch on this rank.
        seed: seed of the global order.
        num_workers: loader worker processes (0: read in this process).
        rank, world_size: override the context's.
        **loader_kwargs: more ``StatefulDataLoader`` arguments (``pin_memory``,
            ``prefetch_factor``, ``multiprocessing_context``, ...); not ``sampler``/``shuffle``.

    Returns:
        The loader: endless (``next(iter(loader))`` never stops; count steps yourself); its
        ``sampler`` is the :class:`GlobalOrderSampler`, ``dataset`` the :class:`TokenWindows`.
        Batches are ``{"id": (B,), "x": (B, T), "y": (B, T)}`` int64.

    Raises:
        ValueError: ``ctx`` is a checkpointless job's (use ``ElasticBatches`` plans with
            :meth:`TokenWindows.batch`: the healed cursor is the data position there); bad sizes.
        ImportError: torchdata is not installed.
    """
    if ctx is not None and getattr(ctx, "replica_group", None) is not None:
        raise ValueError("token_loader is for DDP/FSDP jobs; in a checkpointless job the data position is "
                         "Checkpointless' cursor (healed from a peer with the model): read plan.micro_batches "
                         "with TokenWindows.batch instead (docs/data.md)")
    for bad in ("sampler", "batch_sampler", "shuffle"):
        if bad in loader_kwargs:
            raise ValueError(f"token_loader sets the sampler itself; do not pass {bad}=")
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ImportError("token_loader needs torchdata>=0.11 (pip install 'torchdata>=0.11')") from e
    if rank is None:
        rank = ctx.rank if ctx is not None else 0
    if world_size is None:
        world_size = ctx.world_size if ctx is not None else 1
    dataset = TokenWindows(path, seq_len, dtype=dtype, start=start, end=end)
    sampler = GlobalOrderSampler(len(dataset), batch_size, rank=rank, world_size=world_size, seed=seed)
    with warnings.catch_warnings():  # torchdata 0.11 calls the deprecated torch.set_vital in __init__
        warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
        return _loader_class(StatefulDataLoader)(dataset, batch_size=sampler.batch_size, sampler=sampler,
                                                 num_workers=num_workers, **loader_kwargs)


def _saved_workers_and_sampler(state: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
    """``(num_workers, GlobalOrderSampler state)`` of a ``StatefulDataLoader.state_dict()``
    (the multi-process layout keeps the main process's state under ``_snapshot``)."""
    snap = state.get("_snapshot")
    main = snap.get("_main_snapshot", {}) if isinstance(snap, dict) else state
    workers = int(main.get("_num_workers", 0) or 0) if isinstance(snap, dict) else 0
    it = main.get("_sampler_iter_state")
    return workers, (it.get("sampler_state") if isinstance(it, dict) else None)


_LOADER_CLASSES: dict[type, type] = {}


def _loader_class(base: type) -> type:
    """``StatefulDataLoader`` with a state of one fixed structure: ``{"num_workers": int,
    "torchdata": str}``, torchdata's own state as JSON text (plain ints, None, dicts). torchdata's
    state has another layout with and without workers, which the persistent tier (DCP, that
    loads into the structure of a fresh ``state_dict()``) would refuse as a missing key; and
    ``load_state_dict`` also takes a state saved with another ``num_workers`` (torchdata asserts
    equal counts): then only the sampler's position is loaded (the workers hold no state:
    :class:`TokenWindows` is stateless)."""
    if base not in _LOADER_CLASSES:
        class TokenLoader(base):  # type: ignore[misc, valid-type]
            def state_dict(self) -> dict[str, Any]:
                return {"num_workers": int(self.num_workers), "torchdata": json.dumps(super().state_dict())}

            def load_state_dict(self, state_dict: dict[str, Any]) -> None:
                inner = state_dict
                if isinstance(state_dict, dict) and isinstance(state_dict.get("torchdata"), str):
                    inner = json.loads(state_dict["torchdata"])
                if inner:
                    workers, sampler_state = _saved_workers_and_sampler(inner)
                    if workers != self.num_workers and sampler_state is not None:
                        super().load_state_dict({})
                        self.sampler.load_state_dict(sampler_state)
                        return
                super().load_state_dict(inner)

        _LOADER_CLASSES[base] = TokenLoader
    return _LOADER_CLASSES[base]


# ---- the per-node cache -------------------------------------------------------------------------
def node_cache_dir(ctx: "JobContext") -> str:
    """``<shm_root>/<job_id>/<node>/data``: this node's cache directory for the job (the memory
    tier's node directory, :mod:`hyperpod_lab.runtime.checkpoint.slots`)."""
    return os.path.join(shm_root(), safe_name(ctx.job_id, 100), safe_name(ctx.node), CACHE_DIRNAME)


@dataclass(frozen=True)
class CacheReport:
    """What one :meth:`NodeCache.fetch` did.

    Attributes:
        source: the file on shared storage (absolute path).
        path: its node-local copy (read this one).
        hit: True when a valid copy was there and nothing was read from ``source``.
        bytes: size of the file, bytes.
        bytes_read: bytes read from ``source`` (0 on a hit, ``bytes`` on a miss).
        seconds: wall time of the fetch (waiting for another local rank's copy included).
        reason: why the copy was (re)made ("no copy yet", "truncated: ...", "checksum ..."),
            "" on a hit.
    """

    source: str
    path: str
    hit: bool
    bytes: int
    bytes_read: int
    seconds: float
    reason: str

    def line(self) -> str:
        """One log line: ``data cache hit|miss <source> -> <path>: ...``."""
        what = "hit" if self.hit else f"miss ({self.reason})"
        return (f"data cache {what} {self.source} -> {self.path}: {self.bytes} bytes, {self.bytes_read} read "
                f"from shared storage in {self.seconds:.3f} s")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _xxh3_file(path: str) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_COPY_CHUNK)
            if not chunk:
                return h.hexdigest()
            h.update(chunk)


class NodeCache:
    """A node-local copy, in shared memory, of files on shared storage (see the module docstring).

    Args:
        ctx: the job context: the cache is :func:`node_cache_dir` (``<shm_root>/<job_id>/<node>/
            data``), each fetch is reported in the rank's log, and ``ctx.finish`` removes the
            node's copies (an exception leaves them for the restarted process).
        directory: the cache directory instead (without ``ctx``: a script outside a job, tests).
        verify: check each reused copy's XXH3-64 checksum (reads the copy from memory; XXH3
            ran 13 GB/s on one core here, :func:`~hyperpod_lab.runtime.checkpoint.slots.checksum`);
            False checks its size only.

    Raises:
        ValueError: neither ``ctx`` nor ``directory``.
    """

    def __init__(self, ctx: "JobContext | None" = None, *, directory: str | os.PathLike | None = None,
                 verify: bool = True):
        if directory is None:
            if ctx is None:
                raise ValueError("NodeCache needs a job context (hp.init()) or directory=")
            directory = node_cache_dir(ctx)
        self.ctx, self.directory, self.verify = ctx, os.path.abspath(os.fspath(directory)), bool(verify)
        self.reports: list[CacheReport] = []
        self._closed = False
        if ctx is not None:
            ctx.register_checkpointer(self)  # finish() -> close(): removes the copies after a normal end

    def path_for(self, source: str | os.PathLike) -> str:
        """Where ``source``'s copy lives: ``<directory>/<sha256(abs source)[:16]>-<name>``."""
        source = os.path.abspath(os.fspath(source))
        digest = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return os.path.join(self.directory, f"{digest}-{safe_name(os.path.basename(source), 80)}")

    def fetch(self, source: str | os.PathLike) -> CacheReport:
        """The node-local copy of ``source``: reused when valid, else copied (under the node's lock).

        Returns:
            A :class:`CacheReport` (also appended to ``reports`` and, with a context, printed as
            ``hyperpod-lab: rank R <report line>``).

        Raises:
            FileNotFoundError: ``source`` does not exist (its ``stat`` is needed even on a hit,
                to notice a changed file).
            hyperpod_lab.private_dir.PrivateDirError: the cache directory or one above it in the
                shared-memory tree is not private (see :mod:`hyperpod_lab.private_dir`).
            OSError: the copy failed (e.g. ``/dev/shm`` is full: ENOSPC).
        """
        from hyperpod_lab.runtime.checkpoint.slots import private_tree

        t0 = time.monotonic()
        source = os.path.abspath(os.fspath(source))
        st = os.stat(source)
        ensure_private_dir(self.directory, top=private_tree(self.directory), env=ENV_SHM_DIR)
        path = self.path_for(source)
        lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one local rank copies; the others then find its copy
            reason = self._stale(source, st, path)
            read = 0
            if reason:
                read = self._copy(source, path)
        finally:
            os.close(lock)  # releases the lock
        report = CacheReport(source=source, path=path, hit=not reason, bytes=st.st_size, bytes_read=read,
                             seconds=time.monotonic() - t0, reason=reason)
        self.reports.append(report)
        if self.ctx is not None:
            print(f"hyperpod-lab: rank {self.ctx.rank} {report.line()}", flush=True)
        return report

    def _stale(self, source: str, st: os.stat_result, path: str) -> str:
        """Why the copy at ``path`` cannot be used ("" when it can)."""
        try:
            with open(path + ".json") as f:
                rec = json.load(f)
        except FileNotFoundError:
            return "no copy yet"
        except (OSError, ValueError) as e:
            return f"unreadable record: {e}"
        if not isinstance(rec, dict) or rec.get("version") != _RECORD_VERSION:
            return "record of another version"
        if (rec.get("source"), rec.get("size"), rec.get("mtime_ns")) != (source, st.st_size, st.st_mtime_ns):
            return (f"the source changed since it was copied (size {rec.get('size')} -> {st.st_size}, "
                    f"mtime_ns {rec.get('mtime_ns')} -> {st.st_mtime_ns})")
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return "the copy is missing"
        if size != st.st_size:
            return f"truncated copy: {size} bytes of {st.st_size}"
        if self.verify:
            got = _xxh3_file(path)
            if got != rec.get("xxh3"):
                return f"corrupt copy: XXH3-64 {got}, recorded {rec.get('xxh3')}"
        return ""

    def _copy(self, source: str, path: str) -> int:
        """Copy ``source`` to ``path`` (temporary file, rename, then the record); returns bytes read."""
        try:
            os.unlink(path + ".json")  # invalidate first: a copy without a record is never used
        except FileNotFoundError:
            pass
        head, name = os.path.split(path)
        for old in glob.glob(os.path.join(glob.escape(head), f".{glob.escape(name)}.tmp-*")):
            os.unlink(old)  # left by a rank killed mid-copy (we hold the lock: nobody else is copying)
        tmp = os.path.join(head, f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
        h = xxhash.xxh3_64()
        read = 0
        try:
            with open(source, "rb") as src, open(tmp, "wb") as dst:
                st = os.fstat(src.fileno())
                while True:
                    chunk = src.read(_COPY_CHUNK)
                    if not chunk:
                        break
                    read += len(chunk)
                    h.update(chunk)
                    dst.write(chunk)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        write_json_atomic(path + ".json", {"version": _RECORD_VERSION, "source": source, "size": read,
                                           "mtime_ns": st.st_mtime_ns, "xxh3": h.hexdigest(),
                                           "copied_at": time.time()}, fsync=False)
        return read

    def wait(self) -> None:
        """Nothing to wait for (``ctx.finish`` calls it on every registered object)."""

    def close(self, keep: bool | None = None) -> None:
        """Remove this node's copies (the cache directory), unless ``keep``. Idempotent.

        Args:
            keep: default: keep them only while an exception is propagating (the restarted
                process reuses them); a normal end removes them.
        """
        if self._closed:
            return
        self._closed = True
        if keep is None:
            keep = sys.exc_info()[0] is not None
        if keep:
            return
        shutil.rmtree(self.directory, ignore_errors=True)
        if self.ctx is not None:  # the node and job directories, when nothing else is left in them
            node_dir = os.path.dirname(self.directory)
            for d in (node_dir, os.path.dirname(node_dir)):
                try:
                    os.rmdir(d)
                except OSError:
                    break
