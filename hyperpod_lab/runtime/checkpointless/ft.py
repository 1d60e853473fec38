"""Checkpointless recovery and elastic data parallelism, on torchft.

Each data-parallel replica group (a node's torchrun, ``--standalone``, with
``$HYPERPOD_LAB_REPLICA_GROUP`` set; one or more ranks) trains a copy of the model: whole in every
rank, or sharded over the group's ranks with FSDP2 (``fully_shard(..., mesh=shard_mesh(ctx))``),
so that the groups replicate each shard (HSDP). A torchft ``Manager`` per rank talks to a torchft
Lighthouse (``$TORCHFT_LIGHTHOUSE``, started by :mod:`hyperpod_lab.node.lighthouse`) that forms a
quorum of the live replica groups before every step. Gradients are summed across the quorum with
torchft's reconfigurable process group (gloo for CPU parameters, NCCL for CUDA ones), rank r of
every group together. So:

* **a replica dies** (process or node): the survivors' all-reduce fails (a killed process: at
  once, its kernel closes the connection, gloo "Connection closed by peer"; a silent node: at the
  collective timeout); the survivors drop that step (``should_commit`` is False), form a new
  quorum without it and redo the step alone, re-sharding the global batch over fewer replicas
  (gradient accumulation keeps the global batch size). The new quorum forms as soon as the
  Lighthouse has stopped hearing the dead group's heartbeat (its heartbeat timeout, 100 ms on
  loopback, 300 ms across nodes; the dead group's heartbeats stopped with its process), which
  has usually passed by the time the survivors' failed step returns. No process restarts, no
  storage read.
* **a replacement or new replica joins** (torchrun restarted the group's workers, or a new
  node): its first quorum finds it behind; torchft sends each of its ranks the live state of the
  same rank of a healthy replica (model, optimizer, data cursor; a sharded model's local shards)
  over HTTP and it joins the next step. No storage read.
* **every replica of the state is lost** (all groups restarted at once): nobody is ahead, so
  each group falls back to its tiered checkpoint (memory, then persistent, then S3), with a
  ``recovery.fallback`` event; the next quorum equalises the groups.

Network exposure: torchft's heal transport (an HTTP server in every rank serving the full state
to a recovering replica) listens on this node's cluster address only (:func:`heal_host`;
``127.0.0.1`` when the job's Lighthouse is on loopback, i.e. the local backend), not on every
interface (:func:`bound_http_transport`), and what it serves is authenticated: an HMAC-SHA256
under the job's checkpoint key follows the state, and the recovering replica checks it before it
deserialises anything, then loads with ``weights_only=True`` (:class:`HealStateRejected`
otherwise). torchft 0.2.0 has no authentication hook for its Lighthouse or for its manager server:
see docs/checkpointless.md, "Security".

Decision and measurements: ``docs/checkpointless.md``. Timeout hierarchy (all set deliberately;
the Lighthouse's are published in ``lighthouse.json``): each group's Manager heartbeat interval
(a fifth of the heartbeat timeout: 20 ms on loopback) < Lighthouse heartbeat timeout
(``--heartbeat-ms`` of :mod:`hyperpod_lab.node.lighthouse`: 100 ms when it listens on loopback,
300 ms across nodes, above TCP's 200 ms minimum retransmission timeout; a dead group is dropped
from the next quorum after it, re-checked every ``--quorum-tick-ms``, 10 ms) < Lighthouse join
timeout (``--join-timeout-ms``, 5 s: how long a quorum waits for a group that is alive,
heartbeating, but slow to ask) < collective timeout (``$HYPERPOD_LAB_FT_TIMEOUT_S``, 10 s: an
all-reduce with a silent peer) < quorum timeout (``$HYPERPOD_LAB_FT_QUORUM_TIMEOUT_S``, 60 s:
waiting for ``min_replicas``). torchrun restarts a failed worker on its own clock (its monitor
interval 0.1 s, then start-up).

Typical use (the step loop changes; the model code does not)::

    import hyperpod_lab.runtime as hp

    with hp.init() as ctx:
        model, opt = Net(), torch.optim.AdamW(...)
        batches = hp.ElasticBatches(len(data), global_batch_size=64, micro_batch_size=8,
                                    base_lr=3e-4, lr_rule="sqrt")
        ft = hp.Checkpointless(ctx, model, opt, batches)   # tiered fallback: the spec's policy
        while ft.step < total_steps:
            plan = ft.begin_step()
            for mb in plan.micro_batches:
                loss = model.loss(data[list(mb)]) * plan.weight(len(mb))
                loss.backward()
            ft.end_step(loss_sum)        # all-reduce, commit, optimizer step; events
    # events: fault.detected (survivors), recovery.completed, checkpoint.restored tier=replica,
    # elastic.scaled, recovery.fallback
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hyperpod_lab.atomicfile import write_json_atomic
from hyperpod_lab.events import EventKind
from hyperpod_lab.jobdir import (
    ENV_FT_QUORUM_TIMEOUT,
    ENV_FT_TIMEOUT,
    ENV_REPLICA_GROUP,
    ENV_REPLICA_GROUPS,
    RECOVERY_CHECKPOINTLESS,
    TIER_REPLICA,
    JobPaths,
    job_finished,
)
from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches, StepPlan
from hyperpod_lab.runtime.checkpointless.inprocess import LEVEL_IN_PROCESS, NO_PROGRESS, InProcessRestarts
from hyperpod_lab.runtime.context import env_seconds
from hyperpod_lab.runtime.state import dtensor_type

if TYPE_CHECKING:
    from hyperpod_lab.runtime.context import JobContext
    from hyperpod_lab.spec import CheckpointPolicy

ENV_LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_QUORUM_TIMEOUT_S = 60.0
DEFAULT_HEARTBEAT_MS = 100  # a Lighthouse that published no timeout: heartbeat every 20 ms
MAX_REPLICA_GROUPS = 1024
DEFAULT_PEER_WAIT_S = 5.0  # a Lighthouse that published no join timeout (its default: 5000 ms)
PEER_RETRY_S = 0.1  # between the quorums of Checkpointless._await_live_peer
SECTION_MARGIN_S = 5.0  # the hang watchdog's budget for a quorum/all-reduce wait: torchft's own timeout plus this
_LOSS = MAX_REPLICA_GROUPS       # the member vector: [0, MAX) membership, then the loss sum,
_FAILED = MAX_REPLICA_GROUPS + 1  # then how many ranks' step raised (in-process restart)
BUCKET_BYTES = 25 << 20
"""Default size of one gradient bucket of :meth:`Checkpointless.end_step`, bytes (of fp32, as
DDP's default bucket: 25 MiB)."""


def heal_host(lighthouse_address: str) -> str:
    """The IP address this rank's heal transport listens on: ``127.0.0.1`` when the Lighthouse
    is on loopback (the local backend: every replica group is on this machine), else this node's
    address (``socket.gethostbyname`` of ``$SLURMD_NODENAME`` or the host name).

    Raises:
        OSError: the node's name does not resolve.
    """
    import socket
    from urllib.parse import urlsplit

    from hyperpod_lab.jobdir import node_name

    lh = urlsplit(lighthouse_address).hostname or ""
    if lh in ("localhost", "::1") or lh.startswith("127."):
        return "127.0.0.1"
    for name in (node_name(), socket.gethostname()):
        try:
            return socket.gethostbyname(name)
        except OSError:
            continue
    return socket.gethostbyname(socket.gethostname())


HEAL_DOMAIN = b"hyperpod-lab heal state v1"
"""Domain of the heal transport's HMAC (see :func:`bound_http_transport`)."""
HEAL_TAG_BYTES = 32
"""Size of the HMAC-SHA256 trailer after every heal response body, bytes."""


class HealStateRejected(RuntimeError):
    """The training state a recovering replica fetched from a peer was refused before anything of
    it was deserialised (its HMAC under the job's checkpoint key is missing or wrong), or it holds
    objects ``torch.load(weights_only=True)`` does not allow. torchft reports it as the step's
    error: the step is not committed and the next quorum tries the heal again."""


def _heal_mac(key: bytes, path: str):
    """HMAC-SHA256 of a heal response under ``key``, primed with the domain and the request
    path (``/checkpoint/<step>/full``: the step is covered, so an older step's state cannot be
    replayed for a newer one)."""
    import hashlib
    import hmac

    return hmac.new(key, HEAL_DOMAIN + b"\n" + path.encode("utf-8", "surrogateescape") + b"\n", hashlib.sha256)


class _MacWriter:
    """A response stream that feeds every byte written through it to an HMAC."""

    def __init__(self, raw: Any, mac: Any):
        self.raw, self.mac = raw, mac

    def write(self, data: Any) -> int:
        self.mac.update(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def bound_http_transport(host: str, timeout: timedelta, key: bytes | None = None):
    """torchft's ``HTTPTransport`` (unchanged: no fork) listening on ``host`` only, with every
    state it serves authenticated and every state it fetches verified before it is loaded.

    ``HTTPTransport`` binds every interface in its constructor and offers no parameter for it;
    this stops that server right away (it serves nothing until the first ``send_checkpoint``:
    torchft disallows checkpoints from construction on), then serves the same request handler
    from a server bound to ``host`` and advertises ``host`` in its address.

    Authentication: torchft's own transport unpickles whatever the URL the quorum names returns
    (``weights_only=False``), so whoever can answer there (or sit in between) runs code in the
    recovering replica. Here the serving side appends HMAC-SHA256 under ``key`` of (domain
    :data:`HEAL_DOMAIN`, the request path, the body) after the body (:data:`HEAL_TAG_BYTES`
    bytes; a response that failed half-way gets none); the fetching side reads the whole body
    (the state is held twice in memory for the moment), checks the trailer in constant time, and
    only then loads it with ``weights_only=True`` (tensors, numbers, strings, None, and lists,
    tuples, dicts of them: what a model's and optimizer's ``state_dict`` holds). Anything else
    raises :class:`HealStateRejected` and nothing of it is deserialised. Only unchunked transfers
    (``num_chunks=0``) are used.

    Args:
        host: an IPv4 or IPv6 address of this node.
        timeout: torchft's HTTP timeout.
        key: the job's checkpoint key (``ctx.checkpoint_key``, the file
            ``<job_dir>/checkpoint.key``, :mod:`hyperpod_lab.runtime.checkpoint.auth`), the same in
            every replica group. None: this process's random key
            (:func:`~hyperpod_lab.runtime.checkpoint.auth.process_key`), so only this process
            accepts what it serves (tests).

    Returns:
        A ``torchft.checkpointing.HTTPTransport``.
    """
    import hmac
    import io
    import socket
    import threading
    import urllib.request
    from http.server import ThreadingHTTPServer
    from urllib.parse import urlsplit

    from torchft.checkpointing import HTTPTransport

    from hyperpod_lab.runtime.checkpoint.auth import process_key

    mac_key = process_key() if key is None else bytes(key)

    class _Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        request_queue_size = 1024
        daemon_threads = True

    class BoundHTTPTransport(HTTPTransport):
        def __init__(self) -> None:
            super().__init__(timeout=timeout, num_chunks=0)
            handler = self._server.RequestHandlerClass
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)

            class SignedHandler(handler):
                """torchft's handler; the body of a 200 response is followed by its HMAC."""

                def do_GET(self) -> None:
                    real, self._hp_code, self._hp_mac = self.wfile, None, None
                    try:
                        super().do_GET()
                    finally:
                        mac, self.wfile = self._hp_mac, real
                    if mac is not None and self._hp_code == 200:
                        real.write(mac.digest())

                def send_response(self, code: int, message: str | None = None) -> None:
                    self._hp_code = code  # send_error after a 200 (the save failed): no trailer
                    super().send_response(code, message)

                def end_headers(self) -> None:
                    super().end_headers()
                    if self._hp_code == 200 and self._hp_mac is None:
                        self._hp_mac = _heal_mac(mac_key, self.path)
                        self.wfile = _MacWriter(self.wfile, self._hp_mac)

            self._server = _Server((host, 0), SignedHandler)
            self._thread = threading.Thread(target=self._serve, daemon=True, name="hyperpod-heal-http")
            self._thread.start()

        def address(self) -> str:
            port = self._server.socket.getsockname()[1]
            name = f"[{host}]" if ":" in host else host
            return f"http://{name}:{port}/checkpoint/"

        def _load_from_address(self, address: str, timeout: timedelta) -> object:
            """Fetch, authenticate, then load with ``weights_only=True`` (replaces torchft's
            classmethod, which unpickles unauthenticated bytes).

            Raises:
                HealStateRejected: no or a wrong HMAC trailer, or disallowed objects.
                OSError: the fetch failed (urllib's errors).
            """
            from torchft.checkpointing._serialization import _streaming_load

            with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as f:
                data = f.read()
            view = memoryview(data)
            payload, tag = view[:-HEAL_TAG_BYTES], bytes(view[-HEAL_TAG_BYTES:])
            mac = _heal_mac(mac_key, urlsplit(address).path)
            mac.update(payload)
            if len(data) < HEAL_TAG_BYTES or not hmac.compare_digest(mac.digest(), tag):
                raise HealStateRejected(
                    f"the training state fetched from {address} ({len(data)} bytes) failed authentication: its "
                    f"HMAC-SHA256 under the job's checkpoint key is missing or does not match (altered in transit, "
                    f"cut short, or served by a process without this job's checkpoint.key); nothing of it was "
                    f"loaded. Check that every replica group runs this hyperpod-lab with the same job directory; "
                    f"torchft retries the heal at the next quorum")
            try:
                return _streaming_load(io.BytesIO(payload), weights_only=True)
            except Exception as e:  # the weights-only unpickler's refusal (pickle.UnpicklingError), torn data
                raise HealStateRejected(
                    f"the authenticated training state from {address} could not be loaded with "
                    f"weights_only=True ({type(e).__name__}: {str(e)[:300]}): keep the replicated state to "
                    f"tensors, numbers, strings, None, lists, tuples and dicts (extra_state included)") from e

    return BoundHTTPTransport()


def manager_heartbeat_interval_ms(job_dir: str) -> int:
    """How often this group's torchft Manager heartbeats to the job's Lighthouse: the
    ``heartbeat_interval_ms`` the Lighthouse published in ``lighthouse.json`` (five beats per
    heartbeat timeout), else that of :data:`DEFAULT_HEARTBEAT_MS`."""
    from hyperpod_lab.node.lighthouse import heartbeat_interval_ms, read_info

    published = read_info(job_dir)
    try:
        interval = int(published.get("heartbeat_interval_ms") or 0)
        return interval if interval >= 1 else heartbeat_interval_ms(int(published.get("heartbeat_ms") or DEFAULT_HEARTBEAT_MS))
    except (TypeError, ValueError):
        return heartbeat_interval_ms(DEFAULT_HEARTBEAT_MS)


def peer_wait_s(job_dir: str) -> float:
    """How long a replacement group whose first quorum holds no peer ahead of it re-forms the
    quorum before it reads storage (:meth:`Checkpointless._await_live_peer`), seconds: the job's
    Lighthouse join timeout (``join_timeout_ms`` of ``lighthouse.json``, how long a quorum waits
    for a live but slow group), else :data:`DEFAULT_PEER_WAIT_S`."""
    from hyperpod_lab.node.lighthouse import read_info

    try:
        ms = float(read_info(job_dir).get("join_timeout_ms") or 0)
    except (TypeError, ValueError):
        ms = 0
    return ms / 1000 if ms > 0 else DEFAULT_PEER_WAIT_S


def replica_file(paths: JobPaths, group: int) -> str:
    """``<job_dir>/replicas/group-<G>.json``: what replica group ``group`` registered (node, pid)."""
    return paths.replica_group(group)


def shard_mesh(ctx: "JobContext"):
    """A 1-D ``DeviceMesh`` over this replica group's ranks, on ``ctx.device``'s type, for FSDP2's
    ``fully_shard(module, mesh=shard_mesh(ctx))``: shard the model within the group, replicate it
    across the groups with :class:`Checkpointless` (HSDP). In a checkpointless job the default
    process group spans the replica group only (each group is its own torchrun), so this is
    ``init_device_mesh(ctx.device.type, (ctx.world_size,))`` (gloo on CPU, NCCL on CUDA: the
    backends ``hp.init`` gave the default group).

    Returns:
        A ``torch.distributed.device_mesh.DeviceMesh`` of shape ``(ctx.world_size,)``, dimension
        name ``"shard"``.

    Raises:
        ValueError: ``ctx`` is not a checkpointless context (no replica group): there the default
            group spans the whole job; build the (replicate, shard) mesh yourself.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if ctx.replica_group is None:
        raise ValueError("shard_mesh is for checkpointless jobs (one replica group per node); in other jobs "
                         "call torch.distributed.device_mesh.init_device_mesh yourself")
    return init_device_mesh(torch.device(ctx.device).type, (ctx.world_size,), mesh_dim_names=("shard",))


def _fsdp_modules(model: torch.nn.Module) -> list[Any]:
    """The FSDP2 (``fully_shard``) modules in ``model``, outermost first; [] without FSDP2."""
    import sys

    mod = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(mod, "FSDPModule", None) if mod is not None else None
    return [m for m in model.modules() if isinstance(m, cls)] if cls is not None else []


def _to_local(obj: Any, dtensor: type | None) -> Any:
    """``obj`` (a state dict) with every DTensor replaced by this rank's local shard
    (``to_local()``, sharing memory); other leaves unchanged."""
    if dtensor is not None and isinstance(obj, dtensor):
        return obj.to_local()
    if isinstance(obj, dict):
        return {k: _to_local(v, dtensor) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_local(v, dtensor) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_local(v, dtensor) for v in obj)
    return obj


def _from_local(local: torch.Tensor, like: Any, what: str) -> Any:
    """``local`` (a shard received from a peer) as a DTensor laid out as ``like`` (this rank's live
    DTensor of the same name: mesh, placements, global shape and stride)."""
    from torch.distributed.tensor import DTensor

    want = tuple(like.to_local().shape)
    if not isinstance(local, torch.Tensor) or tuple(local.shape) != want:
        got = tuple(local.shape) if isinstance(local, torch.Tensor) else type(local).__name__
        raise ValueError(f"the healed shard of {what} has shape {got}, this rank's shard {want}: every replica "
                         f"group must shard the model the same way (same ranks per group, same fully_shard calls)")
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False,
                              shape=like.shape, stride=like.stride())


def _buckets(sizes: list[int], cap: int) -> list[list[int]]:
    """Indices of consecutive items cut into buckets of at most ``cap`` elements (an item larger
    than ``cap`` is a bucket of its own)."""
    out: list[list[int]] = []
    total = 0
    for i, n in enumerate(sizes):
        if out and total + n <= cap:
            out[-1].append(i)
            total += n
        else:
            out.append([i])
            total = n
    return out


def _layout(sharded: list[bool], sizes: list[int], cap: int) -> list[tuple[list[int], bool]]:
    """The gradient buckets of :class:`_GradReducer`: parameter indices in reverse registration
    order (the order backward produces their gradients, as DDP buckets them), cut into buckets of
    at most ``cap`` elements (:func:`_buckets`) that never mix sharded and unsharded parameters.
    Returns ``[(indices, unsharded), ...]`` in launch order."""
    out: list[tuple[list[int], bool]] = []
    run: list[int] = []
    for i in [*range(len(sizes) - 1, -1, -1), None]:
        if run and (i is None or sharded[i] != sharded[run[0]]):
            out += [([run[j] for j in b], not sharded[run[0]]) for b in _buckets([sizes[k] for k in run], cap)]
            run = []
        if i is not None:
            run.append(i)
    return out


def _exclusive(t: torch.Tensor) -> bool:
    """``t`` is the only tensor on its storage (so its version counter is its own)."""
    return (t.is_contiguous() and t.storage_offset() == 0
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


class GradientsChangedAfterReduction(RuntimeError):
    """With ``overlap=True`` a bucket's gradients were read and sent while the last micro-batch's
    backward ran, and afterwards something changed one of them (one more backward than
    ``plan.micro_batches``, a hook, clipping or scaling before ``end_step``, ``p.grad``
    replaced). The step is dropped in every group (reported to torchft) and this is raised."""


class _GradReducer:
    """The gradient reduction of :meth:`Checkpointless.end_step`, started during the last
    micro-batch's backward where it can be.

    Buckets (:func:`_layout`, fp32 copies of the gradients on their own device): unsharded
    gradients are all-reduced within the replica group (``group``, when the group has more than
    one rank), then every bucket is all-reduced (sum) across the quorum through
    ``manager.allreduce``; the last bucket is the member/loss vector, built by ``end_step``.
    Buckets are launched strictly in bucket order, so every rank issues the same collectives in
    the same order whatever the timing.

    Overlap (``overlap=True``): a ``register_post_accumulate_grad_hook`` on every parameter
    counts the gradient accumulations of the step (autograd runs it after accumulating an
    unsharded parameter's ``.grad``; FSDP2, since torch 2.5, runs it on the sharded parameter
    after accumulating its reduce-scattered shard, pytorch/pytorch#129450). When every parameter
    of the next bucket has been accumulated ``len(plan.micro_batches)`` times, its gradients are
    final: the bucket is copied and its collectives launched from the hook (on CPU the hook runs
    on the thread that called ``backward``). Whatever did not become ready (a parameter unused in
    some micro-batch, a rank with no micro-batch, a loop with one backward per step) is launched
    by ``end_step``, as without overlap. A hook on an already sent bucket, or an unsharded
    gradient that changed after it was sent (its version counter; a gradient sharing its storage
    with others is not checked), makes ``end_step`` raise
    :class:`GradientsChangedAfterReduction`.
    """

    def __init__(self, params: list[torch.Tensor], sharded: list[bool], bucket_elems: int, manager: Any,
                 group: Any, in_group: bool, overlap: bool):
        self.params, self.sharded, self.manager, self.group, self.in_group = params, sharded, manager, group, in_group
        sizes = [(p.to_local() if sh else p).numel() for p, sh in zip(params, sharded)]
        self.buckets = _layout(sharded, sizes, bucket_elems) + [([], True)]  # last: the member vector
        self.bucket_of = {i: b for b, (idx, _) in enumerate(self.buckets) for i in idx}
        self.handles = ([p.register_post_accumulate_grad_hook(self._hook_for(i)) for i, p in enumerate(params)]
                        if overlap else [])
        self.overlapped = 0  # buckets of the last step launched during backward
        self._armed = False
        self.begin(0)

    def begin(self, micro_batches: int) -> None:
        """A new step with ``micro_batches`` backward passes expected from the user's loop."""
        n = len(self.buckets)
        self._n = micro_batches
        self.overlapped = 0
        self._counts = [0] * len(self.params)
        self._pending = [len(idx) or 1 for idx, _ in self.buckets]  # the member bucket never from a hook
        self._flats: list[torch.Tensor | None] = [None] * n
        self._gworks: list[Any] = [None] * n
        self._xworks: list[Any] = [None] * n
        self._next_copy = self._next_cross = 0
        self._versions: list[tuple[int, torch.Tensor, int]] = []
        self._late: list[int] = []
        self._error: Exception | None = None
        self._failed: str | None = None
        self._armed = bool(self.handles) and micro_batches > 0

    def _local(self, i: int) -> torch.Tensor:
        g = self.params[i].grad
        return g.to_local() if self.sharded[i] else g

    def _hook_for(self, i: int):
        def hook(_param: torch.Tensor) -> None:
            if not self._armed:
                return
            try:
                with torch.no_grad():
                    self._counts[i] += 1
                    b = self.bucket_of[i]
                    if b < self._next_copy:
                        self._late.append(i)
                    elif self._counts[i] == self._n:
                        self._pending[b] -= 1
                    self._advance(final=False)
            except Exception as e:  # raised again by end_step, where it was raised before overlap
                self._error, self._armed = e, False
        return hook

    def _advance(self, final: bool) -> None:
        """Copy and launch, in bucket order, every bucket that is ready (``final``: all of them),
        then the cross-group all-reduce of each bucket whose in-group all-reduce is done
        (``final``: waiting for each)."""
        while self._next_copy < len(self.buckets) and (final or self._pending[self._next_copy] == 0):
            b = self._next_copy
            idx, unsharded = self.buckets[b]
            if idx:
                grads = [self._local(i) for i in idx]
                flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])
                if not final:
                    self.overlapped += 1
                    self._versions += [(i, g, g._version) for i, g, sh in
                                       zip(idx, grads, (self.sharded[i] for i in idx)) if not sh and _exclusive(g)]
            else:
                flat = self._member
            self._flats[b] = flat
            self._next_copy += 1
            if unsharded and self.in_group:
                self._gworks[b] = dist.all_reduce(flat, group=self.group, async_op=True)
        while self._next_cross < self._next_copy:
            b = self._next_cross
            w = self._gworks[b]
            if w is not None:
                if not final and not w.is_completed():
                    return
                w.wait()
            self._next_cross += 1
            if self._failed is None:
                try:
                    self._xworks[b] = self.manager.allreduce(self._flats[b], reduce_op=dist.ReduceOp.SUM)
                except Exception as e:  # torchft reports errors through errored(); be safe
                    self._failed = f"{type(e).__name__}: {e}"

    def changed(self, names: list[str]) -> str | None:
        """Why the gradients sent during backward are no longer the step's (None: they are)."""
        late = sorted({names[i] for i in self._late})
        changed = [names[i] for i, g, v in self._versions if self._local(i) is not g or g._version != v]
        if not late and not changed:
            return None
        what = (f"parameter {', '.join(late[:5])} received a gradient after its bucket was sent (backward ran more "
                f"than len(plan.micro_batches) = {self._n} times this step)" if late else
                f"the gradient of {', '.join(changed[:5])} changed after its bucket was sent (p.grad modified or "
                "replaced between the last micro-batch's backward and end_step)")
        return (f"overlapped gradient reduction: {what}; this step is dropped in every group. "
                "Run exactly one backward per micro-batch of plan.micro_batches and change gradients only after "
                "end_step, or pass overlap=False to Checkpointless (the reduction then reads the gradients in "
                "end_step)")

    def finish(self, member: torch.Tensor) -> str | None:
        """Launch what is left, wait for every bucket; returns the cross-group error, if any.

        Raises:
            what a hook's in-group all-reduce raised (as ``end_step`` did before overlap).
        """
        self._armed = False
        if self._error is not None:
            raise self._error
        self._member = member
        self._advance(final=True)
        cur = torch.cuda.current_stream() if member.device.type == "cuda" else None
        for w, flat in zip(self._xworks, self._flats):
            if cur is not None and flat is not None:
                flat.record_stream(cur)  # made on a hook's stream, read back on this one
            if w is not None and self._failed is None:
                try:
                    w.wait()
                except Exception as e:
                    self._failed = f"{type(e).__name__}: {e}"
        return self._failed

    def copy_back(self) -> None:
        """The sums into the gradients (after a commit)."""
        with torch.no_grad():
            for flat, (idx, _) in zip(self._flats, self.buckets):
                off = 0
                for i in idx:
                    g = self._local(i)
                    g.copy_(flat[off:off + g.numel()].view_as(g))
                    off += g.numel()

    def release(self) -> None:
        """Drop this step's buckets (as much memory as the gradients, fp32) until the next."""
        n = len(self.buckets)
        self._flats, self._gworks, self._xworks, self._versions, self._member = [None] * n, [None] * n, [None] * n, [], None

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self._armed = False


