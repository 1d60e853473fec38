"""A deterministic FSDP2 training job under the tiered checkpointer (restart mode), for the tests.

Run by the node launcher (``python -m hyperpod_lab.node.launch ... fsdp_job.py``) like torchrun:
N processes, gloo on CPU. The model (an MLP whose layer widths do not divide by 2, so shards are
uneven and one rank's shard of the last weight is empty) is sharded with FSDP2 ``fully_shard``
over a 1-D CPU mesh of all ranks; AdamW, so the optimizer state is DTensors too. Each step's
batch depends only on (step, rank): a run restored from a snapshot continues bit for bit as a
run without the fault.

Options:
    --steps N           train steps 0..N-1 (default 20)
    --memory-every K    memory snapshot every K steps (default 5)
    --every K           persistent checkpoint every K steps (default 1000: none, so a restore
                        can only come from the memory tier)

Writes under ``<job_dir>/fsdp/``:
    loss-rank-<R>.jsonl            one line per step: {"inc", "step", "loss"} (loss as float.hex())
    inc<I>-step-<S>-rank-<R>.pt    the local shards of the model and the optimizer state right
                                   after the memory snapshot of step S (I = restart count)
    inc<I>-restored-rank-<R>.pt    the same right after ``restore()`` (with ``start``)
    final-rank-<R>.pt              the same at the end

Fault injection (environment, first incarnation only):
    FSDP_KILL_RANK=R, FSDP_KILL_AT_STEP=S
        rank R waits until its last memory snapshot committed, then SIGKILLs itself before step S
"""

import json
import os
import signal

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import hyperpod_lab.runtime as hp
from hyperpod_lab.spec import CheckpointPolicy


def build(mesh):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 15), torch.nn.Tanh(), torch.nn.Linear(15, 7), torch.nn.Tanh(),
                                torch.nn.Linear(7, 1))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def shards(model, opt, **extra):
    """Clones of this rank's local shards: ``{"model": {fqn: t}, "optim": {idx: {name: t}}}``."""
    out = {"model": {k: v.to_local().clone() for k, v in model.state_dict().items()},
           "optim": {i: {k: (v.to_local() if isinstance(v, DTensor) else v).clone() for k, v in st.items()}
                     for i, st in opt.state_dict()["state"].items()},
           "placements": {k: [repr(p) for p in v.placements] for k, v in model.state_dict().items()}}
    return dict(out, **extra)


def save(obj, path):
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def main():
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--memory-every", type=int, default=5)
    p.add_argument("--every", type=int, default=1000)
    a = p.parse_args()
    with hp.init() as ctx:
        mesh = init_device_mesh("cpu", (ctx.world_size,), mesh_dim_names=("shard",))
        model, opt = build(mesh)
        state = {"model": model, "optim": opt}
        policy = CheckpointPolicy(every_steps=a.every, keep_last=2, memory_every_steps=a.memory_every)
        ckpt = hp.TieredCheckpointer(ctx, state, policy)
        start = ckpt.restore()
        inc = ctx.restart_count
        out = os.path.join(ctx.job_dir, "fsdp")
        os.makedirs(out, exist_ok=True)
        save(shards(model, opt, start=start), os.path.join(out, f"inc{inc}-restored-rank-{ctx.rank}.pt"))
        kill_rank = int(os.environ.get("FSDP_KILL_RANK", "-1"))
        kill_step = int(os.environ.get("FSDP_KILL_AT_STEP", "-1")) if inc == 0 else -1
        for step in range(start, a.steps):
            if step == kill_step and ctx.rank == kill_rank:
                ckpt.wait()  # the last memory snapshot is committed
                print(f"rank {ctx.rank}: SIGKILL before step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            g = torch.Generator().manual_seed(1000 * step + ctx.rank)
            x = torch.randn(32, 8, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True).sin())
            opt.zero_grad()
            loss.backward()
            opt.step()
            with open(os.path.join(out, f"loss-rank-{ctx.rank}.jsonl"), "a") as f:
                f.write(json.dumps({"inc": inc, "step": step, "loss": loss.item().hex()}) + "\n")
            if ckpt.maybe_save(step) and (step + 1) % a.memory_every == 0:
                save(shards(model, opt), os.path.join(out, f"inc{inc}-step-{step}-rank-{ctx.rank}.pt"))
            ctx.step(step, loss.item())
        ckpt.wait()
        save(shards(model, opt), os.path.join(out, f"final-rank-{ctx.rank}.pt"))


if __name__ == "__main__":
    main()
