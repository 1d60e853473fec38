"""The deterministic toy training the runtime test scripts share (gloo on CPU).

Used by ``tests/scripts/tiny_train.py``, ``tests/scripts/tiered_train.py`` and the training half
of ``tests/runtime/test_checkpoint_integrity.py``. The scripts run standalone under torchrun, with this
folder as ``sys.path[0]``; ``test_checkpoint_integrity.py`` adds it before importing.

Each step's batch is a pure function of (step, rank), so a run that is killed and resumed from a
checkpoint ends with exactly the parameters of an uninterrupted run of the same world size.
"""

from __future__ import annotations

import argparse
import copy
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def arg_parser(*, steps: int, every: int, sleep: float, keep: int = 2) -> argparse.ArgumentParser:
    """A parser with the options every toy script has: ``--steps`` (train steps 0..N-1),
    ``--every`` (persistent checkpoint every K steps), ``--keep`` (complete checkpoints kept),
    ``--sleep`` (seconds after each step), with the given defaults."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--every", type=int, default=every)
    p.add_argument("--keep", type=int, default=keep)
    p.add_argument("--sleep", type=float, default=sleep)
    return p


def mlp(hidden: int = 16, *, batchnorm: bool = False) -> torch.nn.Module:
    """8 -> ``hidden`` -> 1 regression MLP (tanh), optionally with a BatchNorm (buffers)."""
    norm = [torch.nn.BatchNorm1d(hidden)] if batchnorm else []
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), *norm, torch.nn.Tanh(), torch.nn.Linear(hidden, 1))


def setup(ctx, build: Callable[[], torch.nn.Module], **local: torch.Tensor):
    """Seed 0, build the DDP model, AdamW (lr 1e-2) and the per-rank state.

    Args:
        ctx: the runtime's ``JobContext`` (for the rank).
        build: makes the (non-DDP) module, called right after ``torch.manual_seed(0)``.
        local: extra per-rank tensors; ``samples_seen`` (int64 scalar) is added after them.

    Returns:
        ``(model, opt, local, state)``: ``state`` is the training state to checkpoint,
        ``{"model", "optim", "rank<R>": local}`` (a per-rank key for the per-rank state).
    """
    torch.manual_seed(0)
    model = DDP(build())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    local = {**local, "samples_seen": torch.zeros((), dtype=torch.int64)}
    return model, opt, local, {"model": model, "optim": opt, f"rank{ctx.rank}": local}


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The regression batch of (step, rank): x of shape (32, 8), y = sin(sum(x)) of shape (32, 1)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def train_step(opt, loss: torch.Tensor) -> torch.Tensor:
    """Backward ``loss`` and take one optimizer step; returns ``loss``."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def regression_step(ctx, step: int, model, opt, local: dict) -> torch.Tensor:
    """One MSE step on :func:`batch` (step, rank); counts the samples in ``local``. Returns the loss."""
    x, y = batch(step, ctx.rank)
    loss = train_step(opt, torch.nn.functional.mse_loss(model(x), y))
    local["samples_seen"] += x.shape[0]
    return loss


def model_state(model) -> dict:
    """A detached copy of the DDP model's inner module's state dict."""
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}


def export(ctx, model, opt, local: dict) -> dict:
    """A copy of this rank's whole training state, for ``torch.save`` dumps the tests compare."""
    return {"model": model_state(model), "optim": copy.deepcopy(opt.state_dict()),
            "local": {k: v.clone() for k, v in local.items()}, "rank": ctx.rank}
