"""Example training job: a small byte-level decoder-only transformer on the Python stdlib.

One self-contained file: hyperpod-lab stages it alone to the cluster's shared storage, and the
same text can be the body of a ``%%hyperpod`` notebook cell. It needs torch, numpy and the
in-job runtime ``hyperpod_lab.runtime``; nothing else.

Data: the standard library's own ``*.py`` source (``sysconfig.get_paths()["stdlib"]``, sorted,
``site-packages`` excluded, capped at 8 MiB) is present on every machine. Rank 0 writes it once,
atomically, as raw bytes to ``<data-dir>/stdlib-bytes-v1.u8``; each byte is a token (vocab 256).
The file is copied once per node into shared memory (``hp.NodeCache``: a restarted rank reuses
the copy and reads nothing from shared storage) and read from there with ``np.memmap``. The last
5 % of the bytes are held out for evaluation; the rest is cut into ``--seq-len``-byte windows
(sample ``i`` starts at byte ``i * seq_len``).

Determinism: all ranks build the model from the same seed. The samples follow one global order
(a permutation per epoch seeded with ``--seed``): each step takes the next ``--batch-size`` x
ranks samples of it, rank ``r`` every ``r``-th (``hp.token_loader``: torchdata's
``StatefulDataLoader``, ``--num-workers`` reader processes). The loader's position is part of the
checkpoint, so a run resumed from a checkpoint at step ``s`` sees exactly the data an
uninterrupted run would, and a run resumed on another number of ranks goes on with the same order.

Run it::

    python train_lm.py --steps 60                                  # one process
    torchrun --standalone --nproc-per-node 2 train_lm.py --steps 60  # two ranks, DDP over gloo

Submitted with ``--recovery checkpointless`` (one replica group per node under torchft), it
takes :func:`train_checkpointless`'s step loop instead of DDP: a dead rank heals from a live
peer's memory and nodes may leave and join (``examples/flagship.ipynb``, docs/demo.md).

``--fsdp`` shards the model and optimizer state with FSDP2 (``fully_shard`` on every block and
the whole model) instead of replicating them with DDP: over all ranks in a normal job, and under
``--recovery checkpointless`` over each replica group's ranks only, torchft replicating every
shard across the groups (HSDP: a node's ranks hold one copy between them; a dead rank's group
heals shard by shard from the ranks holding the same shards on another node)::

    hyperpod-lab submit train_lm.py --nodes 2 --procs-per-node 2 --recovery checkpointless -- --fsdp
"""

import argparse
import math
import os
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CORPUS_NAME = "stdlib-bytes-v1.u8"
CORPUS_CAP_BYTES = 8 << 20          # 8 MiB
HELDOUT_FRACTION = 0.05
VOCAB = 256                          # byte-level
EVAL_BATCHES = 4                     # held-out batches (of --batch-size windows) at each eval


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------

def default_data_dir() -> Path:
    """``$HYPERPOD_LAB_SHARED_ROOT/datasets`` if that is set, else ``~/.cache/hyperpod-lab/datasets``."""
    shared = os.environ.get("HYPERPOD_LAB_SHARED_ROOT")
    if shared:
        return Path(shared) / "datasets"
    return Path.home() / ".cache" / "hyperpod-lab" / "datasets"


