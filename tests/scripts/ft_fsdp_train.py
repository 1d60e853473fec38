"""The checkpointless test job with FSDP2 inside each replica group (HSDP; tests only).

Self-contained, as every submitted script must be: a submission stages this one file (importing
``ft_train.py`` failed on Slurm, fresh-clone run fresh8); the micro-batch loop both share is
:meth:`hyperpod_lab.runtime.checkpointless.elastic.StepPlan.backward`.

Regression on a fixed synthetic dataset with an MLP, as ``ft_train.py``; with ``--fsdp`` every
Linear and the whole model are ``fully_shard``-ed over the replica group's ranks
(``shard_mesh(ctx)``), and :class:`~hyperpod_lab.runtime.checkpointless.ft.Checkpointless`
replicates the shards across the groups. Each rank appends, at every ``begin_step``, the SHA-256
of its local shards (model and optimizer state, bytes as stored) to
``<job_dir>/shards/group-<G>-rank-<R>.jsonl`` (``{"step", "sha256", "bytes"}``), so a test can
check that rank r of every group holds the same bits at every step, a healed rank included
(``overlapped``: gradient buckets of the previous step whose reduction started during backward).
Rank 0 of each group writes the full parameters to ``<job_dir>/final-group-<G>.pt``.
"""

import argparse
import hashlib
import json
import os
import time

import torch
import torch.nn.functional as F

import hyperpod_lab.runtime as hp
from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches
from hyperpod_lab.runtime.checkpointless.ft import Checkpointless, shard_mesh
from hyperpod_lab.spec import CheckpointPolicy


def local_tensors(obj):
    """Every tensor of a state dict, DTensors as their local shard, in a fixed order."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        yield obj.to_local()
    elif isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from local_tensors(obj[k])
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from local_tensors(v)


def shard_digest(model, opt) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    for t in local_tensors({"model": model.state_dict(), "optim": opt.state_dict()["state"]}):
        b = t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        h.update(b)
        n += len(b)
    return h.hexdigest(), n


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--optim", choices=("adam", "sgd"), default="adam")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--fsdp", action="store_true", help="fully_shard the model over the replica group's ranks")
    p.add_argument("--bucket-bytes", type=int, default=None, help="Checkpointless's gradient bucket size, bytes")
    p.add_argument("--no-overlap", action="store_true",
                   help="Checkpointless(overlap=False): reduce the gradients in end_step, not during backward")
    p.add_argument("--late-start", type=float, default=0.0,
                   help="seconds every rank but rank 0 of its group sleeps before Checkpointless (a rank that starts late)")
    p.add_argument("--checkpoint", action="store_true",
                   help="the tiered fallback checkpoint: memory tier every step, persistent every 10 (default: none)")
    return p.parse_args(argv)


def setup(a: argparse.Namespace):
    """The data, the model (unsharded) and the batch plan, the same in every process."""
    g = torch.Generator().manual_seed(1234)
    X = torch.randn(a.samples, 16, generator=g)
    Y = torch.sin(X @ torch.randn(16, 1, generator=g)) + 0.05 * torch.randn(a.samples, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, a.width), torch.nn.Tanh(), torch.nn.Linear(a.width, a.width),
                                torch.nn.Tanh(), torch.nn.Linear(a.width, 1))
    batches = ElasticBatches(a.samples, a.global_batch, a.micro_batch, seed=7, base_lr=a.lr, lr_rule="linear")
    return X, Y, model, batches


def optimizer(a: argparse.Namespace, model):
    return (torch.optim.Adam(model.parameters(), lr=a.lr) if a.optim == "adam"
            else torch.optim.SGD(model.parameters(), lr=a.lr))


def reference_run(argv: list[str]) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The fault-free loss curve and final parameters of this job with these arguments, computed
    in this process: one unsharded replica of one rank taking every global batch whole (no
    process group, no torchft)."""
    a = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the job's ranks (OMP_NUM_THREADS=1)
    try:
        return _reference_run(a)
    finally:
        torch.set_num_threads(threads)


def _reference_run(a: argparse.Namespace) -> tuple[list[float], dict[str, torch.Tensor]]:
    X, Y, model, batches = setup(a)
    opt = optimizer(a, model)
    losses, cursor = [], 0
    for step in range(a.steps):
        plan = batches.plan(step, cursor, 1, 0)
        for group in opt.param_groups:
            group["lr"] = plan.lr
        opt.zero_grad()
        loss_sum = plan.backward(lambda idx: F.mse_loss(model(X[idx]), Y[idx]))
        opt.step()
        cursor += plan.effective_batch
        losses.append(loss_sum)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def main():
    a = parse_args()
    X, Y, model, batches = setup(a)

    with hp.init() as ctx:
        if a.fsdp:
            from torch.distributed.fsdp import fully_shard

            mesh = shard_mesh(ctx)
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        opt = optimizer(a, model)
        policy = CheckpointPolicy(every_steps=10, keep_last=2, memory_every_steps=1) if a.checkpoint else False
        if a.late_start and ctx.rank != 0:
            time.sleep(a.late_start)
        ft = Checkpointless(ctx, model, opt, batches, checkpoint=policy, overlap=not a.no_overlap,
                            **({"bucket_bytes": a.bucket_bytes} if a.bucket_bytes else {}))
        shards = os.path.join(ctx.job_dir, "shards")
        os.makedirs(shards, exist_ok=True)
        record = os.path.join(shards, f"group-{ctx.replica_group}-rank-{ctx.rank}.jsonl")
        while ft.step < a.steps:
            plan = ft.begin_step()
            digest, nbytes = shard_digest(model, opt)
            with open(record, "a") as f:
                f.write(json.dumps({"step": plan.step, "sha256": digest, "bytes": nbytes, "pid": os.getpid(),
                                    "overlapped": ft.overlapped}) + "\n")
            loss_sum = 0.0
            with ft.recoverable():  # a group of several ranks: an exception goes to the process level
                loss_sum = plan.backward(lambda idx: F.mse_loss(model(X[idx]), Y[idx]))
            if a.step_sleep:
                time.sleep(a.step_sleep)
            if ft.end_step(loss_sum):
                ctx.step(ft.step - 1, ft.loss, replicas=plan.replicas, lr=plan.lr,
                         accumulation_steps=plan.accumulation_steps)
        full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                for k, v in model.state_dict().items()}
        if ctx.rank == 0:
            torch.save(full, os.path.join(ctx.job_dir, f"final-group-{ctx.replica_group}.pt"))
        ft.close()


if __name__ == "__main__":
    main()
