"""A tiny deterministic DDP training script for the tiered-checkpoint tests (gloo on CPU).

Each step's batch is a pure function of (step, rank), so resumed training is bit-exact. The model
has a BatchNorm (buffers change in the forward pass, which overlap mode must copy at once).

Options:
    --steps N            train steps 0..N-1 (default 40)
    --memory-every K     memory (+ peer) snapshot every K steps (default 5)
    --every K            persistent checkpoint every K steps (default 20); --keep L (default 2)
    --replicas R         peer replicas (default 1); --overlap: overlap mode
    --sleep S            seconds to sleep after each step (default 0.05)
    --model tiny|lm      the tiny MLP, or examples/train_lm.py's ByteLM (~1.9 M parameters)
    --dump               torch.save each rank's state after every memory save
                         (<job_dir>/dumps/inc<I>-step-<S>-rank-<R>.pt, I = restart count), right
                         after restore (inc<I>-restored-rank-<R>.pt, with the start step) and,
                         with --overlap, the snapshot read back from shared memory once committed
                         (inc<I>-snap-<S>-rank-<R>.pt); and at the end (final-rank-<R>.pt)
    --bench-out PATH     rank 0 writes the memory saves' timings (JSON) there at the end

Fault injection (environment, first incarnation only, i.e. restart count 0):
    TIERED_KILL_RANK=R, TIERED_KILL_AT_STEP=S
        rank R SIGKILLs itself in the middle of copying the memory snapshot of step S (after half
        of the tensors were copied into the slot)
    TIERED_WIPE_AT_STEP=S
        after the saves of step S commit, rank 1 deletes its own snapshots and rank 0 the
        replicas of rank 1 it holds; then rank 1 SIGKILLs itself (both copies of rank 1's state
        are lost: the restart must fall back to the persistent tier)
    TIERED_SLOW_COPY_S=T
        every tensor copy done in a background thread sleeps T seconds first (makes the overlap
        of the copy with the next forward/backward certain)
"""

import json
import os
import shutil
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
import toy_training as toy

import hyperpod_lab.runtime as hp
from hyperpod_lab.runtime.checkpoint import memory as memory_tier
from hyperpod_lab.spec import CheckpointPolicy

_saving_step = [-1]


