"""MLflow tracking overhead: what ``JobSpec.tracking: mlflow`` adds to ``ctx.step()``.

One process, one job context (``hp.init()`` outside torchrun: a world of 1, the job's spec with
``tracking: mlflow``), ``$HYPERPOD_LAB_STEP_EVENT_INTERVAL_S`` tiny so that every
``ctx.step()`` writes a ``step`` event (the worst case: by default at most one a second). The
tracking store is a SQLite file opened by ``MlflowClient`` in this very process
(``sqlite:///...``), so the tracker thread's whole work (SQLAlchemy, SQLite) competes with the
training thread for the GIL and the CPU: more than an HTTP server elsewhere would cost it.
Alternating blocks of the same loop with ``ctx.mlflow`` on and off (None, the baseline).
Reported per step, medians: the loop's wall time (what training sees: the events only queued),
the wall time until the tracker sent the block's events (``sync``: the whole cost when the
tracker must keep up with a step event per step on a busy CPU), and the training thread's own
CPU time (``time.thread_time``); ratios against the baseline blocks; JSON out.

Usage: .venv/bin/python benchmarks/mlflow_overhead.py [--blocks 6] [--steps 300]
       [--out benchmarks/results/mlflow_overhead.json]
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from benchmarks._common import arg_parser, write_results


def main() -> None:
    p = arg_parser(__doc__, "mlflow_overhead.json", blocks=6)
    p.add_argument("--steps", type=int, default=300, help="ctx.step calls per block")
    a = p.parse_args()

    job_dir = tempfile.mkdtemp(prefix="mlflow-overhead-")
    from hyperpod_lab.spec import JobSpec

    uri = f"sqlite:///{job_dir}/mlflow.db"
    with open(os.path.join(job_dir, "spec.json"), "w") as f:
        f.write(JobSpec(script="bench.py", tracking="mlflow", tracking_uri=uri).validate().to_json())
    os.environ.update({"HYPERPOD_LAB_JOB_DIR": job_dir, "HYPERPOD_LAB_JOB_ID": "mlflow-overhead",
                       "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.000001"})
    import torch

    import hyperpod_lab.runtime as hp

    ctx = hp.init()
    tracker = ctx.mlflow
    assert tracker is not None, "the spec's tracking did not give rank 0 a tracker"
    step = [0]
    wall: dict[bool, list[float]] = {True: [], False: []}
    sent_wall: list[float] = []
    caller: dict[bool, list[float]] = {True: [], False: []}

    def block(on: bool) -> None:
        ctx.mlflow = tracker if on else None
        t0, th0 = time.perf_counter(), time.thread_time()
        for _ in range(a.steps):
            ctx.step(step[0], loss=1.0 / (1 + step[0]), lr=3e-4, tokens_per_s=1234.5)
            step[0] += 1
        wall[on].append((time.perf_counter() - t0) / a.steps)
        caller[on].append((time.thread_time() - th0) / a.steps)
        if on:
            assert tracker.sync(300), "the tracker did not send a block's events within 300 s"
            sent_wall.append((time.perf_counter() - t0) / a.steps)

    block(True)  # warm-up: imports mlflow, creates the store and the run
    block(False)
    wall[True].clear(), wall[False].clear(), caller[True].clear(), caller[False].clear(), sent_wall.clear()
    for i in range(a.blocks):
        for flag in ((True, False) if i % 2 == 0 else (False, True)):
            block(flag)
    m_on, m_off = statistics.median(wall[True]), statistics.median(wall[False])
    k_on, k_off = statistics.median(caller[True]), statistics.median(caller[False])
    m_sent = statistics.median(sent_wall)
    print(f"ctx.step with a step event each: loop with MLflow {m_on * 1e6:.1f} us/step, without {m_off * 1e6:.1f} "
          f"({m_on / m_off:.2f}x); until sent {m_sent * 1e6:.1f} us/step ({m_sent / m_off:.2f}x); training "
          f"thread's CPU {k_on * 1e6:.1f} vs {k_off * 1e6:.1f} us/step")
    ctx.mlflow = tracker
    ctx.finish()
    from mlflow import MlflowClient

    sent = len(MlflowClient(tracking_uri=uri).get_metric_history(tracker.run_id, "loss"))
    out = {"benchmark": "mlflow_overhead", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                       "loadavg_1m": os.getloadavg()[0]},
           "steps_per_block": a.steps, "blocks": a.blocks, "loss_points_read_back": sent,
           "dropped": tracker.dropped, "error": tracker.error,
           "with_mlflow_us": m_on * 1e6, "without_us": m_off * 1e6, "ratio": m_on / m_off,
           "until_sent_us": m_sent * 1e6, "until_sent_ratio": m_sent / m_off,
           "caller_cpu_with_us": k_on * 1e6, "caller_cpu_without_us": k_off * 1e6,
           "with_all_us": [v * 1e6 for v in wall[True]], "without_all_us": [v * 1e6 for v in wall[False]]}
    write_results(a.out, out, said=f"{sent} loss points read back with MlflowClient; JSON:")
    shutil.rmtree(job_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