def cross_group_process_group(device: torch.device, timeout: timedelta):
    """torchft's reconfigurable process group (``torchft.process_group``, 0.2.0) for the
    gradients of parameters on ``device``: ``ProcessGroupNCCL`` for CUDA (it sets
    ``$TORCH_NCCL_NONBLOCKING_TIMEOUT`` to ``timeout`` when unset), ``ProcessGroupGloo`` otherwise.
    The Manager configures it at every quorum (rank r of every live group)."""
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    return ProcessGroupNCCL(timeout=timeout) if device.type == "cuda" else ProcessGroupGloo(timeout=timeout)


class Checkpointless:
    """Fault-tolerant, elastic data-parallel steps for one rank of a replica group.

    Args:
        ctx: the :class:`JobContext` of a checkpointless job (``ctx.replica_group`` set, i.e.
            launched with ``$HYPERPOD_LAB_REPLICA_GROUP``).
        model, optimizer: this replica's model and optimizer. Either a full copy in every rank
            (the whole state replicated), or sharded within the replica group with FSDP2
            (``fully_shard(..., mesh=shard_mesh(ctx))``: HSDP, each shard replicated across the
            groups; rank r of every group holds the same shard). With FSDP2 its gradient divide
            factor is set to 1 and its reductions to sums (``set_gradient_divide_factor(1.0)``,
            ``set_force_sum_reduction_for_comms(True)``): the micro-batch losses are already
            weighted so that sums give the mean. Tensor or pipeline parallelism is not supported.
        batches: the global-batch plan (:class:`~hyperpod_lab.runtime.checkpointless.elastic.ElasticBatches`).
        min_replicas: replica groups needed to commit a step (default: the spec's
            ``elastic.min_nodes``, else 1).
        checkpoint: the fallback tier for when no live replica holds the state: a
            :class:`~hyperpod_lab.spec.CheckpointPolicy`, True for the job spec's policy, or
            False for none. A :class:`~hyperpod_lab.runtime.checkpoint.tiered.TieredCheckpointer`
            (``replicas=0``: the other replicas are the live copies) over the model, optimizer,
            data cursor and ``extra_state`` is built and saved after each committed step.
        extra_state: more state to replicate and heal (a dict of tensors/numbers, e.g. RNG
            state), or None.
        bucket_bytes: size of the gradient buckets that :meth:`end_step` reduces, bytes (fp32).
        overlap: start each bucket's reduction during the last micro-batch's backward, as soon as
            its gradients are final (:class:`_GradReducer`; the loop is unchanged: the hooks count
            ``len(plan.micro_batches)`` backward passes). The result is bit-equal to
            ``overlap=False``, which reduces everything in :meth:`end_step` (the buckets and
            their order are the same). None (default): on for CPU parameters, off for CUDA ones
            (not yet checked on GPUs).

    Raises:
        ValueError: the context is not a checkpointless one; the model has DTensor parameters
            that no FSDP2 module manages (tensor parallelism: not supported).
        TimeoutError: ``$TORCHFT_LIGHTHOUSE`` is unset and the job's ``lighthouse.json`` did not
            appear within 60 s.
    """

    def __init__(self, ctx: "JobContext", model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 batches: ElasticBatches, *, min_replicas: int | None = None,
                 checkpoint: "CheckpointPolicy | bool" = True, extra_state: dict | None = None,
                 bucket_bytes: int = BUCKET_BYTES, overlap: bool | None = None):
        from torchft.manager import Manager

        if ctx.replica_group is None:
            raise ValueError("Checkpointless needs a replica group: launch each node with "
                             f"${ENV_REPLICA_GROUP} and ${ENV_LIGHTHOUSE} (the Slurm and local backends do "
                             "this when the job's resiliency.recovery is 'checkpointless')")
        if not os.environ.get(ENV_LIGHTHOUSE):  # the job's lighthouse publishes its address on shared storage
            from hyperpod_lab.node.lighthouse import START_TIMEOUT_S, read_address

            os.environ[ENV_LIGHTHOUSE] = read_address(ctx.job_dir, timeout_s=START_TIMEOUT_S + 30)
        if min_replicas is None:
            el = ctx.spec.elastic if ctx.spec is not None else None
            min_replicas = (el.min_nodes if el is not None and el.min_nodes else 1)
        self.ctx, self.model, self.optimizer, self.batches = ctx, model, optimizer, batches
        self.bucket_elems = max(1, int(bucket_bytes) // 4)
        self._dtensor = dtensor_type()  # None: no DTensor exists in this process (no FSDP2)
        fsdp = _fsdp_modules(model)
        if self._dtensor is not None and not fsdp and any(isinstance(p, self._dtensor) for p in model.parameters()):
            raise ValueError("the model has DTensor parameters but no FSDP2 (fully_shard) module: Checkpointless "
                             "covers data parallelism (DDP-style replicas, FSDP2 within a replica group), not "
                             "tensor or pipeline parallelism")
        for m in fsdp:  # the losses are pre-weighted: FSDP2 must sum, not average, within the group
            m.set_gradient_divide_factor(1.0)
            if hasattr(m, "set_force_sum_reduction_for_comms"):  # gloo has no PREMUL_SUM
                m.set_force_sum_reduction_for_comms(True)
        self.sharded = bool(fsdp)
        first = next(iter(model.parameters()), None)
        self.device = torch.device(ctx.device) if first is None else (
            first.to_local().device if self._dtensor is not None and isinstance(first, self._dtensor) else first.device)
        self.extra_state = extra_state if extra_state is not None else {}
        self.min_replicas = int(min_replicas)
        self.progress = {"cursor": 0}  # samples consumed (replicated and checkpointed)
        self.fallback: "TieredCheckpointer | None" = None
        if checkpoint is not False:
            from hyperpod_lab.runtime.checkpoint.tiered import TieredCheckpointer

            policy = None if checkpoint is True else checkpoint
            state = {"model": model, "optim": optimizer, "progress": self.progress}
            if self.extra_state:
                state["extra"] = self.extra_state
            self.fallback = TieredCheckpointer(ctx, state, policy, replicas=0)
        self.timeout = timedelta(seconds=env_seconds(ENV_FT_TIMEOUT, DEFAULT_TIMEOUT_S))
        quorum_timeout = timedelta(seconds=env_seconds(ENV_FT_QUORUM_TIMEOUT, DEFAULT_QUORUM_TIMEOUT_S))
        # the hang watchdog's budget for this rank's waits on the other groups: torchft bounds them
        # itself (a quorum by its quorum timeout, each collective by its timeout), so a rank waiting
        # there for a stopped peer is a victim the watchdog must not kill before torchft gives up
        # (a short resiliency.hang_timeout_s would otherwise kill the survivor at 2 x T)
        self._quorum_wait_s = quorum_timeout.total_seconds() + SECTION_MARGIN_S
        self._reduce_wait_s = 3 * self.timeout.total_seconds() + SECTION_MARGIN_S
        self._healed: dict[str, Any] | None = None
        # a group that joins (or restarts) after the job ended; rank 0 decides for the group, so
        # no rank is left alone in a collective by one that saw the end a moment earlier (and only
        # rank 0 reads the event files' ends for it: one reader a group, not one a rank)
        if self._rank0_decides(ctx.rank == 0 and job_finished(ctx.job_dir)):
            raise JobAlreadyFinished(0)
        # an initial group on the job's first start: its first-quorum "heal" is torchft's initial
        # weight sync (init_sync), not a recovery. Rank 0 decides for the group (before it registers
        # the group below): a rank that got here after that would see the registration and take the
        # group for a restarted one, and run the peer wait's collectives alone (CI: a crashed group)
        registry = replica_file(ctx.paths, ctx.replica_group)
        self._initial = self._rank0_decides(
            ctx.rank == 0 and not os.path.exists(registry) and not ctx.is_restart
            and ctx.replica_group < int(os.environ.get(ENV_REPLICA_GROUPS, "0") or 0))
        self.heartbeat_interval_ms = manager_heartbeat_interval_ms(ctx.job_dir)
        self.heal_transport = bound_http_transport(heal_host(os.environ[ENV_LIGHTHOUSE]), self.timeout,
                                                   key=ctx.checkpoint_key)
        self.manager = Manager(
            pg=cross_group_process_group(self.device, self.timeout), load_state_dict=self._load_state,
            checkpoint_transport=self.heal_transport,
            state_dict=self._state, min_replica_size=self.min_replicas, use_async_quorum=False,
            timeout=self.timeout, quorum_timeout=quorum_timeout, connect_timeout=self.timeout,
            rank=ctx.rank, world_size=ctx.world_size, replica_id=f"hyperpod_lab_group_{ctx.replica_group}",
            heartbeat_interval=timedelta(milliseconds=self.heartbeat_interval_ms), init_sync=True)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._reducer = _GradReducer(
            self._params, [self._dtensor is not None and isinstance(p, self._dtensor) for p in self._params],
            # the default group (gloo on CPU, NCCL on GPU), never ctx.cpu_group: the persistent
            # checkpoint's background thread runs DCP's collectives on that one, and two threads'
            # collectives on one gloo group deadlock or mismatch (a 2-rank group hung at every
            # persistent save: docs/scale.md, "What broke")
            self.bucket_elems, self.manager, None,
            ctx.world_size > 1, self.device.type == "cpu" if overlap is None else bool(overlap))
        self.overlapped = 0
        """Gradient buckets of the last :meth:`end_step` whose reduction started during backward."""
        self._inproc = InProcessRestarts.from_spec(ctx.spec)
        self._attempt_error: BaseException | None = None  # this rank's step raised (recoverable())
        self._attempt_detected = 0.0  # when (epoch seconds)
        self._in_process_open: dict[str, Any] | None = None  # an in-process restart not yet followed by a commit
        self._guarded = False  # the loop uses recoverable(): injected exceptions are raised inside it
        self._register()  # after the Manager exists: a registered group is heartbeating
        if self._initial:
            self._await_initial_groups()
        self.plan: StepPlan | None = None
        self._members: set[int] | None = None       # replica groups of the last committed step
        self._last_commit_time: float | None = None
        self._outage: dict[str, Any] | None = None  # a failed step not yet followed by a commit
        self._first = True
        self._step_started = 0.0

    # ---- replicated state ---------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        """What this rank sends a recovering peer (rank r of another group): model and optimizer
        state with DTensors as this rank's local shards (no DeviceMesh: it must load with
        ``weights_only=True``), the data cursor and ``extra_state``."""
        return {"model": _to_local(self.model.state_dict(), self._dtensor),
                "optim": _to_local(self.optimizer.state_dict(), self._dtensor),
                "cursor": self.progress["cursor"], "extra": self.extra_state}

    def _load_state(self, sd: dict[str, Any]) -> None:
        """Load a peer's :meth:`_state` into the live model and optimizer; shards go back into
        DTensors laid out as this rank's own (bit-equal copies).

        Raises:
            ValueError: a shard's shape differs from this rank's (groups sharded differently).
        """
        t0 = time.monotonic()
        model_sd, optim_sd = sd["model"], sd["optim"]
        if self._dtensor is not None:
            live = self.model.state_dict()
            model_sd = {k: _from_local(v, live[k], k) if isinstance(live.get(k), self._dtensor) else v
                        for k, v in model_sd.items()}
            optim_sd = self._optim_from_local(optim_sd)
        self.model.load_state_dict(model_sd)
        self.optimizer.load_state_dict(optim_sd)
        self.progress["cursor"] = int(sd["cursor"])
        self.extra_state.clear()
        self.extra_state.update(sd.get("extra") or {})
        self._healed = {"seconds": time.monotonic() - t0, "bytes": _nbytes(sd)}

    def _optim_from_local(self, sd: dict[str, Any]) -> dict[str, Any]:
        """An optimizer state dict from a peer with the per-parameter tensors of DTensor
        parameters (one element or more, e.g. Adam's ``exp_avg``; not its 0-d ``step``) made
        DTensors like their parameter."""
        ids = self.optimizer.state_dict()["param_groups"]
        params = {i: p for g_ids, g in zip(ids, self.optimizer.param_groups) for i, p in zip(g_ids["params"], g["params"])}
        state = {}
        for i, entry in sd.get("state", {}).items():
            p = params.get(i)
            if p is not None and isinstance(p, self._dtensor) and isinstance(entry, dict):
                entry = {k: _from_local(v, p, f"optimizer state {k} of parameter {i}")
                         if isinstance(v, torch.Tensor) and v.dim() > 0 else v for k, v in entry.items()}
            state[i] = entry
        return {**sd, "state": state}

    @property
    def step(self) -> int:
        """Optimizer steps committed by the job so far (the next step's index)."""
        return self.manager.current_step()

    # ---- the step -----------------------------------------------------------------------
    def begin_step(self) -> StepPlan:
        """Form the quorum for the next step (healing this replica from a live peer if it is
        behind, or from the tiered checkpoint if nobody holds the state) and return this
        rank's share of the global batch. Zeroes the gradients and sets the learning rate.

        Raises:
            RuntimeError: no quorum of ``min_replicas`` within the quorum timeout.
            InjectedFault: ``inject-fault --kind exception`` asked this rank to fail
                (``ctx.check_injected_fault``; a loop that never calls ``ctx.step`` still gets it).
        """
        if not self._guarded:
            self.ctx.check_injected_fault()
        self.optimizer.zero_grad(set_to_none=False)
        t_quorum = time.time()
        with self.ctx.waiting("quorum", timeout_s=self._quorum_wait_s):  # waiting for the other replica groups (straggler timing, watchdog)
            self.manager.start_quorum()
        if self._first and not self._initial and self.step == 0 and self._healed is None:
            self._await_live_peer()
        if self._healed is not None and self._first and self._initial:
            self._healed = None  # the initial weight sync
        if self._healed is not None:
            self._report_heal(t_quorum)
        elif self._first and self.fallback is not None and self.step == 0:
            if self._fall_back():
                self.manager.start_quorum()  # equalise with the others at the restored step
                if self._healed is not None:
                    self._report_heal(t_quorum)
        self._first = False
        replicas = max(1, self.manager.num_participants())
        replica_rank = self.manager.participating_rank() or 0
        self.ctx.is_leader = replica_rank == 0 and self.ctx.rank == 0
        plan = self.batches.plan(self.step, self.progress["cursor"], replicas, replica_rank, self.ctx.rank,
                                 self.ctx.world_size, equal_micro_batches=self.sharded)
        for group in self.optimizer.param_groups:
            group["lr"] = plan.lr
        if self.plan is not None and plan.replicas != self.plan.replicas and self.ctx.is_leader:
            old = self.plan
            self.ctx.emit(EventKind.ELASTIC_SCALED, step=plan.step,
                          old_world_size=old.replicas * self.ctx.world_size,
                          new_world_size=plan.replicas * self.ctx.world_size,
                          old_replicas=old.replicas, new_replicas=plan.replicas,
                          micro_batch_size=self.batches.micro_batch_size,
                          old_accumulation_steps=old.accumulation_steps,
                          accumulation_steps=plan.accumulation_steps,
                          global_batch_size=plan.global_batch_size, effective_batch=plan.effective_batch,
                          old_lr=old.lr, lr=plan.lr, lr_rule=self.batches.lr_rule)
        self.plan = plan
        self._step_started = time.time()
        self._reducer.begin(len(plan.micro_batches))
        return plan

    def end_step(self, loss_sum: float | torch.Tensor = 0.0) -> bool:
        """Sum the gradients over the replica group and the quorum, then step the optimizer if
        every participant succeeded (else the step is redone by the next ``begin_step``).

        Data path: the gradients (local shards of FSDP2 parameters, which FSDP2 already
        reduce-scattered within the group; whole gradients of other parameters) are copied into
        fp32 buckets of at most ``bucket_bytes`` on their own device, in reverse parameter order
        (sharded and unsharded ones apart), then a last bucket: a small vector of the group's
        membership and this rank's ``loss_sum``. Buckets of unsharded gradients (and that vector)
        are all-reduced within the replica group first (gloo ``ctx.cpu_group`` for CPU tensors,
        the default group, NCCL, for CUDA ones); then every bucket is all-reduced (sum) across the
        quorum through torchft (gloo or NCCL, see :func:`cross_group_process_group`), in bucket
        order; the sums are copied back into the gradients after the commit. With ``overlap`` a
        bucket starts during the last micro-batch's backward as soon as its gradients are final
        (:class:`_GradReducer`); this waits for every bucket and starts those that were not.

        Args:
            loss_sum: this rank's sum of weighted micro-batch losses (as returned by
                ``loss * plan.weight(n)``); summed over the job it is the mean loss of the
                effective batch.

        Returns:
            True when the step was committed. Then ``self.loss`` is the step's mean loss.

        Raises:
            GradientsChangedAfterReduction: with overlap, a gradient changed after its bucket
                was sent (more backward passes than ``plan.micro_batches``, or ``p.grad`` changed
                before ``end_step``); the step is dropped in every group first.
        """
        assert self.plan is not None, "call begin_step() first"
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        member = torch.zeros(MAX_REPLICA_GROUPS + 2, dtype=torch.float32, device=self.device)
        own_error, self._attempt_error = self._attempt_error, None
        if self.ctx.rank == 0:
            member[self.ctx.replica_group] = 1.0
        member[_LOSS] = float(loss_sum) if own_error is None else 0.0
        member[_FAILED] = 0.0 if own_error is None else 1.0
        red = self._reducer
        changed = None if own_error is not None else red.changed(self._names)
        with self.ctx.waiting("allreduce", timeout_s=self._reduce_wait_s):  # waiting for the others (straggler timing, watchdog)
            failed = red.finish(member)
        self.overlapped = red.overlapped
        raised = int(round(float(member[_FAILED]))) if failed is None else (1 if own_error is not None else 0)
        if raised:  # a rank's step raised: every group drops this step (no state diverges), then redoes it
            red.release()
            self._drop_failed_step(own_error, raised)
            return False
        if changed is not None:  # every group drops the step (no hang), then the user's error
            red.release()
            err = GradientsChangedAfterReduction(changed)
            self.manager.report_error(err)
            self.manager.should_commit()
            self._on_failed_step(changed)
            raise err
        err = self.manager.errored()
        if err is not None and failed is None:
            failed = str(err.original_exception)
        committed = self.manager.should_commit()
        if not committed:
            red.release()
            self._on_failed_step(failed or "a participant could not finish the step")
            return False
        red.copy_back()
        red.release()
        self.optimizer.step()
        self.progress["cursor"] += self.plan.effective_batch
        self.loss = float(member[_LOSS])
        self._inproc.committed()
        if self._in_process_open is not None:
            self._report_in_process_recovery()
        members = {int(i) for i in torch.nonzero(member[:MAX_REPLICA_GROUPS] > 0.5).flatten()}
        self._on_commit(members)
        if self.fallback is not None:
            self.fallback.maybe_save(self.step - 1, members=members)
        return True

    # ---- in-process restart ------------------------------------------------------------------
    def recoverable(self) -> "_StepGuard":
        """A context manager around the step's work between :meth:`begin_step` and
        :meth:`end_step` (forward, backward, data loading) that makes an exception there an
        in-process restart (:mod:`~hyperpod_lab.runtime.checkpointless.inprocess`)::

            plan = ft.begin_step()
            loss_sum = 0.0
            with ft.recoverable():
                for mb in plan.micro_batches:
                    loss = model.loss(data[list(mb)]) * plan.weight(len(mb))
                    loss.backward()
                    loss_sum += loss.item()
            ft.end_step(loss_sum)

        An ``Exception`` raised in the block is caught (its traceback goes to stderr, and
        ``fault.detected`` {reason, exception, rank, node, pid, step, level: "in-process"} is
        emitted at once); :meth:`end_step` then takes part in the step's all-reduce so that no
        peer waits, and every replica group drops the step (returns False); the next
        :meth:`begin_step` redoes it in this process. ``inject-fault --kind exception`` is raised
        at the block's end (a loop that uses the block gets it there, not in ``begin_step``).

        Not caught (the process ends, the launch agent restarts it: the process level):
        ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``); any
        exception in a replica group of several ranks (its peers may be inside an FSDP2
        collective it will never join, and gloo cannot abort one); an exception when the
        in-process budget (``resiliency.in_process_restarts`` per ``restart_window_s``) is spent
        (raised again from :meth:`end_step`, after the all-reduce).

        Raises (from :meth:`end_step`):
            NoProgressStop: ``resiliency.storm_restarts`` in-process restarts in a row gained no
                step; the job is stopped (``fault.detected`` {reason: "no progress"}, ``job.failed``).
        """
        self._guarded = True
        self.ctx.fault_check_in_step = False  # ctx.step must not raise an injected exception outside the block
        return _StepGuard(self)

    def _caught(self, exc: BaseException) -> bool:
        """The step's exception, from :class:`_StepGuard`: True to go on in process."""
        if not isinstance(exc, Exception) or self.plan is None:
            return False
        if self.ctx.world_size > 1:
            print(f"hyperpod-lab: rank {self.ctx.global_rank} step {self.plan.step} raised "
                  f"{type(exc).__name__}; its replica group has {self.ctx.world_size} ranks whose in-group "
                  "collectives gloo cannot abort: restarting the group's processes (process level)",
                  file=sys.stderr, flush=True)
            return False
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        now = time.time()
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        self.ctx.emit(EventKind.FAULT_DETECTED, reason=reason, exception=type(exc).__name__,
                      rank=self.ctx.global_rank, local_rank=self.ctx.local_rank, node=self.ctx.node,
                      pid=os.getpid(), step=self.plan.step, replica_group=self.ctx.replica_group,
                      level=LEVEL_IN_PROCESS, detected_by="rank", root_cause=True)
        self._attempt_error, self._attempt_detected = exc, now
        return True

    def _drop_failed_step(self, own_error: BaseException | None, raised: int) -> None:
        """Every group: the step is dropped because ``raised`` ranks' step raised; the ladder."""
        err = own_error if isinstance(own_error, Exception) else RuntimeError(f"{raised} rank(s)' step raised")
        self.manager.report_error(err)
        self.manager.should_commit()  # False in every group: the step is not committed anywhere
        step = self.plan.step if self.plan is not None else None
        self._on_failed_step(f"{raised} rank(s)' step raised" if own_error is None
                             else f"{type(own_error).__name__}: {own_error}")
        verdict = self._inproc.failed_step(own=own_error is not None)
        if verdict.action == NO_PROGRESS:
            self._stop_no_progress(own_error, verdict.reason, step)
        if own_error is None:
            return
        if verdict.action != LEVEL_IN_PROCESS:
            print(f"hyperpod-lab: rank {self.ctx.global_rank} step {step}: {verdict.reason}; restarting the "
                  "process (process level)", file=sys.stderr, flush=True)
            raise own_error
        self.ctx.emit(EventKind.RECOVERY_STARTED, level=LEVEL_IN_PROCESS, reason=verdict.reason, step=step,
                      rank=self.ctx.global_rank, node=self.ctx.node, pid=os.getpid(),
                      in_process_restarts=self._inproc.total, restart_count=self.ctx.restart_count)
        if self._in_process_open is None:
            self._in_process_open = {"detected": self._attempt_detected, "step": step, "dropped": 0}
        self._in_process_open["dropped"] += 1

    def _report_in_process_recovery(self) -> None:
        """The first commit after this rank's in-process restart: ``recovery.completed``."""
        rec, self._in_process_open = self._in_process_open, None
        self.ctx.emit(EventKind.RECOVERY_COMPLETED, mode=RECOVERY_CHECKPOINTLESS, level=LEVEL_IN_PROCESS,
                      restored_step=None, restored_from="none", resumed_step=self.step - 1,
                      downtime_s=round(max(0.0, time.time() - rec["detected"]), 3), dropped_steps=rec["dropped"],
                      rank=self.ctx.global_rank, pid=os.getpid(), in_process_restarts=self._inproc.total,
                      restart_count=self.ctx.restart_count)

    def _stop_no_progress(self, own_error: BaseException | None, why: str, step: int | None) -> None:
        from hyperpod_lab.node.storm import STORM_EXIT, declare

        last = None if own_error is None else " ".join(f"{type(own_error).__name__}: {own_error}".split())[:500]
        if own_error is not None:
            self.ctx.emit(EventKind.FAULT_DETECTED, reason=NO_PROGRESS, level=LEVEL_IN_PROCESS,
                          restarts=self._inproc.without_progress, step=step, rank=self.ctx.global_rank,
                          node=self.ctx.node, pid=os.getpid(), last_error=last, detected_by="rank", root_cause=True)
        declare(self.ctx.job_dir, self.ctx.writer, {  # one job.failed and storm.json, by the first rank here
            "reason": f"no progress: {why}", "restarts": self._inproc.without_progress, "fault": last,
            "criterion": "no progress"})
        print(f"hyperpod-lab: stopping the job: {why} (step {step}); delete storm.json in the job directory "
              "to run it again after a fix", file=sys.stderr, flush=True)
        raise NoProgressStop(STORM_EXIT)

    # ---- events ---------------------------------------------------------------------------
    def _on_failed_step(self, reason: str) -> None:
        if self._outage is None:
            self._outage = {"since": self._last_commit_time or self._step_started, "detected": time.time(),
                            "reason": reason, "step": self.plan.step if self.plan else None}

    def _on_commit(self, members: set[int]) -> None:
        now = time.time()
        lost = sorted(self._members - members) if self._members is not None else []
        if lost and self.ctx.is_leader:
            outage = self._outage or {"since": self._last_commit_time or now, "detected": now,
                                      "reason": "replica group left the quorum", "step": self.plan.step}
            for group in lost:
                info = self._replica_info(group)
                self.ctx.emit(EventKind.FAULT_DETECTED, rank=[group * self.ctx.world_size + r
                                                               for r in range(self.ctx.world_size)],
                              replica_group=group, node=info.get("node"), pid=info.get("pid"),
                              reason=f"replica group {group} left the quorum ({outage['reason']})",
                              detected_by=self.ctx.replica_group,
                              detection_s=round(outage["detected"] - outage["since"], 3),
                              detected_at=outage["detected"])
            # downtime_s: from the incident's first detection (this leader's, or an earlier
            # fault.detected of the same incident, e.g. the lost node's agent or the supervisor's
            # node-down report) to this commit, the first completed step after the loss. Only
            # the writers that are not ranks are read (incident_events), never every rank's
            # file: this runs on the leader between two steps (issue 27: the whole job's events
            # were read here, seconds at 2,048 ranks); a detection before the last commit with
            # the lost groups belongs to an earlier incident.
            from hyperpod_lab.events import incident_events

            first = min((ev.time for ev in incident_events(self.ctx.job_dir)
                         if ev.kind == EventKind.FAULT_DETECTED.value and ev.time >= outage["since"]), default=None)
            detected = outage["detected"] if first is None else min(first, outage["detected"])
            self.ctx.emit(EventKind.RECOVERY_COMPLETED, mode=RECOVERY_CHECKPOINTLESS, restored_step=None,
                          restored_from="none", resumed_step=self.plan.step,
                          downtime_s=round(max(0.0, now - detected), 3), replicas=len(members),
                          lost_replica_groups=lost, restart_count=self.ctx.restart_count)
        self._outage = None
        self._members = members
        self._last_commit_time = now

    def _report_heal(self, t0: float) -> None:
        healed, self._healed = self._healed, None
        if self.ctx.rank != 0:
            return
        self.ctx.emit(EventKind.CHECKPOINT_RESTORED, tier=TIER_REPLICA, step=self.step,
                      bytes=healed["bytes"], seconds=round(time.time() - t0, 3),
                      replica_group=self.ctx.replica_group, node=self.ctx.node,
                      path=None)
        self.ctx.note_restored(TIER_REPLICA, self.step)

    def _await_live_peer(self) -> None:
        """A restarted or joining group's first quorum found nobody ahead of it, although groups
        that are not in that quorum have registered (``replicas/group-G.json``): re-form the quorum
        until one holding the training state is in it (torchft heals this group from it), every
        registered group is, or :func:`peer_wait_s` has passed; only then may :meth:`begin_step`
        fall back to storage.

        Why: the Lighthouse drops a live group whose heartbeats stop for its heartbeat timeout
        (100 ms on loopback), which a starved CPU can cause; a replacement joining at that moment
        gets a quorum of its own and would read the tiered checkpoint while a peer holds the
        state (CI saw it: a persistent restore in a test of checkpointless recovery). A group
        whose peers are really gone (every group restarted) waits at most :func:`peer_wait_s`
        (5 s by default) more. Rank 0 of the group decides each round and broadcasts it over the
        group's default process group, so every rank runs the same quorums."""
        wait_s = peer_wait_s(self.ctx.job_dir)
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            go_on, registered = False, 0
            if self.ctx.rank == 0:  # one listing of replicas/ a round, not one a rank
                registered = max(1, len(self._registered_groups()))  # this group is one
                go_on = (self.step == 0 and self._healed is None and time.monotonic() < deadline
                         and self.manager.num_participants() < registered)
            if not self._rank0_decides(go_on):
                return
            if not told and self.ctx.rank == 0:
                told = True
                print(f"hyperpod-lab: replica group {self.ctx.replica_group}: no group holding the training "
                      f"state is in this quorum ({self.manager.num_participants()} of {registered} "
                      f"registered); waiting up to {wait_s:.0f} s for one before reading the tiered "
                      "checkpoint", file=sys.stderr, flush=True)
            time.sleep(PEER_RETRY_S)
            with self.ctx.waiting("quorum", timeout_s=self._quorum_wait_s):
                self.manager.start_quorum()

    def _rank0_decides(self, flag: bool) -> bool:
        """Rank 0's ``flag`` on every rank of this replica group: a broadcast (one int32 on the
        parameters' device) over the group's default process group, which every rank of the group
        must call at the same point; ``flag`` itself in a group of one rank."""
        if self.ctx.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.device)
        dist.broadcast(t, src=0)
        return bool(t.item())

    def _registered_groups(self) -> set[str]:
        """The registrations in ``replicas/`` (``group-G.json`` names): the replica groups that
        have registered in this job; empty when there is no such directory (yet)."""
        try:
            names = os.listdir(self.ctx.paths.replicas)
        except OSError:
            return set()
        return {n for n in names if n.startswith("group-") and n.endswith(".json")}

    def _fall_back(self) -> bool:
        """No live replica was ahead of us at our first quorum: restore the tiered checkpoint.
        Returns True when one was restored."""
        restored = self.fallback.restore()
        if restored <= 0:
            return False
        self.manager.load_state_dict({"step": restored, "batches_committed": 0})
        tier = (self.ctx.restored or {}).get("tier", "unknown")
        if self.ctx.rank == 0:
            self.ctx.emit(EventKind.RECOVERY_FALLBACK, replica_group=self.ctx.replica_group, step=restored,
                          tier=tier, reason="no live replica holds the training state; restored the tiered checkpoint")
        return True

    # ---- replica registry -----------------------------------------------------------------
    def _register(self) -> None:
        """Write ``<job_dir>/replicas/group-<G>.json`` (node, pid): names the group in others'
        ``fault.detected`` and tells the initial groups that this one is up."""
        path = replica_file(self.ctx.paths, self.ctx.replica_group)
        if self.ctx.rank == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_json_atomic(path, {"replica_group": self.ctx.replica_group, "node": self.ctx.node,
                                     "pid": os.getpid(), "ranks": self.ctx.world_size, "time": time.time()})

    def _await_initial_groups(self) -> None:
        """On the job's first start, wait (up to the quorum timeout) until the initial replica
        groups (``$HYPERPOD_LAB_REPLICA_GROUPS``) have registered, so the first quorum holds them
        all instead of one group starting alone and the others healing from it."""
        expected = int(os.environ.get(ENV_REPLICA_GROUPS, "0") or 0)
        if self.ctx.replica_group >= expected:
            return  # a group that joins later
        deadline = time.monotonic() + env_seconds(ENV_FT_QUORUM_TIMEOUT, DEFAULT_QUORUM_TIMEOUT_S)
        while time.monotonic() < deadline:
            have = self._registered_groups()
            if all(f"group-{g}.json" in have for g in range(expected)):
                return
            time.sleep(0.05)

    def _replica_info(self, group: int) -> dict[str, Any]:
        try:
            with open(replica_file(self.ctx.paths, group)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def close(self) -> None:
        """Leave the quorum (shuts the torchft manager down) and remove the gradient hooks."""
        self._reducer.close()
        self.manager.shutdown(wait=False)


class _StepGuard:
    """:meth:`Checkpointless.recoverable`'s context manager."""

    def __init__(self, ft: Checkpointless):
        self.ft = ft

    def __enter__(self) -> "_StepGuard":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            try:
                self.ft.ctx.check_injected_fault()  # inject-fault --kind exception lands in the step
            except Exception as injected:
                return self.ft._caught(injected) or _reraise(injected)
            return False
        return self.ft._caught(exc)


def _reraise(exc: BaseException) -> bool:
    raise exc


class NoProgressStop(SystemExit):
    """The job stopped: in-process restarts made no progress (exit status
    :data:`~hyperpod_lab.node.storm.STORM_EXIT`; see :mod:`~hyperpod_lab.runtime.checkpointless.inprocess`)."""


class JobAlreadyFinished(SystemExit):
    """Raised (exit status 0) by a replica group that starts after the job's ``finished`` event:
    there is nothing left to train, and no state to heal from."""


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0
