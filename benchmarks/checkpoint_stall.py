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

Usage: .venv/bin/python benchmarks/checkpoint_stall.py [--sizes-mb 256 1024] [--steps 5]
       [--out benchmarks/results/checkpoint_stall.json] [--methods ...]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
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
             before_optimizer: Callable[[], None] | None = None, finish: Callable[[], None] | None = None) -> float:
    """Wall seconds of ``steps`` steps, each followed by ``checkpoint(step)`` when given."""
    t0 = time.perf_counter()
    for s in range(steps):
        loop.forward_backward()
        if before_optimizer:
            before_optimizer()
        loop.optimizer_step()
        if checkpoint:
            checkpoint(s)
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


def m_ours(state, tmp, overlap: bool = False):
    from hyperpod_lab.runtime.checkpoint.memory import MemoryTier

    shm = os.environ.get("HYPERPOD_LAB_SHM_DIR", "/dev/shm/hyperpod-lab")
    tier = MemoryTier(os.path.join(shm, "bench", os.path.basename(tmp)), keep_last=2, pin_memory=False)
    wrapped = {"state": state}

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


def measure(method: str, size_mb: int, steps: int, compute_ms: float, reps: int) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"hp-bench-{method}-", dir=os.environ.get("HP_BENCH_DIR"))
    try:
        state = make_state(size_mb * MB)
        loop = Loop(state, compute_ms)
        ck, before, finish, cleanup = METHODS[method](state, tmp)
        ck(-1)  # warm up: first-touch of buffers is not a per-checkpoint cost
        if finish:
            finish()
        added = []
        for _ in range(reps):
            base = run_loop(loop, steps, None)
            withck = run_loop(loop, steps, ck, before, finish)
            added.append((withck - base) / steps)
        cleanup()
        return {"method": method, "size_mb": size_mb, "steps": steps, "reps": reps,
                "added_s_per_checkpoint": statistics.median(added), "all": added,
                "step_s_without": base / steps}
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
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "checkpoint_stall.json"))
    a = ap.parse_args()
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


if __name__ == "__main__":
    sys.exit(main())
