"""Checkpoint stall: the time a checkpoint adds to the training loop.

For each method the same synthetic training loop runs N steps that each checkpoint and N steps
that do not; the figure is ``(wall(with) - wall(without)) / N`` in seconds per checkpoint, so a
``save()`` that returns early while a background copy slows the next steps does not hide its
cost. Methods: a plain memcpy into a preallocated buffer (the physical limit), ``torch.save``
to disk (with and without fsync), DCP synchronous ``save``, DCP ``async_save`` (thread), DCP
``async_save`` with its fastest stager (``DefaultStager`` with async staging and shared memory),
and ours: the memory tier (blocking copy) and its overlap mode (the copy runs while the next
forward/backward computes; only the optimizer step waits). Ratios are against memcpy and
``torch.save`` measured in the same run.

The loop: one thread (``torch.set_num_threads(1)``); a step is a fixed matmul workload
(~``--compute-ms``) plus an in-place update of every state tensor (as an optimizer does), so
checkpoint copies compete with training for the core and memory bandwidth, as on CPU nodes.

Sharded state (``--sharded``): 2 processes (gloo), each holding its shards of an FSDP2
``fully_shard`` model (8 square bias-free ``Linear`` layers over a 1-D CPU mesh) and of its AdamW
state (DTensors); ``--sizes-mb`` is then the bytes of *local* shards per rank (parameters plus the
two AdamW moments). Methods: ``memcpy_local_shards`` (copy every local shard into preallocated
buffers: the limit) and ``ours_memory_sharded`` / ``ours_memory_sharded_overlap`` (the memory
tier snapshotting ``{"model": model, "optim": opt}``: it takes the DTensors apart into local
shards plus placements). The optimizer step of the loop updates every local shard in place. Both
ranks run each method at the same time (a barrier between methods); the figures are per rank and
the targets use the slower rank. Every row also has ``call_s_median``, the median seconds one
checkpoint call blocked (for memcpy the copy itself), a less noisy second view on a busy machine.

Usage: .venv/bin/python benchmarks/checkpoint_stall.py [--sizes-mb 256 1024] [--steps 5]
       [--out benchmarks/results/checkpoint_stall.json] [--methods ...]
       .venv/bin/python benchmarks/checkpoint_stall.py --sharded [--sizes-mb 64 256]
       [--out benchmarks/results/checkpoint_stall_sharded.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import write_results

MB = 1 << 20


def make_state(size_bytes: int, n_tensors: int = 8) -> dict[str, torch.Tensor]:
    """``n_tensors`` float32 tensors totalling ``size_bytes`` (bytes), touched once."""
    per = size_bytes // 4 // n_tensors
    return {f"w{i}": torch.randn(per) for i in range(n_tensors)}


class Loop:
    """The synthetic training step: ``compute_ms`` of matmuls, then an in-place update of the
    whole state (every byte written, like an optimizer step)."""

    def __init__(self, state: dict[str, torch.Tensor], compute_ms: float):
        self.state = state
        self.a = torch.randn(256, 256)
        t0 = time.perf_counter()
        for _ in range(20):
            self.a @ self.a
        per = (time.perf_counter() - t0) / 20
        self.reps = max(1, int(compute_ms / 1000 / per))

    def forward_backward(self) -> None:
        x = self.a
        for _ in range(self.reps):
            x = self.a @ self.a
        self._sink = x

    def optimizer_step(self) -> None:
        for t in self.state.values():
            t.mul_(0.999)


def run_loop(loop: Loop, steps: int, checkpoint: Callable[[int], None] | None,
             before_optimizer: Callable[[], None] | None = None, finish: Callable[[], None] | None = None,
             calls: list[float] | None = None) -> float:
    """Wall seconds of ``steps`` steps, each followed by ``checkpoint(step)`` when given (the
    seconds each ``checkpoint`` call blocked are appended to ``calls``)."""
    t0 = time.perf_counter()
    for s in range(steps):
        loop.forward_backward()
        if before_optimizer:
            before_optimizer()
        loop.optimizer_step()
        if checkpoint:
            c0 = time.perf_counter()
            checkpoint(s)
            if calls is not None:
                calls.append(time.perf_counter() - c0)
    if finish:
        finish()
    return time.perf_counter() - t0


# ---- methods: each returns (checkpoint(step), before_optimizer or None, finish or None, cleanup) --------------

def m_memcpy(state, tmp):
    bufs = {k: torch.empty_like(v) for k, v in state.items()}
    for k in bufs:
        bufs[k].copy_(state[k])  # touch once: the limit is a copy into resident memory

    def ck(step):
        for k, v in state.items():
            bufs[k].copy_(v)
    return ck, None, None, lambda: None


def _torch_save(fsync: bool):
    def setup(state, tmp):
        path = os.path.join(tmp, "ckpt.pt")

        def ck(step):
            with open(path, "wb") as f:
                torch.save(state, f)
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
        return ck, None, None, lambda: None
    return setup


def _ensure_pg():
    import torch.distributed as dist

    if not dist.is_initialized():
        store = dist.FileStore(tempfile.mktemp(prefix="hp-bench-store-"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)


def m_dcp_sync(state, tmp):
    import torch.distributed.checkpoint as dcp

    _ensure_pg()

    def ck(step):
        dcp.save(state, checkpoint_id=os.path.join(tmp, f"dcp-{step % 2}"))
    return ck, None, None, lambda: None


def _dcp_async(fast_stager: bool):
    def setup(state, tmp):
        import torch.distributed.checkpoint as dcp

        _ensure_pg()
        kw = {}
        if fast_stager:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            kw["async_stager"] = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=True,
                                                              use_async_staging=True, use_non_blocking_copy=False))
        pending = []

        def wait_all():
            while pending:
                r = pending.pop(0)
                fut = getattr(r, "upload_completion", r)
                fut.result()
                if fast_stager and hasattr(r, "staging_completion"):
                    r.staging_completion.result()

        def ck(step):
            wait_all()  # one in flight, as a real loop must before reusing the staging memory
            pending.append(dcp.async_save(state, checkpoint_id=os.path.join(tmp, f"dcp-{step % 2}"), **kw))

        before = None
        if fast_stager:
            def before():  # the state may change only once staging finished
                for r in pending:
                    if hasattr(r, "staging_completion"):
                        r.staging_completion.result()
        return ck, before, wait_all, wait_all
    return setup


def m_ours(state, tmp, overlap: bool = False, wrap: bool = True):
    from hyperpod_lab.runtime.checkpoint.memory import MemoryTier

    shm = os.environ.get("HYPERPOD_LAB_SHM_DIR", "/dev/shm/hyperpod-lab")
    tier = MemoryTier(os.path.join(shm, "bench", os.path.basename(tmp)), keep_last=2, pin_memory=False)
    wrapped = {"state": state} if wrap else state

    def ck(step):
        tier.snapshot(step, wrapped, overlap=overlap)
    before = tier.wait_copy if overlap else None
    return ck, before, tier.wait, lambda: (tier.wait(), tier.close(remove=True))


METHODS = {
    "memcpy": m_memcpy,
    "torch_save": _torch_save(False),
    "torch_save_fsync": _torch_save(True),
    "dcp_save": m_dcp_sync,
    "dcp_async_save": _dcp_async(False),
    "dcp_async_save_fast_stager": _dcp_async(True),
    "ours_memory": lambda s, t: m_ours(s, t, overlap=False),
    "ours_memory_overlap": lambda s, t: m_ours(s, t, overlap=True),
}


# ---- sharded state: FSDP2 local shards ----------------------------------------------------------
LAYERS = 8


def make_sharded_state(size_bytes: int) -> tuple[dict[str, torch.Tensor], dict]:
    """An FSDP2 model sharded over every rank (1-D CPU mesh) and its AdamW state after one step,
    about ``size_bytes`` bytes of local shards on this rank (parameters + 2 moments, float32).

    Returns:
        ``(local shards by name, {"model": model, "optim": optimizer})``; the local shards are
        the DTensors' own local tensors (updating them updates the model and the optimizer).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    d = max(world, int((size_bytes * world / (LAYERS * 4 * 3)) ** 0.5))
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(LAYERS)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, d)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    locs = {f"p{i}": p.to_local().detach() for i, p in enumerate(model.parameters())}
    for i, st in enumerate(opt.state.values()):
        for k in ("exp_avg", "exp_avg_sq"):
            locs[f"p{i}-{k}"] = st[k].to_local()
    return locs, {"model": model, "optim": opt}