def install_fault_injection(ctx):
    kill_rank = os.environ.get("TIERED_KILL_RANK")
    kill_step = int(os.environ.get("TIERED_KILL_AT_STEP", "-1"))
    slow = float(os.environ.get("TIERED_SLOW_COPY_S", "0") or 0)
    first = ctx.restart_count == 0
    armed = first and kill_rank is not None and int(kill_rank) == ctx.rank and kill_step >= 0
    if not armed and not slow:
        return
    real = memory_tier._copy_leaf
    copied = [0]

    def copy_leaf(dst, src, non_blocking):
        if slow and threading.current_thread() is not threading.main_thread():
            time.sleep(slow)
        if armed and _saving_step[0] == kill_step:
            copied[0] += 1
            if copied[0] == 3:  # some tensors are in the slot, the rest are not
                print(f"rank {ctx.rank}: SIGKILL in the middle of the memory save of step {kill_step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        real(dst, src, non_blocking)

    memory_tier._copy_leaf = copy_leaf


def save_dump(obj, path):
    """torch.save, atomically (the tests read dumps while the job runs)."""
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def export_tree(ctx, tree):
    """A snapshot tree (read back from shm) in toy_training.export()'s format."""
    return {"model": {k.removeprefix("module."): v for k, v in tree["model"].items()},
            "optim": tree["optim"], "local": tree[f"rank{ctx.rank}"], "rank": ctx.rank}


def build_model(kind):
    if kind == "lm":
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
        from train_lm import ByteLM

        return ByteLM()
    return toy.mlp(batchnorm=True)


def batch(kind, step, rank):
    if kind == "lm":
        x = torch.randint(0, 256, (8, 128), generator=torch.Generator().manual_seed(1000 * step + rank))
        return x, x
    return toy.batch(step, rank)


def loss_fn(kind, model, x, y):
    out = model(x)
    if kind == "lm":
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return torch.nn.functional.mse_loss(out, y)


def main():
    p = toy.arg_parser(steps=40, every=20, sleep=0.05)
    p.add_argument("--memory-every", type=int, default=5)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--overlap", action="store_true")
    p.add_argument("--model", choices=("tiny", "lm"), default="tiny")
    p.add_argument("--dump", action="store_true")
    p.add_argument("--bench-out", default=None)
    a = p.parse_args()

    with hp.init() as ctx:
        install_fault_injection(ctx)
        model, opt, local, state = toy.setup(ctx, lambda: build_model(a.model))
        policy = CheckpointPolicy(every_steps=a.every, keep_last=a.keep, memory_every_steps=a.memory_every)
        ckpt = hp.TieredCheckpointer(ctx, state, policy, replicas=a.replicas, overlap=a.overlap)
        start = ckpt.restore()
        inc = ctx.restart_count
        dumps = os.path.join(ctx.job_dir, "dumps")
        if a.dump:
            os.makedirs(dumps, exist_ok=True)
            save_dump(dict(toy.export(ctx, model, opt, local), start=start),
                       os.path.join(dumps, f"inc{inc}-restored-rank-{ctx.rank}.pt"))
        print(f"rank {ctx.rank}/{ctx.world_size} node={ctx.node} restart_count={inc} start={start} "
              f"partners={ckpt.partners} sources={ckpt.sources}", flush=True)
        wipe_at = int(os.environ.get("TIERED_WIPE_AT_STEP", "-1")) if inc == 0 else -1
        to_read_back = None
        timings = []
        for step in range(start, a.steps):
            x, y = batch(a.model, step, ctx.rank)
            loss = toy.train_step(opt, loss_fn(a.model, model, x, y))  # overlap: opt.step waits for the last copy
            local["samples_seen"] += x.shape[0]
            if to_read_back is not None:  # overlap: the snapshot is final now; compare it later
                ckpt.wait()
                got, tree = ckpt.memory.read(to_read_back)
                save_dump(export_tree(ctx, tree), os.path.join(dumps, f"inc{inc}-snap-{got}-rank-{ctx.rank}.pt"))
                to_read_back = None
            _saving_step[0] = step
            t0 = time.perf_counter()
            saved = ckpt.maybe_save(step)
            call_s = time.perf_counter() - t0
            _saving_step[0] = -1
            if saved and (step + 1) % a.memory_every == 0:
                timings.append({"step": step, "call_s": call_s})
                if a.dump:
                    save_dump(toy.export(ctx, model, opt, local), os.path.join(dumps, f"inc{inc}-step-{step}-rank-{ctx.rank}.pt"))
                    if a.overlap:
                        to_read_back = step
            if step == wipe_at:
                ckpt.wait()
                node_dir = ckpt.node_dir
                if ctx.rank == 1:
                    shutil.rmtree(os.path.join(node_dir, "rank-1"))
                if ctx.rank == 0:
                    shutil.rmtree(os.path.join(node_dir, "replica-of-rank-1"))
                dist.barrier()
                if ctx.rank == 1:
                    print("rank 1: both copies of my state wiped; SIGKILL", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
            ctx.step(step, loss.item())
            time.sleep(a.sleep)
        ckpt.wait()
        if a.dump:
            save_dump(toy.export(ctx, model, opt, local), os.path.join(dumps, f"final-rank-{ctx.rank}.pt"))
        if a.bench_out and ctx.rank == 0:
            with open(a.bench_out, "w") as f:
                json.dump({"timings": timings, "memory_bytes": ckpt.memory_bytes,
                           "snapshot_bytes": ckpt.memory.last.nbytes if ckpt.memory.last else None}, f)


if __name__ == "__main__":
    main()
