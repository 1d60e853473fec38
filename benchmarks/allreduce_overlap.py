"""Step time of checkpointless training with the gradient reduction overlapped with the last
micro-batch's backward (``Checkpointless(overlap=True)``) versus after it (``overlap=False``).

Each run is a real checkpointless job on this host: a torchft Lighthouse and 2 replica groups of
1 rank (launch agents, gloo on CPU), training a deep MLP (``--layers`` Linear layers of
``--width``, Tanh between, the last one to 1 output; 8 x 1024: 7.35 M parameters, 29.4 MB of
fp32 gradients, two buckets at the default 25 MiB: the last 7 layers, then the first) on synthetic regression data, global batch ``--global-batch`` in
micro-batches of ``--micro-batch`` (4 a rank by default), plain SGD, no fallback checkpoint. This
file is also the job's script (``--worker``): every rank times each step (``begin_step`` to the
end of ``end_step``, seconds) and ``end_step`` alone (the reduction left after backward: its
exposed part), and writes them with the SHA-256 of its final parameters to
``<job_dir>/timing-group-<G>.json``.

The runs alternate (off, on) ``--repeats`` times so that load drift hits both; per run the median
over the steps after ``--warmup``; per mode the median of its runs. ``ratio`` = step time on / off
(below 1: overlap pays). ``identical``: the final parameters of every run are bit-equal (overlap
changes when buckets are reduced, not what they sum). JSON to
``benchmarks/results/allreduce_overlap.json``.

    .venv/bin/python benchmarks/allreduce_overlap.py --repeats 3
    .venv/bin/python benchmarks/allreduce_overlap.py --repeats 3 --bucket-bytes 4194304 \
        --out benchmarks/results/allreduce_overlap_4mib.json
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import stop_procs, write_results  # noqa: E402


def worker(a: argparse.Namespace) -> None:
    """One rank of the job: train ``a.steps`` steps, time them, write the timings."""
    import torch

    import hyperpod_lab.runtime as hp
    from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches
    from hyperpod_lab.runtime.checkpointless.ft import BUCKET_BYTES, Checkpointless

    g = torch.Generator().manual_seed(1234)
    X = torch.randn(a.samples, a.width, generator=g)
    Y = torch.randn(a.samples, 1, generator=g)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(a.layers - 1):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(a.width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with hp.init() as ctx:
        batches = ElasticBatches(a.samples, a.global_batch, a.micro_batch, seed=7, base_lr=1e-3, lr_rule="none")
        ft = Checkpointless(ctx, model, opt, batches, checkpoint=False, overlap=a.overlap == "on",
                            bucket_bytes=a.bucket_bytes or BUCKET_BYTES)
        rows = []
        while ft.step < a.steps:
            t0 = time.perf_counter()
            plan = ft.begin_step()
            loss_sum = plan.backward(lambda idx: torch.nn.functional.mse_loss(model(X[idx]), Y[idx]))
            t1 = time.perf_counter()
            committed = ft.end_step(loss_sum)
            t2 = time.perf_counter()
            rows.append({"step": plan.step, "committed": committed, "step_s": t2 - t0, "end_step_s": t2 - t1,
                         "overlapped": ft.overlapped, "micro_batches": len(plan.micro_batches)})
        h = hashlib.sha256()
        for v in model.state_dict().values():
            h.update(v.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        with open(os.path.join(ctx.job_dir, f"timing-group-{ctx.replica_group}.json"), "w") as f:
            json.dump({"rows": rows, "final_sha256": h.hexdigest(),
                       "parameters": sum(p.numel() for p in model.parameters())}, f)
        ft.close()


def run_job(tmp: str, name: str, a: argparse.Namespace, overlap: str) -> dict:
    """One 2-group job; returns each group's timing file."""
    from benchmarks.recovery import _env
    from hyperpod_lab.node.lighthouse import read_address

    job_dir = os.path.join(tmp, name)
    os.makedirs(job_dir)
    lh = subprocess.Popen([sys.executable, "-m", "hyperpod_lab.node.lighthouse", "--job-dir", job_dir,
                           "--min-replicas", "1", "--host", "127.0.0.1"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [lh]
    try:
        addr = read_address(job_dir, 30)
        args = ["--worker", "--overlap", overlap, *a.job_args]
        for grp in (0, 1):
            env = _env(job_dir, HYPERPOD_LAB_REPLICA_GROUP=str(grp), HYPERPOD_LAB_REPLICA_GROUPS="2",
                       TORCHFT_LIGHTHOUSE=addr, SLURMD_NODENAME=f"n{grp + 1}")
            log = open(os.path.join(job_dir, f"agent-{grp}.log"), "wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nnodes=1", "--nproc-per-node=1",
                 "--max-restarts=0", os.path.abspath(__file__), *args], env=env, stdout=log, stderr=subprocess.STDOUT))
        for p in procs[1:]:
            if p.wait(timeout=a.timeout_s) != 0:
                raise RuntimeError(f"a replica group failed (exit {p.returncode}); logs in {job_dir}")
    finally:
        stop_procs(procs)
    out = {}
    for path in sorted(glob.glob(os.path.join(job_dir, "timing-group-*.json"))):
        with open(path) as f:
            out[os.path.basename(path)] = json.load(f)
    if len(out) != 2:
        raise RuntimeError(f"expected 2 timing files in {job_dir}, found {sorted(out)}")
    return out