SHARDED_METHODS = {
    "memcpy_local_shards": lambda locs, full, tmp: m_memcpy(locs, tmp),
    "ours_memory_sharded": lambda locs, full, tmp: m_ours(full, tmp, wrap=False),
    "ours_memory_sharded_overlap": lambda locs, full, tmp: m_ours(full, tmp, overlap=True, wrap=False),
}


def measure(method: str, size_mb: int, steps: int, compute_ms: float, reps: int) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"hp-bench-{method}-", dir=os.environ.get("HP_BENCH_DIR"))
    try:
        if method in SHARDED_METHODS:
            state, full = make_sharded_state(size_mb * MB)
            setup = lambda st, t: SHARDED_METHODS[method](st, full, t)  # noqa: E731
        else:
            state, setup = make_state(size_mb * MB), METHODS[method]
        loop = Loop(state, compute_ms)
        ck, before, finish, cleanup = setup(state, tmp)
        ck(-1)  # warm up: first-touch of buffers is not a per-checkpoint cost
        if finish:
            finish()
        added, calls = [], []
        for _ in range(reps):
            base = run_loop(loop, steps, None)
            withck = run_loop(loop, steps, ck, before, finish, calls)
            added.append((withck - base) / steps)
        cleanup()
        return {"method": method, "size_mb": size_mb, "steps": steps, "reps": reps,
                "state_bytes": sum(t.numel() * t.element_size() for t in state.values()),
                "added_s_per_checkpoint": statistics.median(added), "all": added,
                "call_s_median": statistics.median(calls), "step_s_without": base / steps}
    finally:
        gc.collect()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--compute-ms", type=float, default=200.0)
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--out", default=None, help="default benchmarks/results/checkpoint_stall[_sharded].json")
    ap.add_argument("--sharded", action="store_true", help="FSDP2 local shards on 2 processes (see the docstring)")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)  # a --sharded worker
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.out is None:
        a.out = os.path.join(os.path.dirname(__file__), "results",
                             "checkpoint_stall_sharded.json" if a.sharded else "checkpoint_stall.json")
    if a.sharded:
        return sharded_main(a)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
    rows = []
    for size in a.sizes_mb:
        for m in a.methods:
            try:
                r = measure(m, size, a.steps, a.compute_ms, a.reps)
            except Exception as e:  # a method that cannot run here is reported, not hidden
                r = {"method": m, "size_mb": size, "error": f"{type(e).__name__}: {e}"}
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "all"}), flush=True)
    table = {}
    for size in a.sizes_mb:
        by = {r["method"]: r.get("added_s_per_checkpoint") for r in rows if r["size_mb"] == size}
        mc, ts, tsf = by.get("memcpy"), by.get("torch_save"), by.get("torch_save_fsync")
        fast = by.get("dcp_async_save_fast_stager")
        for m, v in by.items():
            if v is None:
                continue
            table.setdefault(size, {})[m] = {
                "added_ms": v * 1000,
                "x_memcpy": v / mc if mc else None,
                "torch_save_over_this": ts / v if v > 0 and ts else None,
                "torch_save_fsync_over_this": tsf / v if v > 0 and tsf else None,
            }
        ours = by.get("ours_memory")
        if ours is not None and mc:
            table[size]["targets"] = {
                "ours_le_1.5x_memcpy": ours <= 1.5 * mc,
                "ours_5x_less_than_torch_save": bool(ts and ts >= 5 * ours),
                "ours_15x_less_than_torch_save_fsync": bool(tsf and tsf >= 15 * ours),
                "ours_le_dcp_async_fast_stager": bool(fast is not None and ours <= fast),
            }
        ov = by.get("ours_memory_overlap")
        if ov is not None and mc:
            table[size]["targets"]["overlap_le_0.25x_memcpy"] = ov <= 0.25 * mc
    print("\nadded time per checkpoint (ms), and ratios measured in this run:")
    for size, ms in table.items():
        print(f"-- state {size} MB")
        for m, v in ms.items():
            if m == "targets":
                print(f"   targets: {v}")
                continue
            extra = ""
            if v["x_memcpy"] is not None:
                extra += f"  {v['x_memcpy']:.2f}x memcpy"
            if v["torch_save_over_this"]:
                extra += f"  torch.save/this {v['torch_save_over_this']:.1f}x"
            print(f"   {m:<28} {v['added_ms']:9.1f} ms{extra}")
    return write_results(a.out, {"benchmark": "checkpoint_stall", "threads": 1, "compute_ms": a.compute_ms,
                                 "rows": rows, "table": {str(k): v for k, v in table.items()}}, said="wrote")


