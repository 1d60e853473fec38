"""TensorBoard overhead: what ``JobSpec.tensorboard`` adds to ``ctx.step()``.

One process, one job context (``hp.init()`` outside torchrun: a world of 1, the job's spec with
``tensorboard: rank0``). The same loop of ``ctx.step(step, loss, lr=..., tokens_per_s=...)``
runs in alternating blocks with the context's SummaryWriter on (``ctx.tensorboard`` set: loss,
steps_per_s, lr and tokens_per_s written every step) and off (None, the baseline), so both see
the same machine state. Two loops: ``bare`` (only ``ctx.step``: the absolute cost per call, in
microseconds) and ``train`` (a fixed matmul workload of ~``--compute-ms`` per step before
``ctx.step``: the cost relative to a step). Reported: median per-step time of each block kind,
the difference and the ratio with/without, the CPU time per step of the training thread alone
(``time.thread_time``: what the step itself pays, insensitive to other processes' load) and
of all threads (the
writer threads' included, each block counted until the writer's queue is empty), written as JSON.
The step's caller only queues the values; the summaries are built on a thread of their own.

Usage: .venv/bin/python benchmarks/tensorboard_overhead.py [--blocks 10] [--bare-steps 2000]
       [--train-steps 100] [--compute-ms 5] [--out benchmarks/results/tensorboard_overhead.json]
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from benchmarks._common import arg_parser, write_results


def main() -> None:
    p = arg_parser(__doc__, "tensorboard_overhead.json", blocks=10)
    p.add_argument("--bare-steps", type=int, default=2000, help="ctx.step calls per bare block")
    p.add_argument("--train-steps", type=int, default=100, help="steps per train block")
    p.add_argument("--compute-ms", type=float, default=5.0, help="matmul work per train step (about)")
    a = p.parse_args()

    import torch

    torch.set_num_threads(1)
    job_dir = tempfile.mkdtemp(prefix="tb-overhead-")
    from hyperpod_lab.spec import JobSpec

    with open(os.path.join(job_dir, "spec.json"), "w") as f:
        f.write(JobSpec(script="bench.py", tensorboard="rank0").validate().to_json())
    os.environ["HYPERPOD_LAB_JOB_DIR"] = job_dir
    os.environ["HYPERPOD_LAB_JOB_ID"] = "tb-overhead"
    import hyperpod_lab.runtime as hp

    ctx = hp.init()
    tb = ctx.tensorboard
    assert tb is not None, "the spec's tensorboard did not give rank 0 a writer"

    # the train loop's workload: n x n matmuls, n and count chosen for ~compute_ms
    x = torch.randn(256, 256)
    t = time.perf_counter()
    for _ in range(20):
        x @ x
    per_mm = (time.perf_counter() - t) / 20
    mms = max(1, round(a.compute_ms / 1000 / per_mm))

    step = [0]

    cpu: dict[bool, list[float]] = {True: [], False: []}
    caller: dict[bool, list[float]] = {True: [], False: []}  # CPU of the training thread alone

    def block(on: bool, steps: int, compute: bool) -> float:
        """Wall seconds per step of one block; its CPU seconds per step (all threads, the
        writer's included, counted until its queue is empty) go to ``cpu[on]``."""
        ctx.tensorboard = tb if on else None
        c0, t0, th0 = time.process_time(), time.perf_counter(), time.thread_time()
        for _ in range(steps):
            if compute:
                for _ in range(mms):
                    x @ x
            ctx.step(step[0], loss=1.0 / (1 + step[0]), lr=3e-4, tokens_per_s=1234.5)
            step[0] += 1
        wall = (time.perf_counter() - t0) / steps
        caller[on].append((time.thread_time() - th0) / steps)
        tb.sync()  # the writer thread's backlog is this block's, not the next one's
        cpu[on].append((time.process_time() - c0) / steps)
        return wall

    results = {}
    for name, steps, compute in (("bare", a.bare_steps, False), ("train", a.train_steps, True)):
        block(True, max(10, steps // 10), compute)  # warm-up: opens the writer, JIT paths
        block(False, max(10, steps // 10), compute)
        on, off = [], []
        for i in range(a.blocks):
            for flag in ((True, False) if i % 2 == 0 else (False, True)):
                (on if flag else off).append(block(flag, steps, compute))
        m_on, m_off = statistics.median(on), statistics.median(off)
        c_on, c_off = statistics.median(cpu[True]), statistics.median(cpu[False])
        k_on, k_off = statistics.median(caller[True]), statistics.median(caller[False])
        cpu[True].clear(), cpu[False].clear(), caller[True].clear(), caller[False].clear()
        results[name] = {"steps_per_block": steps, "blocks": a.blocks,
                         "cpu_with_us": c_on * 1e6, "cpu_without_us": c_off * 1e6,
                         "cpu_added_us_per_step": (c_on - c_off) * 1e6,
                         "caller_cpu_with_us": k_on * 1e6, "caller_cpu_without_us": k_off * 1e6,
                         "caller_cpu_added_us_per_step": (k_on - k_off) * 1e6,
                         "with_tensorboard_us": m_on * 1e6, "without_us": m_off * 1e6,
                         "added_us_per_step": (m_on - m_off) * 1e6, "ratio": m_on / m_off,
                         "with_all_us": [v * 1e6 for v in on], "without_all_us": [v * 1e6 for v in off]}
        print(f"{name:5s}: with SummaryWriter {m_on * 1e6:9.1f} us/step, without {m_off * 1e6:9.1f} us/step, "
              f"added {(m_on - m_off) * 1e6:7.1f} us ({m_on / m_off:.3f}x); CPU (all threads) added "
              f"{(c_on - c_off) * 1e6:7.1f} us/step; training thread's CPU {k_on * 1e6:.1f} vs {k_off * 1e6:.1f} us/step "
              f"(+{(k_on - k_off) * 1e6:.1f})")
    ctx.tensorboard = tb
    ctx.finish()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(job_dir, "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    written = len(acc.Scalars("loss"))
    out = {"benchmark": "tensorboard_overhead", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
           "compute_ms_target": a.compute_ms, "matmuls_per_train_step": mms, "loss_scalars_written": written,
           "results": results}
    write_results(a.out, out, said=f"{written} loss scalars read back with EventAccumulator; JSON:")


if __name__ == "__main__":
    main()