def stdlib_sources(stdlib: str | os.PathLike | None = None) -> list[Path]:
    """The stdlib's ``*.py`` files, sorted by POSIX relative path; third-party dirs excluded."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in filenames:
            p = Path(dirpath) / name
            if name.endswith(".py") and p.is_file():
                files.append((p.relative_to(root).as_posix(), p))
    files.sort(key=lambda t: t[0].encode())
    return [p for _, p in files]


def build_corpus(path: str | os.PathLike, cap: int = CORPUS_CAP_BYTES,
                 stdlib: str | os.PathLike | None = None) -> Path:
    """Write the corpus to ``path`` atomically (temp file + ``os.replace``); reuse it if present.

    Layout: for each source file in sorted order, its raw bytes followed by ``b"\\n"``; the
    concatenation is truncated at ``cap`` bytes. Returns ``path``.
    """
    path = Path(path)
    if path.is_file() and path.stat().st_size > 0:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    written = 0
    try:
        with open(tmp, "wb") as out:
            for src in stdlib_sources(stdlib):
                if written >= cap:
                    break
                chunk = (src.read_bytes() + b"\n")[: cap - written]
                out.write(chunk)
                written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if written < 2 * 1024:
            raise RuntimeError(f"stdlib corpus is only {written} bytes; is {stdlib or 'the stdlib'} complete?")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def load_corpus(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Memory-map the corpus; return ``(train, heldout)`` uint8 views (heldout = last 5 %)."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    split = int(len(data) * (1.0 - HELDOUT_FRACTION))
    return data[:split], data[split:]


def windows(data: np.ndarray, starts, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut ``seq_len + 1``-byte windows at ``starts`` and split them into inputs and targets.

    Returns ``x, y``: each ``(len(starts), seq_len)`` int64 byte ids, ``y`` shifted left by one.
    """
    buf = np.stack([np.asarray(data[s: s + seq_len + 1]) for s in starts])
    t = torch.from_numpy(buf.astype(np.int64))
    return t[:, :-1], t[:, 1:]


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with ``F.scaled_dot_product_attention``."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq, d_model) float -> (batch, seq, d_model)."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)                       # 3 x (b, t, d)
        # (b, t, d) -> (b, heads, t, d / heads)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, t, d / heads)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))`` (MLP 4x, GELU)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq, d_model) -> (batch, seq, d_model)."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ByteLM(nn.Module):
    """Decoder-only byte-level transformer: learned token + position embeddings, pre-LN blocks,
    final LayerNorm, output head tied to the token embedding."""

    def __init__(self, d_model: int = 192, n_layers: int = 4, n_heads: int = 4, max_seq: int = 128,
                 vocab: int = VOCAB):
        super().__init__()
        self.max_seq = max_seq
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight                             # tied
        self.apply(self._init)
        for name, p in self.named_parameters():                        # GPT-2 residual scaling
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: (batch, seq) int64 byte ids, seq <= max_seq -> logits (batch, seq, vocab) float."""
        t = idx.shape[1]
        if t > self.max_seq:
            raise ValueError(f"sequence length {t} exceeds the model's context {self.max_seq}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))  # (batch, seq, d_model)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy (nats). x, y: (batch, seq) int64 -> scalar."""
    logits = model(x)                                                  # (batch, seq, vocab)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def count_params(model: nn.Module) -> int:
    """Distinct parameters (the tied embedding counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def lr_at(step: int, total: int, base_lr: float, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to 10 % of ``base_lr`` at ``total``."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base_lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


# ----------------------------------------------------------------------------------------------
# Distributed helpers (no-ops with one process)
# ----------------------------------------------------------------------------------------------

def shard_model(model: "ByteLM", ctx, device: torch.device) -> None:
    """FSDP2 in place: ``fully_shard`` every block, then the whole model (embeddings, final norm,
    tied head), over the job's ranks, or over this replica group's ranks in a checkpointless job
    (``hyperpod_lab.runtime.checkpointless.ft.shard_mesh``; the groups replicate each shard)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if ctx.replica_group is not None:
        from hyperpod_lab.runtime.checkpointless.ft import shard_mesh

        mesh = shard_mesh(ctx)
    else:
        mesh = init_device_mesh(device.type, (ctx.world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _distributed(world_size: int) -> bool:
    return world_size > 1 and dist.is_available() and dist.is_initialized()


def barrier(world_size: int) -> None:
    if _distributed(world_size):
        dist.barrier()


def all_mean(values: list[float], world_size: int) -> list[float]:
    """Mean of each value across ranks."""
    if not _distributed(world_size):
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return (t / world_size).tolist()


@torch.no_grad()
def evaluate(model: nn.Module, heldout: np.ndarray, args, rank: int, world_size: int,
             device: torch.device) -> float:
    """Mean held-out loss over ``EVAL_BATCHES * batch_size`` evenly spaced windows.

    The windows do not depend on the world size (ranks take every ``world_size``-th one), so the
    result is comparable between runs of any size; with ``--fsdp`` their number is rounded up to a
    multiple of ``world_size x batch_size`` (each forward is a collective of the sharded model, so
    every rank must run as many).
    """
    n = EVAL_BATCHES * args.batch_size
    if getattr(args, "fsdp", False):  # every rank runs the same number of (collective) forwards
        n = -(-n // (world_size * args.batch_size)) * world_size * args.batch_size
    starts = np.linspace(0, len(heldout) - args.seq_len - 1, n).astype(np.int64)[rank::world_size]
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    for i in range(0, len(starts), args.batch_size):
        x, y = windows(heldout, starts[i: i + args.batch_size].tolist(), args.seq_len)
        k = x.shape[0]
        total += lm_loss(model, x.to(device), y.to(device)).item() * k
        count += k
    model.train(was_training)
    total, count = all_mean([total, float(count)], world_size)
    return total / max(count, 1e-9)


def set_threads(world_size: int, local_world_size: int | None = None) -> int:
    """Intra-op threads: ``$OMP_NUM_THREADS`` if set; with several ranks, the cores this process
    may use divided among the ranks on this node (at least 1); else torch's default."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        torch.set_num_threads(int(env))
    elif world_size > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // max(1, local_world_size or world_size)))
    return torch.get_num_threads()


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "train_lm").splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="optimizer steps in total")
    p.add_argument("--batch-size", type=int, default=8, help="per-rank micro-batch (sequences)")
    p.add_argument("--seq-len", type=int, default=128, help="context length in bytes")
    p.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate")
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (default: steps/10, at most 20)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--d-model", type=int, default=192)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--data-dir", default=None,
                   help="corpus directory (default $HYPERPOD_LAB_SHARED_ROOT/datasets or ~/.cache/hyperpod-lab/datasets)")
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: only at the end)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each step (tests)")
    p.add_argument("--num-workers", type=int, default=0, help="data loader worker processes per rank (0: none)")
    p.add_argument("--no-data-cache", action="store_true",
                   help="read the corpus from shared storage instead of this node's copy in /dev/shm (benchmarks)")
    p.add_argument("--fsdp", action="store_true",
                   help="shard model and optimizer state with FSDP2 (checkpointless: within each replica group, HSDP)")
    args = p.parse_args(argv)
    if args.steps < 0 or args.batch_size < 1 or args.seq_len < 1 or args.num_workers < 0:
        p.error("--steps and --num-workers must be >= 0, --batch-size and --seq-len >= 1")
    return args


def main(argv=None) -> int:
    import hyperpod_lab.runtime as hp

    args = parse_args(argv)
    # Leaving the block with an exception records it for torchrun (the agent's fault event
    # carries its message) and tears the process group down; train() finishes the job itself.
    with hp.init() as ctx:
        train(ctx, hp, args)
    return 0


def train(ctx, hp, args: argparse.Namespace) -> None:
    """The training job on this rank: data, model, restore, the step loop, eval, finish."""
    rank, world = ctx.rank, ctx.world_size
    device = torch.device(ctx.device)
    threads = set_threads(world, getattr(ctx, "local_world_size", None))

    def log(msg: str) -> None:
        if rank == 0:
            print(msg, flush=True)

    # Data: rank 0 writes the corpus once; the others wait, then build it themselves only if
    # --data-dir is not shared between nodes (same deterministic bytes either way).
    path = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    path = path / CORPUS_NAME
    if rank == 0:
        build_corpus(path)
    barrier(world)
    if rank != 0 and not path.is_file():
        build_corpus(path)
    local = path if args.no_data_cache else hp.NodeCache(ctx).fetch(path).path  # this node's copy in /dev/shm
    train_data, heldout = load_corpus(local)
    if len(heldout) < args.seq_len + 2:
        raise SystemExit(f"held-out split ({len(heldout)} bytes) is shorter than --seq-len {args.seq_len}")

    # Model and optimizer: same seed everywhere, so every rank starts identical.
    torch.manual_seed(args.seed)
    model = ByteLM(args.d_model, args.n_layers, args.n_heads, max_seq=args.seq_len).to(device)
    if args.fsdp:
        shard_model(model, ctx, device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup = args.warmup if args.warmup is not None else max(1, min(20, args.steps // 10))
    log(f"train_lm: {count_params(model):,} params, corpus {len(train_data) + len(heldout):,} bytes "
        f"({len(heldout):,} held out), world {world}, threads/rank {threads}, device {device}")

    if ctx.replica_group is not None:  # --recovery checkpointless: one replica group per node
        train_set = hp.TokenWindows(local, args.seq_len, end=len(train_data))
        train_checkpointless(ctx, args, model, opt, train_set, heldout, device, warmup, log)
        return

    # The global sample order, this rank's share; its position is saved with the model.
    loader = hp.token_loader(ctx, local, args.seq_len, args.batch_size, end=len(train_data), seed=args.seed,
                             num_workers=args.num_workers)
    # Tiered checkpointing (memory -> peer replica -> shared storage -> S3, intervals from the
    # job's spec). The checkpoint holds the unwrapped model, so it restores at any world size.
    ckpt = hp.TieredCheckpointer(ctx, {"model": model, "optimizer": opt, "data": loader})
    start = ckpt.restore()
    batches = iter(loader)
    if start:
        log(f"resumed at step {start} (restart {ctx.restart_count})")
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None) \
        if _distributed(world) and not args.fsdp else model

    tokens_per_step = args.batch_size * args.seq_len * world
    final_loss = None
    model.train()
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        lr = lr_at(step, args.steps, args.lr, warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = next(batches)
        x, y = batch["x"].to(device, non_blocking=True), batch["y"].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = lm_loss(ddp, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        (final_loss,) = all_mean([loss.item()], world)
        if not math.isfinite(final_loss):
            raise FloatingPointError(f"loss is {final_loss} at step {step}")
        tok_s = tokens_per_step / max(time.perf_counter() - t0, 1e-9)
        log(f"step {step} loss {final_loss:.4f} tok/s {tok_s:.0f}")
        ctx.step(step, loss=final_loss, tokens_per_s=tok_s, lr=lr)
        ckpt.maybe_save(step)
        if args.eval_every > 0 and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            log(f"eval step {step} eval_loss {evaluate(model, heldout, args, rank, world, device):.4f}")
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)

    eval_loss = evaluate(model, heldout, args, rank, world, device)
    log(f"final loss {final_loss:.4f} eval_loss {eval_loss:.4f}" if final_loss is not None
        else f"no steps to run (start {start} >= --steps {args.steps}); eval_loss {eval_loss:.4f}")
    ctx.finish(final_loss=final_loss, eval_loss=eval_loss)


def train_checkpointless(ctx, args, model, opt, train_set, heldout, device, warmup, log) -> None:
    """The step loop of a ``--recovery checkpointless`` job (``ctx.replica_group`` set): each
    node is a data-parallel replica group under torchft (``hyperpod_lab.runtime.checkpointless.ft``).

    A sample is a ``seq_len``-byte window of the training split (``train_set``, a
    ``hp.TokenWindows``: sample ``i`` starts at byte ``i * seq_len``); ``ElasticBatches`` deals the
    global batch (``--batch-size`` x the job's
    initial nodes x ranks per node, or the spec's ``elastic.global_batch_size``) over the live
    replica groups, so a lost node doubles the survivors' gradient accumulation and keeps the
    global batch. The learning rate is the warmup/cosine schedule of the DDP path scaled by the
    plan's ``lr / --lr`` (``lr_rule`` of the effective batch). A rank that dies heals from a
    live peer's memory (``checkpoint.restored`` tier ``replica``); an exception in a step is an
    in-process restart (``ft.recoverable()``: the step is dropped in every group and redone in the
    same processes, ``recovery.started`` {level: "in-process"}); the job's checkpoint policy is
    the fallback for when every replica is lost. The data position is the plan's cursor, healed
    with the model: a healed rank goes on with the exact sample order (docs/data.md).
    """
    from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches
    from hyperpod_lab.runtime.checkpointless.ft import Checkpointless

    spec = ctx.spec
    nodes = spec.nodes if spec is not None and spec.nodes else 1
    global_batch = (spec.elastic.global_batch_size if spec is not None and spec.elastic.global_batch_size
                    else args.batch_size * nodes * ctx.world_size)
    batches = ElasticBatches(len(train_set), global_batch, args.batch_size, seed=args.seed,
                             base_lr=args.lr, lr_rule=spec.elastic.lr_rule if spec is not None else "linear")
    ft = Checkpointless(ctx, model, opt, batches)
    log(f"checkpointless: replica group {ctx.replica_group}, global batch {global_batch} sequences")
    final_loss = None
    model.train()
    while ft.step < args.steps:
        t0 = time.perf_counter()
        plan = ft.begin_step()  # quorum; heals from a live peer when behind
        lr = plan.lr * lr_at(plan.step, args.steps, args.lr, warmup) / args.lr
        for group in opt.param_groups:
            group["lr"] = lr
        loss_sum = 0.0
        with ft.recoverable():  # an exception here drops the step in every group; it is redone in this process
            for mb in plan.micro_batches:
                batch = train_set.batch(mb)
                loss = lm_loss(model, batch["x"].to(device), batch["y"].to(device)) * plan.weight(len(mb))
                loss.backward()
                loss_sum += loss.item()
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)
        if ft.end_step(loss_sum):  # all-reduce over the quorum, commit, optimizer step
            final_loss = ft.loss
            tok_s = plan.effective_batch * args.seq_len / max(time.perf_counter() - t0, 1e-9)
            log(f"step {plan.step} loss {final_loss:.4f} tok/s {tok_s:.0f}")
            ctx.step(plan.step, loss=final_loss, tokens_per_s=tok_s, lr=lr, replicas=plan.replicas,
                     accumulation_steps=plan.accumulation_steps)
    eval_loss = evaluate(model, heldout, args, ctx.rank, ctx.world_size, device)
    log(f"final loss {final_loss:.4f} eval_loss {eval_loss:.4f}" if final_loss is not None
        else f"no steps to run (--steps {args.steps}); eval_loss {eval_loss:.4f}")
    ft.close()
    ctx.finish(final_loss=final_loss, eval_loss=eval_loss)


if __name__ == "__main__":
    sys.exit(main())