def sharded_worker(a) -> int:
    """One rank of ``--sharded``: every method at every size, a barrier before each; JSON rows on
    stdout (one line, prefixed ``ROWS ``)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(a.store, WORLD), rank=a.rank, world_size=WORLD)
    methods = [m for m in a.methods if m in SHARDED_METHODS] or list(SHARDED_METHODS)
    rows = []
    for size in a.sizes_mb:
        for m in methods:
            dist.barrier()
            try:
                r = measure(m, size, a.steps, a.compute_ms, a.reps)
            except Exception as e:  # reported, not hidden
                r = {"method": m, "size_mb": size, "error": f"{type(e).__name__}: {e}"}
            rows.append(dict(r, rank=a.rank))
    dist.barrier()
    print("ROWS " + json.dumps(rows), flush=True)
    dist.destroy_process_group()
    return 0


WORLD = 2


def sharded_main(a) -> int:
    """``--sharded``: run :func:`sharded_worker` on :data:`WORLD` processes, tabulate, write JSON."""
    if a.rank is not None:
        return sharded_worker(a)
    store = tempfile.mktemp(prefix="hp-bench-store-")
    base = [sys.executable, os.path.abspath(__file__), "--sharded", "--store", store, "--steps", str(a.steps),
            "--reps", str(a.reps), "--compute-ms", str(a.compute_ms), "--sizes-mb", *map(str, a.sizes_mb),
            "--methods", *a.methods]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(base + ["--rank", str(r)], stdout=subprocess.PIPE, text=True, env=env)
             for r in range(WORLD)]
    outs = [p.communicate()[0] for p in procs]
    if os.path.exists(store):
        os.unlink(store)
    if any(p.returncode for p in procs):
        print("\n".join(outs), file=sys.stderr)
        return 1
    rows = [r for out in outs for line in out.splitlines() if line.startswith("ROWS ") for r in json.loads(line[5:])]
    table = {}
    for size in a.sizes_mb:
        per, blocked = {}, {}
        for r in rows:
            if r["size_mb"] == size and "added_s_per_checkpoint" in r:
                per.setdefault(r["method"], {})[r["rank"]] = r["added_s_per_checkpoint"]
                blocked.setdefault(r["method"], {})[r["rank"]] = r["call_s_median"]
        mc, mcb = per.get("memcpy_local_shards", {}), blocked.get("memcpy_local_shards", {})
        entry = {}
        for m, by_rank in per.items():
            entry[m] = {"added_ms_per_rank": {k: v * 1000 for k, v in sorted(by_rank.items())},
                        "x_memcpy_per_rank": {k: v / mc[k] if mc.get(k, 0) > 0 else None for k, v in sorted(by_rank.items())},
                        "blocked_ms_per_rank": {k: v * 1000 for k, v in sorted(blocked[m].items())},
                        "blocked_x_memcpy_per_rank": {k: v / mcb[k] if mcb.get(k) else None
                                                      for k, v in sorted(blocked[m].items())}}
        ours, ov = per.get("ours_memory_sharded"), per.get("ours_memory_sharded_overlap")
        if ours and len(mc) == WORLD and all(v > 0 for v in mc.values()):
            worst = max(ours[k] / mc[k] for k in ours)
            worst_blocked = max(blocked["ours_memory_sharded"][k] / mcb[k] for k in ours)
            entry["targets"] = {"ours_sharded_x_memcpy_worst_rank": worst, "ours_sharded_le_1.5x_memcpy": worst <= 1.5,
                                "ours_sharded_blocked_x_memcpy_worst_rank": worst_blocked}
            if ov:
                entry["targets"]["overlap_x_memcpy_worst_rank"] = max(ov[k] / mc[k] for k in ov)
        table[str(size)] = entry
    print("\nsharded state (FSDP2, 2 ranks): added time per checkpoint (ms) per rank, ratios vs memcpy of the local shards")
    for size, entry in table.items():
        print(f"-- {size} MB of local shards a rank")
        for m, v in entry.items():
            print(f"   {m:<30} {v}")
    return write_results(a.out, {"benchmark": "checkpoint_stall", "mode": "sharded", "world": WORLD, "threads": 1,
                                 "compute_ms": a.compute_ms, "rows": rows, "table": table}, said="wrote")


if __name__ == "__main__":
    sys.exit(main())
