"""GPU check: everything in hyperpod-lab that needs a GPU, in one command, as JSON.

Five checks, each in its own child process (``sys.executable`` this file ``--one NAME``) so a
check that fails, crashes the process or hangs records its error (or its exit status and the
tail of its output, or the timeout) in the JSON and the others still run:

``memory_tier_stall``
    The memory tier (:class:`hyperpod_lab.runtime.checkpoint.memory.MemoryTier`, shared-memory
    slots page-locked with ``cudaHostRegister``) snapshotting a state of ``--state-mib`` MiB of
    CUDA tensors, against the baseline measured in the same process: a device-to-host copy of the
    same tensors into page-locked (``pin_memory=True``) buffers. Two measures: the raw copy
    (seconds from the call to the bytes being on the host, best of ``--reps``; the tier's also
    with its commit: XXH3 checksum, meta, signed record) and the added time per checkpoint in a
    synthetic loop (``(wall of N steps that each checkpoint - wall of N plain steps) / N``; a step
    is ``--compute-ms`` of matmuls plus an in-place update of every state tensor). Correct when
    the newest snapshot read back equals the state bit for bit. Also says whether the slots were
    page-locked (an unpinned slot makes every copy synchronous).
``memory_tier_overlap``
    The tier's overlap mode with a real ``nn.Module`` + Adam on the GPU (``--overlap-mib`` MiB of
    parameters and optimizer state): parameter and optimizer-state copies run on a side CUDA
    stream during the next forward/backward, ``wait_copy()`` right before ``optimizer.step()``.
    Added time per checkpoint for the pinned memcpy baseline, the blocking tier and the overlap
    mode in the same loop; correct when the two snapshots in the ring equal clones of the state
    taken at their steps (the older one was overwritten by a later optimizer step on the GPU
    after its copy was queued, so a copy not ordered before that step shows here).
``checkpointless_step``
    :class:`hyperpod_lab.runtime.checkpointless.ft.Checkpointless` (torchft Manager, a real
    Lighthouse on loopback, one replica group) training a small model on the GPU for
    ``--ft-steps`` steps: every step must commit and the parameters must stay on the device.
``dcp_cuda``
    The persistent tier (:class:`hyperpod_lab.runtime.checkpoint.persistent.Checkpointer`, DCP
    on the context's gloo checkpoint group, pinned staging buffers) saving ``--dcp-mib`` MiB of
    CUDA model + Adam state asynchronously and synchronously, then restoring it after the state
    changed: the restore must return the saved step + 1 and give back the saved values, still on
    the GPU. Blocked and total seconds against the pinned memcpy of the same bytes.
``health_nvidia_smi``
    :func:`hyperpod_lab.node.health.check_node` with ``expect_gpus`` = ``torch.cuda.device_count()``:
    its ``gpu`` check runs and parses the real ``nvidia-smi``; correct when it passed and what it
    parsed (count, names, memory) agrees with what torch sees.

Without CUDA (``torch.cuda.is_available()`` False, or torch not importable) it prints
``no GPU: ...``, writes ``{"gpu": null, "ran": false, "reason": ...}`` to ``--out`` and exits
with status 3. ``--dry-run-on-cpu`` runs the same five check functions on CPU tensors instead
(children get ``CUDA_VISIBLE_DEVICES=""``: gloo instead of NCCL, pageable instead of pinned
memory, small sizes; the health check reads a FAKE ``nvidia-smi``, a shell script printing one
illustrative H100 row, so that its parser runs), to exercise the code paths without a GPU
(``tests/runtime/test_gpu_check.py``); its figures say nothing about GPUs.

Exit status: 0 every check passed; 1 a check failed (its error is in the JSON); 2 a usage error;
3 no GPU (nothing ran).

The default sizes are meant to keep one H100 run to about 2-3 minutes (an estimate: no GPU was
available when this was written); ``--budget-s`` (280 s) bounds it: no check starts once the
budget is spent (it is recorded as not run) and each gets at most what is left. The memory tier needs
``2 x`` its state in free shared memory (``--shm-dir``, default ``$HYPERPOD_LAB_SHM_DIR`` or
``/dev/shm/hyperpod-lab``); a smaller tmpfs shrinks the state to fit, with a warning in the JSON.

Usage: python benchmarks/gpu_check.py [--out benchmarks/results/gpu_check.json]
       [--state-mib 2048] [--overlap-mib 1024] [--dcp-mib 512] [--checks NAME ...] [--dry-run-on-cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks._common import write_results  # noqa: E402

MiB = 1 << 20
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU = 0, 1, 2, 3
"""Exit statuses: every check passed / a check failed / bad arguments / no GPU, nothing ran."""
CHECKS = ("memory_tier_stall", "memory_tier_overlap", "checkpointless_step", "dcp_cuda", "health_nvidia_smi")
"""The checks, in the order they run."""
NO_GPU = ("no GPU: torch.cuda.is_available() is False on this machine; run it on a GPU machine "
          "(or pass --dry-run-on-cpu to exercise the same code paths on CPU tensors)")

# sizes per mode: (GPU run, CPU dry run)
DEFAULTS = {
    "state_mib": (2048, 8), "overlap_mib": (1024, 4), "dcp_mib": (512, 4), "compute_ms": (100.0, 5.0),
    "steps": (4, 2), "reps": (3, 1), "ft_steps": (5, 2), "check_timeout_s": (150.0, 120.0),
}

# What the FAKE nvidia-smi of the dry run prints (one row for health.GPU_FIELDS) and what the
# health check must parse out of it. Illustrative values of an H100, not captured from one.
FAKE_SMI_ROW = ("0, NVIDIA H100 80GB HBM3, GPU-00000000-0000-0000-0000-000000000000, 00000000:18:00.0, "
                "81559, 0, [N/A], No, No")
FAKE_SMI_PARSED = {"index": "0", "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-00000000-0000-0000-0000-000000000000",
                   "pci.bus_id": "00000000:18:00.0", "memory.total": "81559",
                   "ecc.errors.uncorrected.volatile.total": "0", "retired_pages.pending": None,
                   "remapped_rows.pending": "No", "remapped_rows.failure": "No"}


# ---- helpers the checks share ------------------------------------------------------------------
def _sync(device: str) -> None:
    """Wait for the GPU's queued work (no-op on CPU)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _host_like(tensors: list, pinned: bool) -> list:
    """Host buffers of each tensor's shape and dtype, page-locked when ``pinned``, touched once."""
    import torch

    out = [torch.empty(t.shape, dtype=t.dtype, pin_memory=pinned) for t in tensors]
    for o in out:
        o.zero_()
    return out


