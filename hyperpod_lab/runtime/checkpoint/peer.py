"""Peer replication: a rank's memory snapshots copied to rank(s) on other nodes.

Losing a node loses its processes and its ``/dev/shm``. So each rank's snapshot is also held by
``replicas`` rank(s) on *other* nodes (Gemini, SOSP'23, does the same with CPU memory): after a
snapshot commits locally, a background thread sends it over ``torch.distributed`` to its
partner(s), which store it in their node's shared memory under
``<shm_root>/<job>/<node>/replica-of-rank-<R>/`` with the memory tier's commit-record scheme
(:mod:`hyperpod_lab.runtime.checkpoint.slots`); the receiver checks the checksums and the snapshot's HMAC
(the sender's record's, carried in the header: it covers the step, ranks, sizes, the data's XXH3
and the layout's SHA-256, which the receiver recomputes) before committing, and stores the
sender's HMAC in its record, so a replica verifies like the original.

Placement (:func:`partner_map`): nodes are ordered by their lowest rank; rank ``r`` on node
``i`` (``j``-th rank there) sends replica ``k`` (1..replicas) to the ``j``-th rank (modulo that
node's size) of node ``(i + k) mod N``. With contiguous ranks per node that is
``(r + k * local_world_size) mod world_size``. ``replicas`` is capped at ``N - 1``.

Sharded state (HSDP: shard within a node's replica group, replicate across groups): with a
(replicate, shard) mesh over contiguous ranks, rank ``r`` holds shard ``r mod local_world_size``
of replica group ``r // local_world_size``, so its partner ``r + local_world_size`` is the rank
holding the *same* shard in the next replica group. A rank's snapshot is its local shards, and
a lost node's ranks get theirs back shard by shard from the partners' memory (the replicas),
with no storage read (``tests/runtime/test_sharded_state.py`` checks both on a 2 x 2 mesh).

Transport: the small :class:`Transport` interface moves CPU byte buffers between ranks with an
explicit timeout. :class:`GlooTransport` sends the buffers themselves (CPU, gloo);
:class:`StagedTransport` moves them through fixed-size device staging buffers, chunk by chunk
(NCCL moves device memory only; the chunk bounds the GPU memory used). Headers and layouts always
go over a gloo group (:func:`exchange_snapshots`). The same function serves replication (every
rank sends and receives in one round) and restore (a replica holder sends to a rank that lost
its own memory).

Every rank takes part in every replication round (all ranks save the same steps), so rounds
match without coordination; a failed round (a dead or hung peer: the timeout) leaves the group
in an unknown state, so the caller stops replicating until the job restarts.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch
import torch.distributed as dist

from hyperpod_lab.runtime.checkpoint.auth import sha256_hex
from hyperpod_lab.runtime.checkpoint.slots import SlotRing, checksum, record_authentic
from hyperpod_lab.runtime.state import FORMAT

if TYPE_CHECKING:  # pragma: no cover
    from hyperpod_lab.runtime.checkpoint.slots import Slot

TAG_HEADER, TAG_META, TAG_DATA = 71, 72, 73
_HEADER_LEN = 12  # int64: format, step, nbytes, meta_len, data_checksum, 0, world_size, rank, hmac (4 words)
DEFAULT_CHUNK_BYTES = 64 * 2**20


class PeerError(RuntimeError):
    """A replication or restore transfer failed: a peer died, hung past the timeout, or sent
    data that does not match its header."""


# ---- transports -------------------------------------------------------------------------------
class Transport(Protocol):
    """Moves contiguous CPU uint8 buffers between ranks of a process group."""

    def exchange(self, sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]],
                 *, timeout: timedelta, tag: int = 0) -> None:
        """Send each ``(dst_rank, buffer)`` and fill each ``(src_rank, buffer)``, all at once.

        Ranks are global ranks. The peer must post the matching call with buffers of the same
        sizes. Zero-byte buffers are skipped on both sides.

        Raises:
            PeerError: a transfer failed or did not finish within ``timeout``.
        """
        ...


def _wait_all(works: list[Any], timeout: timedelta, what: str) -> None:
    for w in works:
        try:
            ok = w.wait(timeout)
        except Exception as e:
            raise PeerError(f"{what} failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}") from e
        if ok is False:
            raise PeerError(f"{what} did not finish within {timeout.total_seconds():.0f} s")


class GlooTransport:
    """:class:`Transport` over a gloo group: the CPU buffers are sent as they are."""

    def __init__(self, group: "dist.ProcessGroup | None"):
        self.group = group

    def exchange(self, sends, recvs, *, timeout: timedelta, tag: int = 0) -> None:
        ops = [dist.P2POp(dist.irecv, b, src, self.group, tag) for src, b in recvs if b.numel()]
        ops += [dist.P2POp(dist.isend, b, dst, self.group, tag) for dst, b in sends if b.numel()]
        if not ops:
            return
        try:
            works = dist.batch_isend_irecv(ops)
        except Exception as e:
            raise PeerError(f"posting transfers failed: {type(e).__name__}: {e}") from e
        _wait_all(works, timeout, f"transfer (tag {tag}) with ranks "
                                  f"{sorted({p for p, _ in sends} | {p for p, _ in recvs})}")


class StagedTransport:
    """:class:`Transport` through device staging buffers of ``chunk_bytes``, for NCCL.

    Chunk ``k`` of every buffer moves in one batched round (``batch_isend_irecv``, so NCCL sees
    the sends and receives of a round as one group and cannot deadlock on their order):
    host-to-device into the send staging buffers, the transfers, device-to-host out of the
    receive staging buffers. GPU memory used: ``chunk_bytes`` per buffer of a call, allocated
    once and reused. With ``device="cpu"`` it runs on gloo (what the tests do: same chunking).

    Args:
        group: the process group (NCCL for CUDA devices).
        device: the staging device, e.g. ``ctx.device``.
        chunk_bytes: staging buffer size, bytes.
    """

    def __init__(self, group: "dist.ProcessGroup | None", device: torch.device | str,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        self.group, self.device, self.chunk = group, torch.device(device), int(chunk_bytes)
        self._stage: dict[tuple[str, int], torch.Tensor] = {}
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def _buf(self, kind: str, i: int, n: int) -> torch.Tensor:
        cur = self._stage.get((kind, i))
        if cur is None or cur.numel() < n:
            cur = torch.empty(self.chunk, dtype=torch.uint8, device=self.device)
            self._stage[(kind, i)] = cur
        return cur[:n]

    def exchange(self, sends, recvs, *, timeout: timedelta, tag: int = 0) -> None:
        sizes = [b.numel() for _, b in sends] + [b.numel() for _, b in recvs]
        rounds = max([math.ceil(n / self.chunk) for n in sizes] or [0])
        # the CUDA device is per thread: replication runs in a background thread, so name it
        dev = torch.cuda.device(self.device) if self._stream is not None else nullcontext()
        stream = torch.cuda.stream(self._stream) if self._stream is not None else nullcontext()
        with dev, stream:
            for k in range(rounds):
                lo, hi = k * self.chunk, (k + 1) * self.chunk
                ops, outs = [], []
                for i, (src, b) in enumerate(recvs):
                    piece = b[lo:hi]
                    if piece.numel():
                        st = self._buf("recv", i, piece.numel())
                        ops.append(dist.P2POp(dist.irecv, st, src, self.group, tag))
                        outs.append((piece, st))
                for i, (dst, b) in enumerate(sends):
                    piece = b[lo:hi]
                    if piece.numel():
                        st = self._buf("send", i, piece.numel())
                        st.copy_(piece, non_blocking=self._stream is not None)
                        ops.append(dist.P2POp(dist.isend, st, dst, self.group, tag))
                try:
                    works = dist.batch_isend_irecv(ops)
                except Exception as e:
                    raise PeerError(f"posting transfers failed: {type(e).__name__}: {e}") from e
                _wait_all(works, timeout, f"staged transfer chunk {k + 1}/{rounds}")
                for piece, st in outs:
                    piece.copy_(st)  # blocking device-to-host: the data is in place on return
            if self._stream is not None:
                self._stream.synchronize()


# ---- placement --------------------------------------------------------------------------------
def partner_map(nodes: Sequence[str], replicas: int) -> dict[int, list[int]]:
    """For each rank, the ranks (on other nodes) that hold its replicas.

    Args:
        nodes: ``nodes[r]`` is rank r's node name (an all-gather of ``ctx.node``).
        replicas: replicas per rank; capped at (number of nodes - 1).

    Returns:
        ``{rank: [holder, ...]}`` (empty lists on a single node or with ``replicas=0``).
    """
    order: list[str] = []
    members: dict[str, list[int]] = {}
    for r, n in enumerate(nodes):
        if n not in members:
            order.append(n)
            members[n] = []
        members[n].append(r)
    k_max = max(0, min(int(replicas), len(order) - 1))
    out: dict[int, list[int]] = {}
    for r, n in enumerate(nodes):
        i, j = order.index(n), members[n].index(r)
        holders = []
        for k in range(1, k_max + 1):
            other = members[order[(i + k) % len(order)]]
            holders.append(other[j % len(other)])
        out[r] = holders
    return out


def sources_of(partners: dict[int, list[int]], rank: int) -> list[int]:
    """The ranks whose replicas ``rank`` holds."""
    return sorted(r for r, hs in partners.items() if rank in hs)


# ---- moving snapshots -------------------------------------------------------------------------
@dataclass
class Outgoing:
    """A committed snapshot to send: its data (CPU uint8, ``record["nbytes"]`` long), layout
    (JSON bytes) and signed commit record."""

    data: torch.Tensor
    meta: bytes
    record: dict[str, Any]


@dataclass
class Received:
    """A snapshot received and committed into ``slot`` of a ring."""

    src: int
    slot: "Slot"
    record: dict[str, Any]
    meta: bytes


def _header(out: Outgoing | None, step: int | None) -> torch.Tensor:
    if out is None:  # nothing to send this round (the local snapshot failed): keeps rounds matched
        return torch.tensor([FORMAT, -1 if step is None else step, -1, 0, 0, 0, 0, -1, 0, 0, 0, 0], dtype=torch.int64)
    r = out.record
    tag = torch.frombuffer(bytearray(bytes.fromhex(r["hmac"])), dtype=torch.int64)
    head = torch.tensor([FORMAT, r["step"], r["nbytes"], len(out.meta), r["data_checksum"], 0,
                         r["world_size"], r["rank"]], dtype=torch.int64)
    return torch.cat([head, tag])


def exchange_snapshots(ctl: GlooTransport, data: Transport, sends: Sequence[tuple[int, Outgoing | None]],
                       recvs: Sequence[tuple[int, SlotRing]], *, timeout: timedelta, job_id: str = "",
                       expect_step: int | None = None, state_ranks: dict[int, int] | None = None,
                       replica: bool = True) -> list[Received]:
    """Send snapshots to ranks and receive snapshots into rings, in one matched round.

    Protocol: headers (gloo) -> each receiver picks and invalidates a slot of its ring and sizes
    it -> layouts (gloo) -> data (``data`` transport) -> the receiver checks the header against
    what it expected, the snapshot's HMAC under ``ring.key`` (over the header's fields, the
    layout's SHA-256 and ``job_id``) and the data checksum, and commits the slot (meta file,
    then record). A content
    problem (wrong step, wrong rank, bad checksum) is judged only after every transfer of the round
    finished, so the peers never fall out of step; the slot then stays invalid. Collective
    between each pair: the peer must post the matching call.

    Args:
        ctl: gloo transport for headers and layouts.
        data: transport for the snapshot bytes.
        sends: ``(dst_rank, Outgoing)`` pairs; ``Outgoing`` None sends a "nothing this round"
            header (the receiver then stores nothing from this sender).
        recvs: ``(src_rank, ring)`` pairs: where each incoming snapshot is stored.
        timeout: per phase.
        job_id: the job's id: part of what the HMAC covers, stamped into the receivers' records.
        expect_step: when given, every incoming header must carry this step.
        state_ranks: ``{src_rank: rank whose state it sends}``; default: its own (replication).
            A restore sends a replica: the holder ``src`` sends the state of another rank.
        replica: mark the receivers' records as replicas (``"replica": true``).

    Returns:
        The received snapshots, committed, in ``recvs`` order (senders that sent "nothing" left out).

    Raises:
        PeerError: a transfer failed or timed out, a header was malformed, or (after the round)
            a snapshot was not the expected one, failed authentication or did not match its
            checksum.
    """
    heads_in = [(src, torch.zeros(_HEADER_LEN, dtype=torch.int64)) for src, _ in recvs]
    ctl.exchange([(dst, _header(o, expect_step)) for dst, o in sends], heads_in, timeout=timeout, tag=TAG_HEADER)
    sends = [(dst, o) for dst, o in sends if o is not None]
    incoming = []  # (src, slot, header fields, meta buffer)
    for (src, ring), (_s, h) in zip(recvs, heads_in):
        fmt, step, nbytes, meta_len, data_sum, _zero, world, rank = (int(x) for x in h[:8].tolist())
        tag = h[8:].numpy().tobytes().hex()
        if fmt == FORMAT and nbytes == -1 and rank == -1:
            continue  # the sender has nothing this round
        if fmt != FORMAT or nbytes < 0 or meta_len <= 0 or meta_len > 2**31:
            raise PeerError(f"malformed snapshot header from rank {src}: {h.tolist()}")
        slot = ring.begin(step, nbytes)
        incoming.append((src, slot, {"step": step, "nbytes": nbytes, "data_checksum": data_sum, "tag": tag,
                                     "world_size": world, "rank": rank, "ring": ring},
                         torch.empty(meta_len, dtype=torch.uint8)))
    ctl.exchange([(dst, torch.frombuffer(bytearray(o.meta), dtype=torch.uint8)) for dst, o in sends],
                 [(src, mt) for src, _slot, _h, mt in incoming], timeout=timeout, tag=TAG_META)
    data.exchange([(dst, o.data[:o.record["nbytes"]]) for dst, o in sends],
                  [(src, slot.data(h["nbytes"])) for src, slot, h, _mt in incoming],
                  timeout=timeout, tag=TAG_DATA)
    out, problems = [], []
    for src, slot, h, mt in incoming:
        want_rank = src if state_ranks is None else state_ranks.get(src, src)
        meta = mt.numpy().tobytes()
        if h["rank"] != want_rank:
            problems.append(f"rank {src} sent the state of rank {h['rank']}, expected rank {want_rank}")
        elif expect_step is not None and h["step"] != expect_step:
            problems.append(f"rank {src} sent step {h['step']}, expected {expect_step} (out of step)")
        else:
            record = {"format": FORMAT, "step": h["step"], "world_size": h["world_size"], "rank": h["rank"],
                      "nbytes": h["nbytes"], "data_checksum": h["data_checksum"], "meta_sha256": sha256_hex(meta),
                      "job_id": job_id, "hmac": h["tag"]}
            if not record_authentic(h["ring"].key, record):
                problems.append(f"snapshot from rank {src} (step {h['step']}): authentication failed (its HMAC "
                                f"does not match its header and layout under the job's key)")
                continue
            got = checksum(slot.data(h["nbytes"]))
            if got != h["data_checksum"]:
                problems.append(f"data from rank {src} (step {h['step']}): checksum {got:016x} != {h['data_checksum']:016x}")
            else:
                record.update(time=time.time(), replica=bool(replica))
                slot.commit(meta, record)
                out.append(Received(src, slot, record, meta))
    if problems:
        raise PeerError("; ".join(problems))
    return out