def summarise(timings: dict, warmup: int) -> dict:
    """Medians over both groups' committed steps after the warm-up."""
    rows = [r for t in timings.values() for r in t["rows"] if r["committed"] and r["step"] >= warmup]
    if not rows:
        raise RuntimeError("no committed step after the warm-up: raise --steps")
    return {"step_s": statistics.median(r["step_s"] for r in rows),
            "end_step_s": statistics.median(r["end_step_s"] for r in rows),
            "overlapped_buckets": statistics.median(r["overlapped"] for r in rows),
            "steps_timed": len(rows), "final_sha256": sorted({t["final_sha256"] for t in timings.values()}),
            "parameters": next(iter(timings.values()))["parameters"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--overlap", choices=("on", "off"), default="on", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--warmup", type=int, default=5, help="steps not timed at the start of each run")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--global-batch", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=64)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--bucket-bytes", type=int, default=0, help="gradient bucket size, bytes (0: 25 MiB)")
    p.add_argument("--repeats", type=int, default=3, help="(off, on) pairs of runs")
    p.add_argument("--timeout-s", type=float, default=600.0, help="for one run")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "allreduce_overlap.json"))
    a = p.parse_args()
    a.job_args = ["--steps", str(a.steps), "--layers", str(a.layers), "--width", str(a.width),
                  "--global-batch", str(a.global_batch), "--micro-batch", str(a.micro_batch),
                  "--samples", str(a.samples), "--bucket-bytes", str(a.bucket_bytes)]
    if a.worker:
        worker(a)
        return 0
    tmp = tempfile.mkdtemp(prefix="hp-overlap-")
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for i in range(a.repeats):
        for mode in ("off", "on"):
            s = summarise(run_job(tmp, f"{mode}-{i}", a, mode), a.warmup)
            runs[mode].append(s)
            print(f"run {i} overlap {mode}: step {s['step_s'] * 1e3:.1f} ms, end_step {s['end_step_s'] * 1e3:.1f} ms, "
                  f"buckets sent during backward {s['overlapped_buckets']}")
    med = {m: {k: round(statistics.median(r[k] for r in rs), 5) for k in ("step_s", "end_step_s")}
           for m, rs in runs.items()}
    digests = {d for rs in runs.values() for r in rs for d in r["final_sha256"]}
    res = {"config": {k: getattr(a, k) for k in ("steps", "warmup", "layers", "width", "global_batch", "micro_batch",
                                                 "samples", "bucket_bytes", "repeats")},
           "parameters": runs["on"][0]["parameters"], "groups": 2, "ranks_per_group": 1,
           "micro_batches_per_rank": a.global_batch // 2 // a.micro_batch,
           "off": med["off"], "on": med["on"],
           "ratio_step_on_over_off": round(med["on"]["step_s"] / med["off"]["step_s"], 4),
           "ratio_end_step_on_over_off": round(med["on"]["end_step_s"] / med["off"]["end_step_s"], 4),
           "identical": len(digests) == 1, "runs": runs,
           "host": {"cpus": os.cpu_count(), "loadavg_1m_at_end": round(os.getloadavg()[0], 2)}}
    for key, name in (("step_s", "step time"), ("end_step_s", "end_step")):
        print(f"{name}: off {med['off'][key] * 1e3:.1f} ms, on {med['on'][key] * 1e3:.1f} ms -> ratio "
              f"{res[f'ratio_{key[:-2]}_on_over_off']:.3f}")
    print(f"final parameters bit-equal: {res['identical']}")
    return write_results(a.out, res, said="wrote")


if __name__ == "__main__":
    sys.exit(main())