def _copy_all(dsts: list, srcs: list, non_blocking: bool) -> None:
    for d, s in zip(dsts, srcs):
        d.copy_(s, non_blocking=non_blocking)


def _best_s(fn: Callable[[], None], device: str, reps: int) -> float:
    """Fastest of ``reps`` timed calls of ``fn`` (each ends when the GPU finished), seconds."""
    times = []
    for _ in range(max(1, reps)):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def _nbytes(tensors: list) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _existing(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _fit_shm(want: int, slots: int, shm_dir: str, out: dict, what: str) -> int:
    """``want`` bytes, or less when ``slots`` copies of it do not fit in 80% of the free space
    of ``shm_dir``'s file system (a warning in ``out`` says so). Raises OSError when not even
    1 MiB fits."""
    st = os.statvfs(_existing(shm_dir))
    free = st.f_bavail * st.f_frsize
    cap = int(free * 0.8) // slots // MiB * MiB
    if want > cap:
        if cap < MiB:
            raise OSError(f"{free} bytes free in {shm_dir}: too little shared memory for the memory tier; "
                          "pass --shm-dir on a larger tmpfs")
        out.setdefault("warnings", []).append(
            f"{what}: {slots} slots of {want // MiB} MiB do not fit the {free // MiB} MiB free in {shm_dir}; "
            f"measured with {cap // MiB} MiB (pass --shm-dir on a larger tmpfs for the full size)")
        return cap
    return want


def _mismatch(a: Any, b: Any, path: str = "") -> str | None:
    """Where two state trees differ (tensors bit for bit, on the CPU; dict keys compared as
    strings, since a snapshot's JSON layout stringifies them), or None when they are equal."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path}: {type(a).__name__} vs {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        return None if torch.equal(a.detach().cpu(), b.detach().cpu()) else f"{path}: values differ"
    if isinstance(a, dict) and isinstance(b, dict):
        ka, kb = {str(k): v for k, v in a.items()}, {str(k): v for k, v in b.items()}
        if set(ka) != set(kb):
            return f"{path}: keys {sorted(ka)} vs {sorted(kb)}"
        for k in ka:
            m = _mismatch(ka[k], kb[k], f"{path}/{k}")
            if m:
                return m
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            m = _mismatch(x, y, f"{path}/{i}")
            if m:
                return m
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def _clone_tree(obj: Any) -> Any:
    """A deep copy of a state tree whose tensors are cloned on their device."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone_tree(v) for v in obj)
    return obj


class Compute:
    """``compute_ms`` of square matmuls on ``device`` (calibrated once), the stand-in for a
    step's forward/backward."""

    def __init__(self, device: str, compute_ms: float):
        import torch

        n = 4096 if device == "cuda" else 256
        self.a = torch.randn(n, n, device=device) / n ** 0.5
        self.device = device
        per = _best_s(lambda: [self.a @ self.a for _ in range(10)], device, 2) / 10
        self.reps = max(1, int(compute_ms / 1000 / max(per, 1e-9)))

    def __call__(self) -> None:
        x = self.a
        for _ in range(self.reps):
            x = self.a @ self.a
        self._sink = x


def _loop_wall(device: str, steps: int, forward_backward: Callable[[], None], optimizer_step: Callable[[], None],
               checkpoint: Callable[[], None] | None = None, before_optimizer: Callable[[], None] | None = None,
               finish: Callable[[], None] | None = None) -> float:
    """Wall seconds of ``steps`` steps (each: forward/backward, [before_optimizer], optimizer
    step, [checkpoint]), then ``finish`` and the GPU drained."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        forward_backward()
        if before_optimizer is not None:
            before_optimizer()
        optimizer_step()
        if checkpoint is not None:
            checkpoint()
    if finish is not None:
        finish()
    _sync(device)
    return time.perf_counter() - t0


def _added(device: str, steps: int, reps: int, fb, opt, methods: dict[str, tuple]) -> dict[str, Any]:
    """Added seconds per checkpoint of each method ``{name: (checkpoint, before_optimizer,
    finish)}``: per repetition, (wall with - wall of plain steps) / steps; medians, every
    repetition, and the ratios to ``memcpy`` when its spread is below its median (else None:
    the difference is noise)."""
    added: dict[str, list[float]] = {m: [] for m in methods}
    plain: list[float] = []
    for _ in range(max(1, reps)):
        for m, (ck, before, finish) in methods.items():
            base = _loop_wall(device, steps, fb, opt)
            plain.append(base / steps)
            added[m].append((_loop_wall(device, steps, fb, opt, ck, before, finish) - base) / steps)
    med = {m: statistics.median(v) for m, v in added.items()}
    out: dict[str, Any] = {"steps": steps, "reps": reps, "plain_step_s": statistics.median(plain),
                           "added_s_per_checkpoint": med, "all": added}
    if "memcpy" in med:
        noise = max(added["memcpy"]) - min(added["memcpy"])
        conclusive = med["memcpy"] > 0 and noise < med["memcpy"]
        out["memcpy_spread_s"] = noise
        out["x_memcpy"] = {m: (v / med["memcpy"] if conclusive else None) for m, v in med.items()}
    return out


def _mlp(device: str, state_bytes: int):
    """An MLP of square layers (no bias) on ``device`` whose parameters + Adam state (3x the
    parameters) take about ``state_bytes``, its Adam optimizer (state created by one step), one
    input batch, and a ``forward_backward`` closure."""
    import torch

    d = 4096 if device == "cuda" else 256
    layers = max(2, round(state_bytes / (3 * d * d * 4)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(layers)]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(64 if device == "cuda" else 8, d, device=device)

    def forward_backward() -> None:
        model(x).square().mean().backward()

    def optimizer_step() -> None:
        opt.step()
        opt.zero_grad(set_to_none=False)

    forward_backward()
    optimizer_step()
    return model, opt, forward_backward, optimizer_step


def _tier_dir(o: dict) -> str:
    """``<shm_dir>/gpu-check-<pid>/rank-0``: this check's memory-tier ring (removed with its
    parent when the check ends)."""
    return os.path.join(o["shm_dir"], f"gpu-check-{os.getpid()}", "rank-0")


# ---- the checks: each fills ``out`` (numbers first, so a failure keeps what was measured) -------
def check_memory_tier_stall(o: dict, out: dict) -> None:
    """See the module docstring. ``o``: the options (device, sizes, shm_dir, work_dir)."""
    import torch

    from hyperpod_lab.runtime.checkpoint.memory import MemoryTier

    dev, reps, cuda = o["device"], o["reps"], o["device"] == "cuda"
    nbytes = _fit_shm(o["state_mib"] * MiB, 2, o["shm_dir"], out, "memory_tier_stall")
    n_tensors = 8
    state = {f"w{i}": torch.randn(nbytes // 4 // n_tensors, device=dev) for i in range(n_tensors)}
    tensors = list(state.values())
    out["state_bytes"] = _nbytes(tensors)
    out["state_device"] = str(tensors[0].device)

    # the baseline: device-to-host copy of the same tensors into page-locked buffers
    host = _host_like(tensors, pinned=cuda)
    out["memcpy"] = {"pinned": bool(host[0].is_pinned()) if cuda else False,
                     "seconds": _best_s(lambda: _copy_all(host, tensors, cuda), dev, reps)}
    out["memcpy"]["gb_per_s"] = out["state_bytes"] / out["memcpy"]["seconds"] / 1e9

    tier = MemoryTier(_tier_dir(o), keep_last=2, pin_memory=cuda)
    counter = iter(range(1 << 30))
    wrapped = {"state": state}
    try:
        t0 = time.perf_counter()
        snap = tier.snapshot(next(counter), wrapped)
        tier.wait()
        out["first_snapshot_s"] = time.perf_counter() - t0  # allocates (and page-locks) the slots
        out["slot_pinned"] = bool(snap.slot.pinned)
        if cuda and not snap.slot.pinned:
            out.setdefault("warnings", []).append("the memory tier's slot is not page-locked (cudaHostRegister "
                                                  "failed): its device-to-host copies are synchronous")
        copy_s, commit_s, blocked_s = [], [], []
        for _ in range(max(1, reps)):
            _sync(dev)
            t0 = time.perf_counter()
            snap = tier.snapshot(next(counter), wrapped)
            _sync(dev)  # the copies were queued on the current stream: now they are on the host
            copy_s.append(time.perf_counter() - t0)
            tier.wait()
            blocked_s.append(snap.blocked_s)
            commit_s.append(snap.total_s)
        out["snapshot"] = {"copy_s": min(copy_s), "blocked_s": min(blocked_s), "commit_s": min(commit_s),
                           "gb_per_s": out["state_bytes"] / min(copy_s) / 1e9}
        out["snapshot_copy_x_memcpy"] = min(copy_s) / out["memcpy"]["seconds"]
        out["snapshot_commit_x_memcpy"] = min(commit_s) / out["memcpy"]["seconds"]

        compute = Compute(dev, o["compute_ms"])

        def update() -> None:  # the optimizer's in-place write of every state tensor
            for t in tensors:
                t.mul_(0.999)

        out["loop"] = _added(dev, o["steps"], reps, compute, update, {
            "memcpy": (lambda: _copy_all(host, tensors, cuda), None, None),
            "memory_tier": (lambda: tier.snapshot(next(counter), wrapped), None, tier.wait),
        })
        step, tree = tier.read()
        bad = _mismatch(tree["state"], state, "state")
        out["restored_step"] = step
        out["restored_equal"] = bad is None
        if bad:
            out["restored_mismatch"] = bad
    finally:
        tier.close(remove=True)
        shutil.rmtree(os.path.dirname(tier.directory), ignore_errors=True)
    out["ok"] = bool(out.get("restored_equal"))


def check_memory_tier_overlap(o: dict, out: dict) -> None:
    """See the module docstring."""
    from hyperpod_lab.runtime.checkpoint.memory import MemoryTier
    from hyperpod_lab.runtime.state import capture

    dev, reps, cuda = o["device"], o["reps"], o["device"] == "cuda"
    want = _fit_shm(o["overlap_mib"] * MiB, 2, o["shm_dir"], out, "memory_tier_overlap")
    model, opt, fb_model, opt_step = _mlp(dev, want)
    state = {"model": model, "optim": opt}
    cap = capture(state)
    out["state_bytes"] = cap.nbytes
    out["tensors"] = len(cap.tensors)
    out["deferrable_bytes"] = _nbytes([t for t, d in zip(cap.tensors, cap.deferrable) if d])
    out["state_device"] = str(next(model.parameters()).device)
    compute = Compute(dev, o["compute_ms"])

    def fb() -> None:
        compute()
        fb_model()

    host = _host_like(cap.tensors, pinned=cuda)
    tier = MemoryTier(_tier_dir(o), keep_last=2, pin_memory=cuda)
    counter = iter(range(1 << 30))
    try:
        tier.snapshot(next(counter), state)  # allocate (and page-lock) both slots off the clock
        tier.wait()
        tier.snapshot(next(counter), state, overlap=True)
        tier.wait()
        out["slot_pinned"] = bool(tier.last.slot.pinned)
        out["loop"] = _added(dev, o["steps"], reps, fb, opt_step, {
            "memcpy": (lambda: _copy_all(host, cap.tensors, cuda), None, None),
            "memory_tier": (lambda: tier.snapshot(next(counter), state), None, tier.wait),
            "memory_tier_overlap": (lambda: tier.snapshot(next(counter), state, overlap=True), tier.wait_copy,
                                    tier.wait),
        })
        med = out["loop"]["added_s_per_checkpoint"]
        out["overlap_x_blocking"] = (med["memory_tier_overlap"] / med["memory_tier"]
                                     if med["memory_tier"] > 0 else None)
        hook = [s for s in (tier.last,) if s is not None]
        out["last_hook_wait_s"] = hook[0].hook_wait_s if hook else None

        # correctness: the two snapshots in the ring equal the state at their steps, the older one
        # after a later optimizer step overwrote its source tensors
        refs: dict[int, Any] = {}
        for _ in range(3):
            fb()
            tier.wait_copy()
            opt_step()
            sid = next(counter)
            tier.snapshot(sid, state, overlap=True)
            refs[sid] = {"model": _clone_tree(model.state_dict()), "optim": _clone_tree(opt.state_dict())}
            refs.pop(sid - 2, None)
        fb()
        tier.wait_copy()
        opt_step()  # overwrites the newest snapshot's sources too
        tier.wait()
        _sync(dev)
        checked = {}
        for sid, ref in sorted(refs.items()):
            _step, tree = tier.read(sid)
            checked[str(sid)] = _mismatch(tree, ref, f"step {sid}")
        out["snapshots_checked"] = checked
        out["snapshots_equal"] = all(v is None for v in checked.values())
    finally:
        tier.close(remove=True)
        shutil.rmtree(os.path.dirname(tier.directory), ignore_errors=True)
    out["ok"] = bool(out.get("snapshots_equal"))


def _job_env(o: dict, name: str) -> str:
    """A fresh job directory for a check's ``hp.init()``, named in this process's environment."""
    from hyperpod_lab.jobdir import ENV_JOB_DIR, ENV_JOB_ID, ENV_STEP_INTERVAL

    job_id = f"gpu-check-{name}-{os.getpid()}"
    job_dir = os.path.join(o["work_dir"], job_id)
    os.makedirs(job_dir, mode=0o700)
    os.environ[ENV_JOB_DIR], os.environ[ENV_JOB_ID] = job_dir, job_id
    os.environ[ENV_STEP_INTERVAL] = "0.001"
    return job_dir


def check_checkpointless_step(o: dict, out: dict) -> None:
    """See the module docstring."""
    import torch
    import torch.nn.functional as F
    from torch.distributed import TCPStore

    import hyperpod_lab.runtime as hp
    from hyperpod_lab.jobdir import ENV_REPLICA_GROUP, ENV_REPLICA_GROUPS
    from hyperpod_lab.node import lighthouse
    from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches
    from hyperpod_lab.runtime.checkpointless.ft import ENV_LIGHTHOUSE, Checkpointless

    dev = o["device"]
    job_dir = _job_env(o, "ft")
    log = open(os.path.join(job_dir, "lighthouse.log"), "wb")
    lh = lighthouse.start(job_dir, 1, host="127.0.0.1", log=log)
    try:
        os.environ[ENV_LIGHTHOUSE] = lighthouse.read_address(job_dir, timeout_s=30)
        os.environ[ENV_REPLICA_GROUP], os.environ[ENV_REPLICA_GROUPS] = "0", "1"
        os.environ.setdefault("RUST_LOG", "warn")
        with hp.init() as ctx:
            out["ctx_device"] = str(ctx.device)
            g = torch.Generator().manual_seed(1234)
            X = torch.randn(256, 16, generator=g)
            Y = torch.sin(X @ torch.randn(16, 1, generator=g))
            X, Y = X.to(ctx.device), Y.to(ctx.device)
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1)).to(ctx.device)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            before = _clone_tree(model.state_dict())
            batches = ElasticBatches(256, 32, 8, seed=7, base_lr=0.01, lr_rule="linear")
            # torchft's Manager joins the replica group's TCPStore at MASTER_ADDR:MASTER_PORT, which
            # torchrun's agent serves in a job; this process has no agent, so it serves one itself
            store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(store.port)
            out["store"] = "an in-process TCPStore standing in for torchrun's (no launch agent here)"
            # overlap=True: the reduction overlapped with backward (the default off for CUDA until this
            # check has run on a GPU: post-accumulate-grad hooks on autograd's device thread)
            ft = Checkpointless(ctx, model, opt, batches, checkpoint=False, overlap=True)
            out["overlap"] = True
            try:
                step_s, losses, attempts = [], [], 0
                while ft.step < o["ft_steps"] and attempts < 3 * o["ft_steps"]:
                    attempts += 1
                    t0 = time.perf_counter()
                    plan = ft.begin_step()
                    loss_sum = 0.0
                    for mb in plan.micro_batches:
                        idx = torch.tensor(list(mb), dtype=torch.long, device=ctx.device)
                        loss = F.mse_loss(model(X[idx]), Y[idx]) * plan.weight(len(mb))
                        loss.backward()
                        loss_sum += loss.item()
                    committed = ft.end_step(loss_sum)
                    _sync(dev)
                    step_s.append(time.perf_counter() - t0)
                    if committed:
                        losses.append(ft.loss)
                out["committed_steps"] = ft.step
                out["attempts"] = attempts
                out["step_s"] = {"first": step_s[0], "median_after_first": statistics.median(step_s[1:] or step_s)}
                out["losses"] = losses
                params = list(model.parameters())
                out["params_device"] = sorted({str(p.device) for p in params})
                out["params_changed"] = _mismatch(model.state_dict(), before) is not None
            finally:
                ft.close()
    finally:
        lh.terminate()
        try:
            lh.wait(timeout=10)
        except subprocess.TimeoutExpired:
            lh.kill()
            lh.wait()
        log.close()
    want_dev = "cuda:0" if dev == "cuda" else "cpu"
    out["ok"] = (out.get("committed_steps") == o["ft_steps"] and out.get("params_changed") is True
                 and out.get("params_device") == [want_dev]
                 and all(x == x and abs(x) != float("inf") for x in out.get("losses", [float("nan")])))


def check_dcp_cuda(o: dict, out: dict) -> None:
    """See the module docstring."""

    import hyperpod_lab.runtime as hp
    from hyperpod_lab.runtime.checkpoint.persistent import Checkpointer
    from hyperpod_lab.runtime.state import capture

    dev, reps, cuda = o["device"], o["reps"], o["device"] == "cuda"
    job_dir = _job_env(o, "dcp")
    with hp.init() as ctx:
        out["ctx_device"] = str(ctx.device)
        model, opt, fb, opt_step = _mlp(dev, o["dcp_mib"] * MiB)
        state = {"model": model, "optim": opt}
        tensors = capture(state).tensors
        out["state_bytes"] = _nbytes(tensors)
        out["state_device"] = str(next(model.parameters()).device)
        host = _host_like(tensors, pinned=cuda)
        out["memcpy_s"] = _best_s(lambda: _copy_all(host, tensors, cuda), dev, reps)

        ck = Checkpointer(ctx, every_steps=1, keep_last=2, async_save=True, root=os.path.join(job_dir, "ckpt-async"))
        saves = []
        for step in range(2):  # the first allocates the staging buffers
            fb()
            opt_step()
            _sync(dev)
            t0 = time.perf_counter()
            ck.save(step, state)
            blocked = time.perf_counter() - t0
            ck.wait()
            saves.append({"step": step, "blocked_s": blocked, "total_s": time.perf_counter() - t0})
        out["async_save"] = saves
        out["async_blocked_x_memcpy"] = saves[-1]["blocked_s"] / out["memcpy_s"]
        ref = {"model": _clone_tree(model.state_dict()), "optim": _clone_tree(opt.state_dict())}

        sync_ck = Checkpointer(ctx, every_steps=1, keep_last=1, async_save=False,
                               root=os.path.join(job_dir, "ckpt-sync"))
        _sync(dev)
        t0 = time.perf_counter()
        sync_ck.save(1, state)
        out["sync_save_s"] = time.perf_counter() - t0
        out["sync_save_x_memcpy"] = out["sync_save_s"] / out["memcpy_s"]

        fb()
        opt_step()  # the state moves on; the restore must bring step 1 back
        _sync(dev)
        out["changed_before_restore"] = _mismatch(model.state_dict(), ref["model"]) is not None
        t0 = time.perf_counter()
        nxt = ck.restore(state)
        _sync(dev)
        out["restore_s"] = time.perf_counter() - t0
        out["restore_next_step"] = nxt
        bad = _mismatch({"model": model.state_dict(), "optim": opt.state_dict()}, ref, "restored")
        out["restored_equal"] = bad is None
        if bad:
            out["restored_mismatch"] = bad
        out["params_device_after_restore"] = sorted({str(p.device) for p in model.parameters()})
    want_dev = "cuda:0" if cuda else "cpu"
    out["ok"] = (out.get("restore_next_step") == 2 and out.get("restored_equal") is True
                 and out.get("changed_before_restore") is True and out.get("params_device_after_restore") == [want_dev])


def check_health_nvidia_smi(o: dict, out: dict) -> None:
    """See the module docstring."""
    import torch

    from hyperpod_lab.node.health import PASSED, check_node

    job_dir = _job_env(o, "health")
    if o["device"] == "cuda":
        count = torch.cuda.device_count()
        want = {"count": count, "names": sorted({torch.cuda.get_device_name(i) for i in range(count)}),
                "memory_mib": [torch.cuda.get_device_properties(i).total_memory / MiB for i in range(count)]}
    else:  # dry run: a FAKE nvidia-smi first on PATH, so that the parser runs
        fake = os.path.join(o["work_dir"], "fake-bin")
        os.makedirs(fake, exist_ok=True)
        with open(os.path.join(fake, "nvidia-smi"), "w") as f:
            f.write("#!/bin/sh\n# FAKE nvidia-smi of gpu_check --dry-run-on-cpu: one illustrative H100 row\n"
                    f"echo '{FAKE_SMI_ROW}'\n")
        os.chmod(os.path.join(fake, "nvidia-smi"), 0o755)
        os.environ["PATH"] = fake + os.pathsep + os.environ.get("PATH", "")
        out["nvidia_smi"] = "FAKE (dry run): a shell script printing one illustrative H100 row"
        count = 1
        want = {"count": 1, "names": [FAKE_SMI_PARSED["name"]], "memory_mib": [81559.0]}
    out["torch_sees"] = want
    h = check_node(job_dir, os.path.basename(job_dir), "gpu-check", expect_gpus=count,
                   shm_root=os.path.join(o["work_dir"], "health-shm"))
    gpu = h.checks["gpu"].to_dict()
    out["gpu_check"] = gpu
    out["other_checks"] = {k: c.status for k, c in h.checks.items() if k != "gpu"}
    parsed = gpu.get("gpus") or []
    out["parsed_names"] = sorted({str(g.get("name")) for g in parsed})
    smi_mib = [float(g["memory.total"]) for g in parsed if (g.get("memory.total") or "").replace(".", "").isdigit()]
    if o["device"] == "cuda":
        out["memory_agrees"] = (len(smi_mib) >= count and
                                all(abs(t - s) <= 0.05 * s for t, s in zip(want["memory_mib"], smi_mib)))
        out["ok"] = (gpu["status"] == PASSED and gpu.get("visible", 0) >= count
                     and set(want["names"]) <= set(out["parsed_names"]) and out["memory_agrees"])
    else:  # parsed exactly what the fake printed; the only problem is that torch sees no GPU here
        out["parsed_as_expected"] = parsed == [FAKE_SMI_PARSED]
        out["ok"] = out["parsed_as_expected"] and "torch sees 0 CUDA device(s)" in gpu["detail"]


CHECK_FUNCS: dict[str, Callable[[dict, dict], None]] = {
    "memory_tier_stall": check_memory_tier_stall,
    "memory_tier_overlap": check_memory_tier_overlap,
    "checkpointless_step": check_checkpointless_step,
    "dcp_cuda": check_dcp_cuda,
    "health_nvidia_smi": check_health_nvidia_smi,
}


def run_check(name: str, o: dict) -> dict:
    """Run one check in this process; its result (``ok``, ``seconds``, its numbers, and ``error``
    with a traceback tail when it raised). Never raises (but KeyboardInterrupt)."""
    import warnings

    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
    out: dict[str, Any] = {"ok": False}
    t0 = time.perf_counter()
    try:
        CHECK_FUNCS[name](o, out)
    except Exception as e:
        out["ok"] = False
        out["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        out["traceback"] = traceback.format_exc()[-4000:]
    out["seconds"] = time.perf_counter() - t0
    return out


# ---- the parent: one child process per check ----------------------------------------------------
def _child(a: argparse.Namespace) -> int:
    with open(a.opts) as f:
        o = json.load(f)
    if o.get("shm_dir"):
        from hyperpod_lab.jobdir import ENV_SHM_DIR

        os.environ[ENV_SHM_DIR] = o["shm_dir"]
    out = run_check(a.one, o)
    with open(a.result, "w") as f:
        json.dump(out, f, indent=2, default=str)
    return EXIT_OK if out.get("ok") else EXIT_FAILED


def _spawn(name: str, o: dict, work: str, timeout_s: float, env: dict) -> dict:
    """Run check ``name`` in a child process; its result, or what went wrong with the child."""
    opts, result, log = (os.path.join(work, f"{name}.{x}") for x in ("opts.json", "result.json", "log"))
    with open(opts, "w") as f:
        json.dump(o, f)
    t0 = time.perf_counter()
    with open(log, "wb") as lf:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--one", name, "--opts", opts,
                                 "--result", result], stdout=lf, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the child's own session: it and what it started
            proc.wait()
            rc = None
    with open(log, "rb") as f:
        tail = f.read()[-3000:].decode(errors="replace")
    try:
        with open(result) as f:
            out = json.load(f)
    except (OSError, ValueError):
        why = (f"timed out after {timeout_s:.0f} s" if rc is None else f"the check's process exited with status {rc} "
               "without a result (crashed or killed)")
        out = {"ok": False, "error": f"{why}; its output ends: {tail[-1500:]}", "seconds": time.perf_counter() - t0}
    if not out.get("ok") and tail.strip():
        out.setdefault("output_tail", tail)
    return out


def _gpu_facts() -> dict:
    import torch

    p = torch.cuda.get_device_properties(0)
    facts = {"name": p.name, "count": torch.cuda.device_count(), "capability": f"{p.major}.{p.minor}",
             "memory_bytes": p.total_memory, "torch": torch.__version__, "cuda": torch.version.cuda}
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            r = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30)
            facts["driver"] = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired):
            facts["driver"] = None
    return facts


def _summary_line(name: str, r: dict) -> str:
    verdict = "ok    " if r.get("ok") else "FAILED"
    s = f"{verdict} {name:<20} {r.get('seconds', 0):6.1f} s"
    if name == "memory_tier_stall" and "snapshot" in r:
        s += (f"  snapshot copy {1000 * r['snapshot']['copy_s']:.1f} ms = {r['snapshot_copy_x_memcpy']:.2f}x "
              f"memcpy ({1000 * r['memcpy']['seconds']:.1f} ms, {r['memcpy']['gb_per_s']:.1f} GB/s), "
              f"commit {r['snapshot_commit_x_memcpy']:.2f}x")
    if name in ("memory_tier_stall", "memory_tier_overlap") and "loop" in r:
        lp = r["loop"]
        parts = []
        for m, v in lp["added_s_per_checkpoint"].items():
            x = (lp.get("x_memcpy") or {}).get(m)
            parts.append(f"{m} {1000 * v:.1f} ms" + (f" ({x:.2f}x)" if x is not None and m != "memcpy" else ""))
        s += "; added/ckpt: " + ", ".join(parts)
        if all(v is None for v in (lp.get("x_memcpy") or {}).values()):
            s += " (no ratio: memcpy's spread exceeds its median)"
    if name == "dcp_cuda" and "async_save" in r:
        s += (f"  async blocked {1000 * r['async_save'][-1]['blocked_s']:.1f} ms = {r['async_blocked_x_memcpy']:.2f}x "
              f"memcpy, sync save {r['sync_save_s']:.2f} s = {r['sync_save_x_memcpy']:.1f}x, "
              f"restore {r.get('restore_s', 0):.2f} s")
    if name == "checkpointless_step" and "step_s" in r:
        s += f"  {r.get('committed_steps')} steps committed, {1000 * r['step_s']['median_after_first']:.1f} ms/step"
    if name == "health_nvidia_smi" and "gpu_check" in r:
        s += f"  gpu check {r['gpu_check']['status']}: {r['gpu_check']['detail'][:120]}"
        if "parsed_as_expected" in r:
            s += " (expected on CPU: the dry run checks what it parsed from the FAKE nvidia-smi)"
    if r.get("error"):
        s += f"\n       error: {r['error'][:400]}"
    for w in r.get("warnings", []):
        s += f"\n       warning: {w}"
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="exit status: 0 all passed, 1 a check failed, 2 usage, 3 no GPU")
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/gpu_check.json; "
                                                "gpu_check_cpu_dry_run.json with --dry-run-on-cpu)")
    ap.add_argument("--dry-run-on-cpu", action="store_true",
                    help="run the same checks on CPU tensors (gloo, pageable memory, a FAKE nvidia-smi)")
    ap.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS))
    ap.add_argument("--state-mib", type=int, help="memory_tier_stall state, MiB (2048; dry run 8)")
    ap.add_argument("--overlap-mib", type=int, help="memory_tier_overlap model + Adam state, MiB (1024; dry run 4)")
    ap.add_argument("--dcp-mib", type=int, help="dcp_cuda model + Adam state, MiB (512; dry run 4)")
    ap.add_argument("--compute-ms", type=float, help="compute per loop step, ms (100; dry run 5)")
    ap.add_argument("--steps", type=int, help="loop steps per measurement (4; dry run 2)")
    ap.add_argument("--reps", type=int, help="repetitions of each timing (3; dry run 1)")
    ap.add_argument("--ft-steps", type=int, help="checkpointless steps (5; dry run 2)")
    ap.add_argument("--check-timeout-s", type=float, help="one check's limit, s (150; dry run 120)")
    ap.add_argument("--budget-s", type=float, default=280.0,
                    help="no check starts after this many seconds; each gets at most what is left")
    ap.add_argument("--shm-dir", default=None, help="the memory tier's root (default $HYPERPOD_LAB_SHM_DIR "
                                                    "or /dev/shm/hyperpod-lab)")
    ap.add_argument("--one", choices=CHECKS, help=argparse.SUPPRESS)
    ap.add_argument("--opts", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        if not (a.opts and a.result):
            ap.error("--one needs --opts and --result")
        return _child(a)

    dry = a.dry_run_on_cpu
    out_path = a.out or os.path.join(HERE, "results", "gpu_check_cpu_dry_run.json" if dry else "gpu_check.json")
    try:
        import torch

        cuda, torch_version, why = torch.cuda.is_available(), torch.__version__, None
    except Exception as e:  # no torch: no GPU either
        cuda, torch_version, why = False, None, f"torch does not import ({type(e).__name__}: {e})"
    if not dry and not cuda:
        reason = NO_GPU if why is None else f"no GPU: {why}; run it on a GPU machine with a CUDA build of torch"
        print(reason)
        write_results(out_path, {"benchmark": "gpu_check", "gpu": None, "ran": False, "reason": reason,
                                 "torch": torch_version, "exit_status": EXIT_NO_GPU})
        return EXIT_NO_GPU

    for k, (gpu_v, cpu_v) in DEFAULTS.items():
        if getattr(a, k) is None:
            setattr(a, k, cpu_v if dry else gpu_v)
    from hyperpod_lab.jobdir import shm_root

    work = tempfile.mkdtemp(prefix="hp-gpu-check-")
    o = {"device": "cpu" if dry else "cuda", "work_dir": work, "shm_dir": os.path.abspath(a.shm_dir or shm_root()),
         **{k: getattr(a, k) for k in DEFAULTS}}
    env = dict(os.environ)
    if dry:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the children take the CPU paths even on a GPU machine
    gpu = None if dry else _gpu_facts()
    print(f"gpu_check: {'CPU dry run (no GPU figures)' if dry else gpu['name'] + ' x' + str(gpu['count'])}, "
          f"checks {', '.join(a.checks)}", flush=True)
    results: dict[str, dict] = {}
    t_start = time.perf_counter()
    try:
        for name in a.checks:
            left = a.budget_s - (time.perf_counter() - t_start)
            if left < 10:
                results[name] = {"ok": False, "error": f"not run: the --budget-s of {a.budget_s:g} s was spent"}
            else:
                results[name] = _spawn(name, o, work, min(a.check_timeout_s, left), env)
            print(_summary_line(name, results[name]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failed = [n for n, r in results.items() if not r.get("ok")]
    status = EXIT_FAILED if failed else EXIT_OK
    print(f"{len(results) - len(failed)}/{len(results)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else "") + f" ({time.perf_counter() - t_start:.0f} s)")
    write_results(out_path, {
        "benchmark": "gpu_check", "ran": True, "mode": "cpu-dry-run" if dry else "cuda", "device": o["device"],
        "gpu": gpu, "torch": torch_version, "options": {k: v for k, v in o.items() if k != "work_dir"},
        "seconds": time.perf_counter() - t_start, "passed": [n for n in results if n not in failed],
        "failed": failed, "checks": results, "exit_status": status}, said="wrote")
    return status


if __name__ == "__main__":
    sys.exit(main())
